package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/faultpoint"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/text"
)

// MaxIdempotencyKey bounds an idempotency key's length.
const MaxIdempotencyKey = 256

// Create makes a sandbox and returns it running, with its agent answering. With an idempotency
// key its owner used before, it makes nothing and returns that sandbox (once its create has
// finished), or CONFLICT if the key came with a different request.
func (s *Service) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	return s.create(ctx, req, "")
}

// CreatePooled is the warm pools' entry (their refill): it makes a sandbox that pool holds
// (Creation.Pool; the pools' Prepare hook makes it nobody's until claimed), which never claims
// from a pool itself and does not count as a caller's create.
func (c *Core) CreatePooled(ctx context.Context, pool string, req CreateRequest) (Sandbox, error) {
	return c.s.create(ctx, req, pool)
}

// create is Create, or with pool set a refill of that warm pool (Core.CreatePooled). It runs
// in stages, the features taking part only through their hooks (hooks.go):
//
//  1. Request hooks fill or narrow the request (a snapshot gives the shape);
//  2. the core validates it (defaults, runtime) and drafts the record;
//  3. Prepare hooks add their parts to the draft or answer the create (in registration order:
//     the network's before the pools', whose claim reads the network prepared);
//  4. admission records the intent (nothing before it is recorded);
//  5. bring-up starts the sandbox, its agent answers, the Spec and Up hooks ready it;
//  6. the record says running, and what the Up hooks left to run when started runs.
func (s *Service) create(ctx context.Context, req CreateRequest, pool string) (_ Sandbox, err error) {
	if o := s.cfg.Observer; o != nil {
		began := time.Now()
		defer func() { o.ObserveCreate(req.Runtime, outcome(err), time.Since(began)) }()
	}
	ctx, span := s.tracer.Start(ctx, SpanCreate, trace.WithAttributes(attribute.String(AttrRuntime, req.Runtime)))
	defer func() { endSpan(span, err) }()
	c := &Creation{Req: &req, Pool: pool}
	defer c.end()
	sctx, end := s.traceStep(ctx, SpanCreateAdmission)
	rt, err := s.checkCreate(sctx, c)
	end(err)
	if err != nil || c.answered {
		if c.answered {
			span.SetAttributes(attribute.Bool(AttrPooled, true), attribute.String(AttrSandbox, c.answer.ID))
		}
		return c.result(err)
	}
	span.SetAttributes(sandboxAttrs(c.Sandbox)...)
	var pinned *pinnedImage
	if req.Image != image.Host && !rt.Capabilities().PullsImages() { // a runtime that pulls takes the reference as is
		// Before the record: a pull that fails (or a caller that hangs up during it) leaves
		// nothing. The lease keeps the image until the record names its digest.
		ref := req.Image
		if c.ImageDigest != "" {
			ref = digestRef(ref, c.ImageDigest) // a snapshot's image, not where its tag moved
		}
		ictx, end := s.traceStep(ctx, SpanCreateImage)
		pinned, err = s.resolveImage(ictx, ref)
		end(err)
		if err != nil {
			return Sandbox{}, err
		}
		defer pinned.release()
		c.Sandbox.ImageDigest = pinned.img.Digest
	}
	sb := *c.Sandbox
	// From here on nothing depends on the caller staying: a record, once written, is driven to
	// running or failed, and a caller that hangs up never leaves a half-made sandbox.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ReadyTimeout+30*time.Second)
	defer cancel()
	unlock := s.lock(sb.ID)
	actx, end := s.traceStep(wctx, SpanCreateRecord)
	prior, idmap, err := s.admit(actx, sb, rt)
	end(err)
	pinned.release() // the record (if any) pins the digest now
	if err != nil {
		unlock()
		return Sandbox{}, err
	}
	if prior.ID != "" {
		unlock()
		return s.sameCreate(ctx, prior, sb, req)
	}
	defer unlock()
	s.log.Info("sandbox creating", "sandbox_id", sb.ID, "runtime", sb.Runtime)
	faultpoint.Hit(faultpoint.CreateRecorded) // recorded creating; the runtime has made nothing
	handle, err := s.startCreated(wctx, c, idmap, pinned)
	if err != nil {
		s.log.Warn("sandbox create failed", "sandbox_id", sb.ID, "err", err)
		if derr := rt.Delete(wctx, sb.ID); derr != nil {
			s.log.Error("cleanup after failed create (the sweep retries)", "sandbox_id", sb.ID, "err", derr)
		} else {
			s.releaseIDRange(wctx, sb.ID)
		}
		if _, uerr := s.transition(wctx, sb, StateFailed, "create failed: "+errcode.Message(err), errcode.Message(err)); uerr != nil {
			s.log.Error("record failed create", "sandbox_id", sb.ID, "err", uerr)
		}
		if errcode.Of(err) == errcode.Internal {
			err = errcode.Wrap(errcode.RuntimeUnavailable, err, "sandbox %s could not be started by runtime %s; see the server log", sb.ID, sb.Runtime)
		}
		return Sandbox{}, err
	}
	sb.Handle = string(handle)
	faultpoint.Hit(faultpoint.CreateStarted) // the runtime runs it; its record says creating
	rctx, end := s.traceStep(wctx, SpanCreateRunning)
	out, err := s.recordRunning(rctx, rt, sb)
	if err == nil {
		s.watch(rt, sb.ID)
	}
	c.started(out, err == nil)
	end(err)
	return out, err
}

