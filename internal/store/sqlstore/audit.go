package sqlstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errcode"
)

const auditColumns = `seq, at, surface, caller_id, caller_name, tool, action, sandbox_id, args_sha256, summary, outcome, duration_ms, approval_id`

var _ audit.Store = (*Store)(nil)

// AppendAudit inserts records in one transaction (audit.Store).
func (s *Store) AppendAudit(ctx context.Context, records []audit.Record) error {
	if len(records) == 0 {
		return nil
	}
	err := s.inTx(ctx, func(tx *Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO audit_log (at, surface, caller_id, caller_name, tool, action, sandbox_id,
			args_sha256, summary, outcome, duration_ms, approval_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, r := range records {
			summary := string(r.Summary)
			if summary == "" {
				summary = "{}"
			}
			if _, err := stmt.ExecContext(ctx, millis(r.Time), r.Surface, r.CallerID, r.CallerName, r.Tool, r.Action, r.SandboxID,
				r.ArgsSHA256, summary, r.Outcome, r.DurationMS, r.ApprovalID); err != nil {
				return fmt.Errorf("insert audit record: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: append audit records: %w", s.name, err)
	}
	return nil
}

// ListAudit returns a page of records (audit.Store): seq > f.After ascending, or (After 0)
// the newest f.Limit ascending, with how many older matching ones that left out.
func (s *Store) ListAudit(ctx context.Context, f audit.Filter) ([]audit.Record, int64, error) {
	if f.Limit <= 0 || f.Limit > audit.MaxPage {
		return nil, 0, errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", audit.MaxPage, f.Limit).With("argument", "limit")
	}
	if f.After < 0 {
		return nil, 0, errcode.New(errcode.InvalidArgument, "after must be ≥ 0; got %d", f.After).With("argument", "after")
	}
	var where []string
	var args []any
	switch {
	case strings.Contains(f.Tool, " "): // a REST route's pattern ("POST /v1/sandboxes")
		where = append(where, `tool = ?`)
		args = append(args, f.Tool)
	case f.Tool != "": // an MCP tool: its records' action, on both surfaces
		where = append(where, `action = ?`)
		args = append(args, f.Tool)
	}
	if f.SandboxID != "" {
		where = append(where, `sandbox_id = ?`)
		args = append(args, f.SandboxID)
	}
	cond := func(extra string) string {
		w := where
		if extra != "" {
			w = append(append([]string(nil), where...), extra)
		}
		if len(w) == 0 {
			return ""
		}
		return " WHERE " + strings.Join(w, " AND ")
	}
	var q string
	qargs := append([]any(nil), args...)
	if f.After > 0 {
		q = `SELECT ` + auditColumns + ` FROM audit_log` + cond(`seq > ?`) + ` ORDER BY seq LIMIT ?`
		qargs = append(qargs, f.After, f.Limit)
	} else {
		q = `SELECT ` + auditColumns + ` FROM (SELECT ` + auditColumns + ` FROM audit_log` + cond("") + ` ORDER BY seq DESC LIMIT ?) AS newest ORDER BY seq`
		qargs = append(qargs, f.Limit)
	}
	rows, err := s.read.QueryContext(ctx, q, qargs...)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: list audit: %w", s.name, err)
	}
	defer rows.Close()
	var out []audit.Record
	for rows.Next() {
		var r audit.Record
		var at int64
		var summary string
		if err := rows.Scan(&r.Seq, &at, &r.Surface, &r.CallerID, &r.CallerName, &r.Tool, &r.Action, &r.SandboxID,
			&r.ArgsSHA256, &summary, &r.Outcome, &r.DurationMS, &r.ApprovalID); err != nil {
			return nil, 0, fmt.Errorf("%s: list audit: %w", s.name, err)
		}
		r.Time, r.Summary = fromMillis(at), []byte(summary)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("%s: list audit: %w", s.name, err)
	}
	if f.After > 0 || len(out) == 0 {
		return out, 0, nil
	}
	var omitted int64
	err = s.read.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_log`+cond(`seq < ?`), append(args, out[0].Seq)...).Scan(&omitted)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: list audit: %w", s.name, err)
	}
	return out, omitted, nil
}

// PruneAudit deletes the records older than before, then the oldest beyond the newest
// maxRows (audit.Store).
func (s *Store) PruneAudit(ctx context.Context, before time.Time, maxRows int) (int64, error) {
	if maxRows <= 0 {
		return 0, errcode.New(errcode.InvalidArgument, "maxRows must be positive; got %d", maxRows).With("argument", "max_rows")
	}
	var n int64
	err := s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM audit_log WHERE at < ?`, millis(before))
		if err != nil {
			return err
		}
		a, err := res.RowsAffected()
		if err != nil {
			return err
		}
		res, err = tx.ExecContext(ctx, `DELETE FROM audit_log WHERE seq <=
			(SELECT seq FROM audit_log ORDER BY seq DESC LIMIT 1 OFFSET ?)`, maxRows)
		if err != nil {
			return err
		}
		b, err := res.RowsAffected()
		n = a + b
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%s: prune audit: %w", s.name, err)
	}
	return n, nil
}
