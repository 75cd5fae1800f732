package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/errcode"
)

var _ approval.Store = (*Store)(nil)

const approvalColumns = `id, state, tool, action, surface, sandbox_id, digest, summary, caller_id, caller_name,
	created_at, expires_at, decided_at, decider, reason, used_at, outcome, bound, principal`

func approvalNotFound(id string) error {
	return errcode.New(errcode.ApprovalNotFound, "approval %s not found; `agentbox approvals ls` (GET /v1/approvals) lists those kept", id).With("approval_id", id)
}

func nullMillis(t *time.Time) sql.NullInt64 {
	if t == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: millis(*t), Valid: true}
}

func timePtr(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromMillis(n.Int64)
	return &t
}

func scanApproval(r rowScanner) (approval.Approval, error) {
	var a approval.Approval
	var state, summary string
	var created, expires int64
	var decided, used sql.NullInt64
	var bound int
	if err := r.Scan(&a.ID, &state, &a.Tool, &a.Action, &a.Surface, &a.SandboxID, &a.Digest, &summary, &a.CallerID, &a.CallerName,
		&created, &expires, &decided, &a.Decider, &a.Reason, &used, &a.Outcome, &bound, &a.Principal); err != nil {
		return a, err
	}
	a.State, a.Summary = approval.State(state), []byte(summary)
	a.CreatedAt, a.ExpiresAt = fromMillis(created), fromMillis(expires)
	a.DecidedAt, a.UsedAt, a.Bound = timePtr(decided), timePtr(used), bound != 0
	return a, nil
}

// CreateApproval implements approval.Store.
func (s *Store) CreateApproval(ctx context.Context, a approval.Approval) error {
	summary := string(a.Summary)
	if summary == "" {
		summary = "{}"
	}
	principal := a.Principal
	if principal == "" {
		principal = "admin" // gate.AdminPrincipal: the column's default
	}
	bound := 0
	if a.Bound {
		bound = 1
	}
	_, err := s.write.ExecContext(ctx, `INSERT INTO approvals (`+approvalColumns+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		a.ID, string(a.State), a.Tool, a.Action, a.Surface, a.SandboxID, a.Digest, summary, a.CallerID, a.CallerName,
		millis(a.CreatedAt), millis(a.ExpiresAt), nullMillis(a.DecidedAt), a.Decider, a.Reason, nullMillis(a.UsedAt), a.Outcome, bound, principal)
	if isUniqueViolation(err) || isPrimaryKeyViolation(err) {
		return errcode.New(errcode.Conflict, "approval %s already exists", a.ID)
	}
	if err != nil {
		return fmt.Errorf("create approval %s: %w", a.ID, err)
	}
	return nil
}