// checkCreate runs c through the create's first stages: the Request hooks, validation and
// the draft record, the Prepare hooks. It returns the runtime; c.answered says a hook answered.
func (s *Service) checkCreate(ctx context.Context, c *Creation) (runtime.Runtime, error) {
	if err := s.hooks.request(ctx, c); err != nil || c.answered {
		return nil, err
	}
	req := c.Req
	if req.Snapshot != "" && c.FromSnapshot == "" { // no feature took it (the snapshots feature is not wired)
		return nil, errcode.New(errcode.UnsupportedOp, "this server keeps no snapshots, so it cannot create from snapshot %s", text.Truncate(req.Snapshot, 64))
	}
	rt, err := s.validateCreate(req)
	if err != nil {
		return nil, err
	}
	if len(req.IdempotencyKey) > MaxIdempotencyKey || strings.ContainsFunc(req.IdempotencyKey, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return nil, errcode.New(errcode.InvalidArgument, "idempotency_key must be at most %d characters without control characters", MaxIdempotencyKey)
	}
	now := s.stamp() // the store keeps milliseconds
	c.Runtime = rt
	c.Sandbox = &Sandbox{
		ID: NewID(), State: StateCreating, Image: req.Image, Runtime: req.Runtime,
		Isolation: string(rt.Capabilities().Isolation), CPU: req.CPU, MemoryMB: req.MemoryMB,
		DiskMB: req.DiskMB, PidsLimit: s.cfg.PidsLimit, Env: req.Env, Labels: req.Labels,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Duration(req.TTLSeconds) * time.Second),
		Owner: OwnerFrom(ctx), Principal: PrincipalFrom(ctx), IdempotencyKey: req.IdempotencyKey, Node: s.local.name, Version: 1,
		AutoWake: req.AutoWake, TTLWhileSleeping: req.TTLWhileSleeping, FromSnapshot: c.FromSnapshot,
		OnExpiry: req.OnExpiry, TTLSeconds: req.TTLSeconds,
	}
	if err := s.hooks.prepare(ctx, c); err != nil || c.answered {
		return nil, err
	}
	if (req.Network != nil && req.Network.Policy != nil || len(req.Secrets) > 0) && c.Sandbox.Network.Policy == nil {
		// No feature took the network on (the egress feature is not registered).
		return nil, errcode.New(errcode.UnsupportedOp, "network: this server has no egress proxy, so sandboxes can only have network \"none\"")
	}
	return rt, nil
}

