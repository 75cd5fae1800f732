package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/faultpoint"
	"github.com/agentbox/agentbox/internal/runtime"
)

// How a create's last record write (creating → running) is retried before the create gives up
// on it and tears the sandbox down.
const (
	runningWriteTries = 5
	runningWriteFirst = 100 * time.Millisecond
	runningWriteMax   = time.Second
)

// recordRunning writes made sandbox sb's record running, retrying a refused write a few times
// (a store that comes back within a few seconds loses nothing). If the write still fails, the
// sandbox is torn down — the runtime deletes it, its id range is freed — and its record is
// marked failed with the reason (retried likewise), so a create whose last write fails converges
// at once instead of staying creating until its deadline; the error returned is the write's.
func (s *Service) recordRunning(ctx context.Context, rt runtime.Runtime, sb Sandbox) (Sandbox, error) {
	out, err := s.retryWrite(ctx, func() (Sandbox, error) {
		if ferr := faultpoint.Fail(faultpoint.CreateRunningWrite); ferr != nil {
			return sb, ferr
		}
		return s.transition(ctx, sb, StateRunning, "agent ready", "")
	})
	if err == nil {
		return out, nil
	}
	s.log.Error("the record of a made sandbox could not be written running; tearing it down", "sandbox_id", sb.ID, "err", err)
	s.dropGuest(sb.ID)
	if derr := rt.Delete(ctx, sb.ID); derr != nil {
		s.log.Error("tear down a create whose record could not be written (the sweep retries)", "sandbox_id", sb.ID, "err", derr)
	} else {
		s.releaseIDRange(ctx, sb.ID)
	}
	msg := "create failed: its record could not be written running: " + errcode.Message(err)
	if _, uerr := s.retryWrite(ctx, func() (Sandbox, error) { return s.transition(ctx, sb, StateFailed, msg, msg) }); uerr != nil {
		s.log.Error("record failed create (the control loop settles it at its deadline)", "sandbox_id", sb.ID, "err", uerr)
	}
	if _, typed := errcode.As(err); !typed {
		err = errcode.Wrap(errcode.Unavailable, err, "sandbox %s was made but its record could not be written, so it was torn down; retry the create (with the same idempotency key)", sb.ID).
			With("retry_after_seconds", errcode.RetryAfterSeconds)
	}
	return sb, fmt.Errorf("create %s: %w", sb.ID, err)
}

// retryWrite runs write up to runningWriteTries times with backoff while it fails with anything
// but CONFLICT (the record changed meanwhile: a retry cannot help).
func (s *Service) retryWrite(ctx context.Context, write func() (Sandbox, error)) (Sandbox, error) {
	wait := runningWriteFirst
	for try := 1; ; try++ {
		out, err := write()
		if err == nil || try == runningWriteTries || errcode.Of(err) == errcode.Conflict {
			return out, err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return out, err
		}
		wait = min(2*wait, runningWriteMax)
	}
}
