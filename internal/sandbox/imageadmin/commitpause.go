package imageadmin

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
)

// commitPauseBound is CommitPauseBound, shortened by tests (SetCommitPauseBound).
var commitPauseBound atomic.Int64

func init() { commitPauseBound.Store(int64(CommitPauseBound)) }

// commitPause is one commit's pause of its sandbox: Pause before the layer is read, Resume once
// it is read (image.WithLayerRead), when the commit returns, or when CommitPauseBound passes,
// whichever is first, and only once.
type commitPause struct {
	s      *Service
	rt     runtime.Pauser // nil: the runtime cannot pause; the layer is read live
	sb     sandbox.Sandbox
	parent context.Context
	// ctx is the commit's: it carries the layer-read hook and is cancelled when the bound passes.
	ctx    context.Context
	cancel context.CancelFunc
	paused bool
	why    string // why the layer is read live

	mu      sync.Mutex
	done    bool // resumed (or never paused)
	fired   bool // the bound passed before the layer was read
	timer   *time.Timer
	began   time.Time
	elapsed time.Duration
}

// pauseForCommit pauses sb for a commit. A runtime that is not a runtime.Pauser gets no pause
// (the returned pause says why); a failed Pause is the commit's error, after a Resume in case
// the runtime froze part of the sandbox.
func (s *Service) pauseForCommit(ctx context.Context, rt runtime.Runtime, sb sandbox.Sandbox) (*commitPause, error) {
	p := &commitPause{s: s, sb: sb, parent: ctx, done: true}
	p.ctx, p.cancel = context.WithCancel(ctx)
	pr, ok := rt.(runtime.Pauser)
	if !ok {
		p.why = fmt.Sprintf("runtime %s cannot pause a sandbox", sb.Runtime)
		s.log.Warn("commit reads a running sandbox's layer", "sandbox_id", sb.ID, "reason", p.why)
		return p, nil
	}
	// The Pause runs to its end even if the caller hangs up: a runtime killed mid-pause could
	// leave the sandbox partly frozen.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resumeTimeout)
	defer cancel()
	p.began = time.Now()
	if err := pr.Pause(pctx, sb.ID); err != nil {
		p.cancel()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), resumeTimeout)
		defer rcancel()
		if rerr := pr.Resume(rctx, sb.ID); rerr != nil {
			s.log.Warn("resume after a failed pause", "sandbox_id", sb.ID, "err", rerr)
		}
		return nil, err
	}
	p.rt, p.paused, p.done = pr, true, false
	p.ctx = image.WithLayerRead(p.ctx, p.layerRead)
	p.mu.Lock()
	p.timer = time.AfterFunc(time.Duration(commitPauseBound.Load()), p.overrun)
	p.mu.Unlock()
	return p, nil
}

// layerRead is the commit's hook once the layer is read: resume, unless the bound passed first
// (then the read may have seen the sandbox running, and the commit fails).
func (p *commitPause) layerRead() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fired {
		return errcode.New(errcode.UnsupportedOp, "the layer was read past the commit's pause bound (%s)", time.Duration(commitPauseBound.Load()))
	}
	p.resumeLocked()
	return nil
}

// overrun is the bound's timer: cancel the read and resume.
func (p *commitPause) overrun() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.fired = true
	p.cancel()
	p.s.log.Warn("commit paused a sandbox past its bound; resuming it", "sandbox_id", p.sb.ID, "bound", time.Duration(commitPauseBound.Load()))
	p.resumeLocked()
}

// resume resumes the sandbox if nothing did yet, and releases the commit's context.
func (p *commitPause) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resumeLocked()
	p.cancel()
}

// resumeLocked resumes once, on a context of its own that outlives a cancelled caller. A failed
// Resume leaves the sandbox frozen: it is logged and the sandbox marked failed.
func (p *commitPause) resumeLocked() {
	if p.done {
		return
	}
	p.done = true
	p.timer.Stop()
	p.elapsed = time.Since(p.began)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.parent), resumeTimeout)
	defer cancel()
	err := p.rt.Resume(ctx, p.sb.ID)
	if err == nil {
		return
	}
	p.s.log.Error("resume after commit failed; the sandbox stays frozen", "sandbox_id", p.sb.ID, "err", err)
	cur, gerr := p.s.store.GetSandbox(ctx, p.sb.ID)
	if gerr != nil || cur.State != sandbox.StateRunning {
		return
	}
	if _, terr := p.s.core.Transition(ctx, cur, sandbox.StateFailed, "resume after commit failed: "+text.Truncate(errcode.Message(err), 512),
		"the sandbox could not be resumed after a commit (its processes stay frozen); destroy it"); terr != nil {
		p.s.log.Warn("mark failed", "sandbox_id", p.sb.ID, "err", terr)
	}
	p.s.core.Release(p.sb.ID)
}

// overran reports whether the bound passed before the layer was read.
func (p *commitPause) overran() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fired
}

// duration is how long the sandbox stayed paused.
func (p *commitPause) duration() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.elapsed
}
