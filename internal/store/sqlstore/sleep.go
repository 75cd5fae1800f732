package sqlstore

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// AdmitWake records that sleeping sandbox sb wakes (sandbox.WakeAdmitter): if sb's cpu and
// memory_mb, added to what the other live sandboxes of sb.Node hold, fit a's CPU and MemoryMB,
// it writes sb's state, updated_at and version (the stored version must be sb.Version-1, else
// CONFLICT) and appends ev, in one write transaction (under the write lock) with the count, so that no create or
// other wake overshoots the budgets meanwhile; otherwise it writes nothing and returns an
// *sandbox.OverCapacityError. The live bound and the disk budget are not checked: a sleeping
// sandbox already counts against them.
func (s *Store) AdmitWake(ctx context.Context, sb sandbox.Sandbox, ev sandbox.Event, a sandbox.Admission) error {
	if err := validate(sb, ev); err != nil {
		return s.opErr("admit wake", sb.ID, err)
	}
	err := s.inTx(ctx, func(tx *Tx) error {
		live := liveStates()
		var u sandbox.Usage
		err := tx.QueryRowContext(ctx, `SELECT `+usageColumns+`
			FROM sandboxes WHERE node = ? AND id <> ? AND state IN (`+placeholders(len(live))+`)`, append([]any{sb.Node, sb.ID}, live...)...).
			Scan(&u.Live, &u.CPU, &u.MemoryMB, &u.DiskMB, &u.Sleeping)
		if err != nil {
			return fmt.Errorf("count live sandboxes of node %q: %w", sb.Node, err)
		}
		if over := (sandbox.Admission{CPU: a.CPU, MemoryMB: a.MemoryMB}).Check(u, sb); over != nil {
			return over
		}
		res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, updated_at = ?, version = ? WHERE id = ? AND version = ?`,
			string(sb.State), millis(sb.UpdatedAt), sb.Version, sb.ID, sb.Version-1)
		if err != nil {
			return fmt.Errorf("update: %w", err)
		}
		if err := versioned(ctx, tx, res, "sandbox "+sb.ID, sb.Version-1, func() error { return notFound(sb.ID) },
			`SELECT version FROM sandboxes WHERE id = ?`, sb.ID); err != nil {
			return err
		}
		return appendEvent(ctx, tx, sb.ID, ev)
	})
	if err != nil {
		return s.opErr("admit wake", sb.ID, err)
	}
	return nil
}