// startCreated brings c's sandbox up and runs the Up hooks once its agent answers; a failed
// hook lets the agent's connection go.
func (s *Service) startCreated(ctx context.Context, c *Creation, idmap runtime.IDMap, img *pinnedImage) (runtime.Handle, error) {
	handle, gc, err := s.bringUp(ctx, c.Runtime, *c.Sandbox, idmap, img, c.Source)
	if err != nil {
		return "", err
	}
	uctx, end := s.traceStep(ctx, SpanCreateUp)
	err = s.hooks.up(uctx, c, gc)
	end(err)
	if err != nil {
		s.dropGuest(c.Sandbox.ID)
		return "", err
	}
	return handle, nil
}

// sameCreate answers a create whose idempotency key its owner already used: the sandbox that
// key made, once its create is over, if the request is the same.
func (s *Service) sameCreate(ctx context.Context, prior, asked Sandbox, req CreateRequest) (Sandbox, error) {
	same := prior.Image == asked.Image && prior.Runtime == asked.Runtime && prior.CPU == asked.CPU &&
		prior.MemoryMB == asked.MemoryMB && prior.DiskMB == asked.DiskMB &&
		maps.Equal(prior.Env, asked.Env) && maps.Equal(prior.Labels, asked.Labels) && sameNetwork(prior, req)
	if !same {
		return Sandbox{}, errcode.New(errcode.Conflict, "idempotency_key %q was used for a different create (sandbox %s); use a new key for a different request", text.Truncate(asked.IdempotencyKey, 64), prior.ID).
			With("sandbox_id", prior.ID)
	}
	unlock := s.lock(prior.ID) // wait for a create still in flight
	unlock()
	sb, err := s.store.GetSandbox(ctx, prior.ID)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.State == StateFailed {
		return Sandbox{}, errcode.New(errcode.RuntimeUnavailable, "sandbox %s, made by this idempotency key, failed: %s; use a new key to try again", sb.ID, sb.Error).With("sandbox_id", sb.ID).With("reason", "key_used_by_failed_create")
	}
	return sb, nil
}

// admit records the intent to create sb if the host has the headroom and the store's
// admission (live bound, budgets) lets it in; for a runtime with user namespaces it then
// allocates the sandbox's range of host ids, which it returns. When sb's idempotency key was
// used before, it writes nothing and returns that sandbox as prior.
func (s *Service) admit(ctx context.Context, sb Sandbox, rt runtime.Runtime) (prior Sandbox, _ runtime.IDMap, _ error) {
	if err := s.local.checkHeadroom(ctx); err != nil {
		return Sandbox{}, runtime.IDMap{}, err
	}
	if rt.Capabilities().TakesIDRange() && sb.IdempotencyKey == "" {
		// Refuse before writing anything when the pool is spent (allocateIDRange decides).
		if _, err := s.freeIDBase(ctx); err != nil {
			return Sandbox{}, runtime.IDMap{}, err
		}
	}
	ev := Event{SandboxID: sb.ID, Type: "state", To: StateCreating, Reason: "create requested", At: sb.CreatedAt}
	got, created, err := s.store.AdmitSandbox(ctx, sb, ev, s.local.admission)
	var over *OverCapacityError
	if errors.As(err, &over) {
		return Sandbox{}, runtime.IDMap{}, overCapacity(over)
	}
	if err != nil {
		return Sandbox{}, runtime.IDMap{}, fmt.Errorf("record sandbox %s: %w", sb.ID, err)
	}
	if !created {
		return got, runtime.IDMap{}, nil
	}
	s.bus.publish()
	if !rt.Capabilities().TakesIDRange() {
		return Sandbox{}, runtime.IDMap{}, nil
	}
	base, err := s.allocateIDRange(ctx, sb)
	if err != nil {
		if _, uerr := s.transition(ctx, sb, StateFailed, "create failed: "+errcode.Message(err), errcode.Message(err)); uerr != nil {
			s.log.Error("record failed create", "sandbox_id", sb.ID, "err", uerr)
		}
		return Sandbox{}, runtime.IDMap{}, err
	}
	return Sandbox{}, runtime.IDMap{UIDBase: uint32(base), GIDBase: uint32(base), Count: IDRangeSize}, nil
}

