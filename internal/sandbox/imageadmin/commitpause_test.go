package imageadmin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/imageadmin"
	"github.com/agentbox/agentbox/internal/testenv/imagefake"
)

// commitEnv is a running sandbox of an OCI image on the fake runtime with a file in its layer.
func commitEnv(t *testing.T) (*fakeEnv, *imagefake.Cache, sandbox.Sandbox) {
	t.Helper()
	e, c := newImageEnv(t)
	c.AddRemote("base:1", pyConfig)
	sb := e.create(t, sandbox.CreateRequest{Image: "base:1"})
	layer, err := e.rt.WritableLayer(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer.Dir, "installed"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	return e, c, sb
}

// onCommit runs f when the cache's Commit starts (before it reads the layer).
func onCommit(c *imagefake.Cache, f func() error) {
	c.SetFault(func(op, ref string) error {
		if op != "commit" {
			return nil
		}
		return f()
	})
}

// TestCommitPauses: the sandbox is paused while the cache reads its layer and resumed after;
// nothing dials its agent meanwhile; the event says paused: true.
func TestCommitPauses(t *testing.T) {
	e, c, sb := commitEnv(t)
	var pausedDuringRead atomic.Bool
	onCommit(c, func() error { pausedDuringRead.Store(e.rt.Paused(sb.ID)); return nil })
	img, err := e.imgs.Commit(t.Context(), sb.ID, "tmpl:v1")
	if err != nil {
		t.Fatal(err)
	}
	if !pausedDuringRead.Load() {
		t.Error("the sandbox was not paused while its layer was read")
	}
	if e.rt.Paused(sb.ID) || e.rt.Calls(fake.OpPause) != 1 || e.rt.Calls(fake.OpResume) != 1 {
		t.Errorf("after the commit: paused %v, pauses %d, resumes %d; want resumed once", e.rt.Paused(sb.ID), e.rt.Calls(fake.OpPause), e.rt.Calls(fake.OpResume))
	}
	if n := e.rt.PausedDials(); n != 0 {
		t.Errorf("the paused sandbox's agent was dialled %d times", n)
	}
	evs := e.eventsOf(t, sb.ID, "commit")
	if len(evs) != 1 || !strings.Contains(evs[0].Reason, "paused: true") || !strings.Contains(evs[0].Reason, img.Digest) {
		t.Fatalf("commit events %+v, want one saying paused: true", evs)
	}
	if st := e.state(t, sb.ID); st != sandbox.StateRunning {
		t.Fatalf("state after the commit: %s", st)
	}
	if res, err := e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"true"}}, nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec after the commit: %+v %v", res, err)
	}
}

// TestCommitResumesOnError: a cache error, and a caller that hangs up mid-read, still resume
// the sandbox (on a context that outlives the caller's: the fake refuses a cancelled one).
func TestCommitResumesOnError(t *testing.T) {
	t.Run("cache error", func(t *testing.T) {
		e, c, sb := commitEnv(t)
		boom := errcode.New(errcode.Internal, "boom")
		onCommit(c, func() error { return boom })
		if _, err := e.imgs.Commit(t.Context(), sb.ID, "tmpl:v1"); !errors.Is(err, boom) {
			t.Fatalf("commit: %v, want the cache's error", err)
		}
		if e.rt.Paused(sb.ID) || e.rt.Calls(fake.OpResume) != 1 {
			t.Fatalf("after a failed commit: paused %v, resumes %d", e.rt.Paused(sb.ID), e.rt.Calls(fake.OpResume))
		}
		if st := e.state(t, sb.ID); st != sandbox.StateRunning {
			t.Fatalf("state: %s", st)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		e, c, sb := commitEnv(t)
		ctx, cancel := context.WithCancel(t.Context())
		onCommit(c, func() error { cancel(); return ctx.Err() })
		if _, err := e.imgs.Commit(ctx, sb.ID, "tmpl:v1"); !errors.Is(err, context.Canceled) {
			t.Fatalf("commit: %v, want context.Canceled", err)
		}
		if e.rt.Paused(sb.ID) || e.rt.Calls(fake.OpResume) != 1 {
			t.Fatalf("after a cancelled commit: paused %v, resumes %d", e.rt.Paused(sb.ID), e.rt.Calls(fake.OpResume))
		}
		if len(c.Commits()) != 0 {
			t.Fatalf("commits %+v", c.Commits())
		}
	})
}

// TestCommitPauseBound: a read that outlasts the bound finds the sandbox already resumed, and
// the commit fails naming the bound; nothing is committed.
func TestCommitPauseBound(t *testing.T) {
	defer imageadmin.SetCommitPauseBound(100 * time.Millisecond)()
	e, c, sb := commitEnv(t)
	var resumedBeforeReadEnd atomic.Bool
	onCommit(c, func() error {
		time.Sleep(400 * time.Millisecond)
		resumedBeforeReadEnd.Store(!e.rt.Paused(sb.ID))
		return nil
	})
	_, err := e.imgs.Commit(t.Context(), sb.ID, "tmpl:v1")
	if errcode.Of(err) != errcode.UnsupportedOp || !strings.Contains(err.Error(), "100ms") {
		t.Fatalf("commit past the bound: %v, want UNSUPPORTED_OPERATION naming the bound", err)
	}
	if !resumedBeforeReadEnd.Load() {
		t.Error("the sandbox stayed paused past the bound")
	}
	if e.rt.Paused(sb.ID) || e.rt.Calls(fake.OpResume) != 1 || len(c.Commits()) != 0 {
		t.Fatalf("paused %v, resumes %d, commits %+v", e.rt.Paused(sb.ID), e.rt.Calls(fake.OpResume), c.Commits())
	}
}

// TestCommitPauseFailures: a failed Pause is the commit's error (nothing read); a failed Resume
// leaves the image made but marks the sandbox failed, as a runtime failure is marked.
func TestCommitPauseFailures(t *testing.T) {
	t.Run("pause", func(t *testing.T) {
		e, c, sb := commitEnv(t)
		e.rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
			if op == fake.OpPause {
				return errcode.New(errcode.RuntimeUnavailable, "cannot freeze")
			}
			return nil
		})
		if _, err := e.imgs.Commit(t.Context(), sb.ID, "tmpl:v1"); errcode.Of(err) != errcode.RuntimeUnavailable {
			t.Fatalf("commit: %v", err)
		}
		if len(c.Commits()) != 0 || e.rt.Paused(sb.ID) {
			t.Fatalf("commits %+v, paused %v", c.Commits(), e.rt.Paused(sb.ID))
		}
		if st := e.state(t, sb.ID); st != sandbox.StateRunning {
			t.Fatalf("state: %s", st)
		}
	})
	t.Run("resume", func(t *testing.T) {
		e, c, sb := commitEnv(t)
		e.rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
			if op == fake.OpResume {
				return errcode.New(errcode.RuntimeUnavailable, "cannot thaw")
			}
			return nil
		})
		if _, err := e.imgs.Commit(t.Context(), sb.ID, "tmpl:v1"); err != nil {
			t.Fatalf("commit (the layer was read while paused): %v", err)
		}
		if len(c.Commits()) != 1 {
			t.Fatalf("commits %+v", c.Commits())
		}
		if st := e.state(t, sb.ID); st != sandbox.StateFailed {
			t.Fatalf("state after a failed resume: %s, want failed", st)
		}
		evs := e.eventsOf(t, sb.ID, "state")
		if len(evs) == 0 || !strings.Contains(evs[len(evs)-1].Reason, "resume after commit failed") {
			t.Fatalf("state events %+v", evs)
		}
	})
}