// GetApproval implements approval.Store.
func (s *Store) GetApproval(ctx context.Context, id string) (approval.Approval, error) {
	a, err := scanApproval(s.read.QueryRowContext(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return a, approvalNotFound(id)
	}
	if err != nil {
		return a, fmt.Errorf("get approval %s: %w", id, err)
	}
	return a, nil
}

// ListApprovals implements approval.Store.
func (s *Store) ListApprovals(ctx context.Context, f approval.Filter) ([]approval.Approval, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = approval.DefaultListLimit
	}
	limit = min(limit, approval.MaxListLimit)
	q, args := `SELECT `+approvalColumns+` FROM approvals`, []any{}
	var where []string
	if f.State != "" {
		where, args = append(where, `state = ?`), append(args, string(f.State))
	}
	if f.Principal != "" {
		where, args = append(where, `principal = ?`), append(args, f.Principal)
	}
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	q += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, limit)
	rows, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list approvals: %w", err)
	}
	defer rows.Close()
	out := []approval.Approval{}
	for rows.Next() {
		a, err := scanApproval(rows)
		if err != nil {
			return nil, fmt.Errorf("list approvals: %w", err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// FindApproval implements approval.Store.
func (s *Store) FindApproval(ctx context.Context, callerID, digest string, since time.Time) (approval.Approval, bool, error) {
	a, err := scanApproval(s.write.QueryRowContext(ctx, `SELECT `+approvalColumns+` FROM approvals
		WHERE caller_id = ? AND digest = ? AND created_at >= ? AND bound = 0 AND state IN ('pending', 'approved', 'used')
		ORDER BY created_at DESC, id DESC LIMIT 1`, callerID, digest, millis(since)))
	if errors.Is(err, sql.ErrNoRows) {
		return a, false, nil
	}
	if err != nil {
		return a, false, fmt.Errorf("find approval: %w", err)
	}
	return a, true, nil
}

// DecideApproval implements approval.Store.
func (s *Store) DecideApproval(ctx context.Context, id string, to approval.State, decider, reason string, at time.Time) (approval.Approval, error) {
	if to != approval.Approved && to != approval.Denied {
		return approval.Approval{}, errcode.New(errcode.InvalidArgument, "a decision is approved or denied, not %q", to)
	}
	var out approval.Approval
	var notPending approval.State
	err := s.inTx(ctx, func(tx *Tx) error {
		a, err := scanApproval(tx.QueryRowContext(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return approvalNotFound(id)
		}
		if err != nil {
			return fmt.Errorf("decide approval %s: %w", id, err)
		}
		if a.State == approval.Pending && !at.Before(a.ExpiresAt) {
			if _, err := tx.ExecContext(ctx, `UPDATE approvals SET state = 'expired' WHERE id = ?`, id); err != nil {
				return fmt.Errorf("expire approval %s: %w", id, err)
			}
			a.State = approval.Expired
		}
		if a.State != approval.Pending {
			notPending = a.State // committed (an expiry), then refused
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE approvals SET state = ?, decided_at = ?, decider = ?, reason = ? WHERE id = ?`,
			string(to), millis(at), decider, reason, id); err != nil {
			return fmt.Errorf("decide approval %s: %w", id, err)
		}
		a.State, a.Decider, a.Reason = to, decider, reason
		d := fromMillis(millis(at))
		a.DecidedAt = &d
		out = a
		return nil
	})
	if err == nil && notPending != "" {
		return approval.Approval{}, errcode.New(errcode.Conflict, "approval %s is %s, not pending; only a pending approval can be decided", id, notPending).
			With("approval_id", id).With("state", string(notPending))
	}
	return out, err
}

// ClaimApproval implements approval.Store.
func (s *Store) ClaimApproval(ctx context.Context, id string, at time.Time) (bool, error) {
	res, err := s.write.ExecContext(ctx, `UPDATE approvals SET state = 'used', used_at = ? WHERE id = ? AND state = 'approved'`, millis(at), id)
	if err != nil {
		return false, fmt.Errorf("claim approval %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// SetApprovalOutcome implements approval.Store.
func (s *Store) SetApprovalOutcome(ctx context.Context, id, outcome string) error {
	res, err := s.write.ExecContext(ctx, `UPDATE approvals SET outcome = ? WHERE id = ?`, outcome, id)
	if err != nil {
		return fmt.Errorf("set approval %s outcome: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return approvalNotFound(id)
	}
	return nil
}

// ExpireApprovals implements approval.Store.
func (s *Store) ExpireApprovals(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.write.ExecContext(ctx, `UPDATE approvals SET state = 'expired' WHERE state = 'pending' AND expires_at <= ?`, millis(now))
	if err != nil {
		return 0, fmt.Errorf("expire approvals: %w", err)
	}
	return res.RowsAffected()
}

// CountPendingApprovals implements approval.Store.
func (s *Store) CountPendingApprovals(ctx context.Context) (int, error) {
	var n int
	if err := s.write.QueryRowContext(ctx, `SELECT COUNT(*) FROM approvals WHERE state = 'pending'`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count approvals: %w", err)
	}
	return n, nil
}

// PruneApprovals implements approval.Store.
func (s *Store) PruneApprovals(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.write.ExecContext(ctx, `DELETE FROM approvals WHERE created_at < ? AND state NOT IN ('pending', 'approved')`, millis(before))
	if err != nil {
		return 0, fmt.Errorf("prune approvals: %w", err)
	}
	return res.RowsAffected()
}