// allocateIDRange records the lowest free range of the pool as sb's (the record first: a range
// never exists without the live record that keeps the sweep off it). Another server process on
// the same database may take the same range meanwhile; the store refuses the second, and this
// tries the next free one.
func (s *Service) allocateIDRange(ctx context.Context, sb Sandbox) (int64, error) {
	s.idMu.Lock()
	defer s.idMu.Unlock()
	var err error
	for range 3 {
		var base int64
		if base, err = s.freeIDBase(ctx); err != nil {
			return 0, err
		}
		r := IDRange{SandboxID: sb.ID, Base: base, Count: IDRangeSize, AllocatedAt: sb.CreatedAt}
		if err = s.store.AllocateIDRange(ctx, r); err == nil {
			return base, nil
		}
		err = fmt.Errorf("allocate host ids [%d, %d) for sandbox %s: %w", r.Base, r.End(), sb.ID, err)
		if errcode.Of(err) != errcode.Conflict {
			return 0, err
		}
	}
	return 0, err
}

// bringUp starts sb (from snap, a snapshot to create it from, if not nil) and waits for its
// agent, whose connection it keeps and returns. The Spec hooks add the features' parts to the
// runtime's spec (an egress sandbox's network).
func (s *Service) bringUp(ctx context.Context, rt runtime.Runtime, sb Sandbox, idmap runtime.IDMap, img *pinnedImage, snap *runtime.SnapshotSource) (runtime.Handle, *guest.Client, error) {
	spec := runtime.Spec{ID: sb.ID, Image: sb.Image, CPU: sb.CPU, MemoryMB: sb.MemoryMB,
		DiskMB: sb.DiskMB, PidsLimit: sb.PidsLimit, Env: sb.Env, IDMap: idmap, Snapshot: snap}
	var imgEnv map[string]string
	if img != nil {
		spec.Rootfs, imgEnv = img.rootfs, img.env
	}
	spec.Env = specEnv(imgEnv, nil, sb.Env)
	s.hooks.spec(sb, &spec)
	rtctx, end := s.traceStep(ctx, SpanCreateRuntime)
	handle, err := runtime.CreateAndStart(rtctx, rt, spec)
	end(err)
	if err != nil {
		return "", nil, err
	}
	actx, end := s.traceStep(ctx, SpanCreateAgent)
	gc, err := s.waitAgent(actx, rt, sb.ID)
	end(err)
	if err != nil {
		return "", nil, err
	}
	s.guestsMu.Lock()
	s.guests[sb.ID] = gc
	s.guestsMu.Unlock()
	return handle, gc, nil
}

// waitAgent dials the agent of sandbox id and waits until it answers (ReadyTimeout).
func (s *Service) waitAgent(ctx context.Context, rt runtime.Runtime, id string) (*guest.Client, error) {
	dial, err := rt.Agent(ctx, id)
	if err != nil {
		return nil, err
	}
	gc := guest.NewClient(guest.Dialer(dial))
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
	err = gc.WaitReady(rctx)
	cancel()
	if err != nil {
		gc.Close()
		if pe := (*guest.PermanentError)(nil); errors.As(err, &pe) {
			// The runtime knows it will not start (a kubelet that cannot pull the image): its
			// reason is the caller's to act on.
			if _, typed := errcode.As(pe.Err); typed {
				return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "%s", errcode.Message(pe.Err))
			}
			return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "sandbox %s cannot start (the server's log says why)", id)
		}
		return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "sandbox %s: its agent did not answer within %s", id, s.cfg.ReadyTimeout)
	}
	return gc, nil
}
