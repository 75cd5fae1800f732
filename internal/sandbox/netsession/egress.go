package netsession

// The host side of every running egress sandbox's network: one session per sandbox with its
// agent (guest.Client.NetSession; the host dials it, nothing in the sandbox can dial the host),
// whose streams — the sandbox's connections to its proxy, DNS and transparent listeners — are
// each handed to the egress proxy with the sandbox's Target. The session opens in create
// before the sandbox is reported running (the Up hook), at wake before the wake returns
// (Woken), and at Reconcile for the sandboxes a restarted server adopts (Adopted); while the
// sandbox runs, a broken session is reopened with backoff.

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
)

// Bounds of a sandbox's network session.
const (
	netBackoffMin = 100 * time.Millisecond
	netBackoffMax = 5 * time.Second
	// maxNetStreams bounds the streams of one sandbox served at once; past it the session's
	// Accept waits (the agent holds new local connections meanwhile).
	maxNetStreams = 1024
	// deniedEventsPerSecond bounds a sandbox's "egress_denied" events; the rest are only in
	// its connection records.
	deniedEventsPerSecond = 5
)

// netState is the service's part for networks: the proxy and each egress sandbox's session.
type netState struct {
	proxy sandbox.EgressProxy
	rec   *recordQueue // nil without a proxy

	mu sync.Mutex
	m  map[string]*netSandbox
}

// netSandbox is one running egress sandbox's network on the host.
type netSandbox struct {
	id     string
	policy atomic.Pointer[egress.Compiled]
	target atomic.Pointer[egress.Target] // replaced when a pooled sandbox is claimed (internal/sandbox/pools)
	req    guest.NetSessionRequest
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan struct{} // maxNetStreams

	mu      sync.Mutex
	up      bool
	reply   guest.NetSessionReply
	changed chan struct{} // closed and replaced when up changes

	evMu     sync.Mutex
	evWindow time.Time
	evCount  int
}

func (n *netSandbox) setUp(up bool, reply guest.NetSessionReply) {
	n.mu.Lock()
	n.up, n.reply = up, reply
	close(n.changed)
	n.changed = make(chan struct{})
	n.mu.Unlock()
}

// allowEvent reports whether another "egress_denied" event fits this second's budget.
func (n *netSandbox) allowEvent(now time.Time) bool {
	n.evMu.Lock()
	defer n.evMu.Unlock()
	if now.Sub(n.evWindow) >= time.Second || now.Before(n.evWindow) {
		n.evWindow, n.evCount = now, 0
	}
	if n.evCount >= deniedEventsPerSecond {
		return false
	}
	n.evCount++
	return true
}

func (s *Service) netOf(id string) *netSandbox {
	s.net.mu.Lock()
	defer s.net.mu.Unlock()
	return s.net.m[id]
}

// netRequest is the session request for a sandbox of runtime rt.
func (s *Service) netRequest(rt runtime.Runtime) guest.NetSessionRequest {
	req := guest.NetSessionRequest{ProxyPort: proxyPort(s.core.Config().Egress), DNSPort: dnsPort(s.core.Config().Egress)}
	// Process isolation (runc, crun): the agent's sockets are host kernel sockets, so it hands
	// each one over (SCM_RIGHTS) and the proxy serves it with no relay in between; gVisor's
	// sockets live in its own kernel, so its agent relays the bytes.
	req.PassFDs = rt.Capabilities().Isolation == runtime.IsolationProcess
	// And its listeners: the host accepts the sandbox's connections itself, so a new
	// connection wakes the host once, not the agent and then the host.
	req.PassListeners = req.PassFDs
	if slices.Contains(rt.Capabilities().Hardening, runtime.HardeningTransparentEgress) {
		req.TransparentPorts = s.core.Config().Egress.TransparentPorts
		if req.TransparentPorts == nil {
			req.TransparentPorts = []int{80, 443}
		}
	}
	return req
}

// openNet opens sb's first session, in create, once its agent answers.
func (s *Service) openNet(ctx context.Context, rt runtime.Runtime, sb sandbox.Sandbox, gc *guest.Client) (*guest.NetSession, error) {
	sess, err := gc.NetSession(ctx, s.netRequest(rt))
	if err != nil {
		return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "sandbox %s: its network session did not open: %s", sb.ID, errcode.Message(err))
	}
	return sess, nil
}

// prepare is the network's Prepare hook: it validates the create's network and secrets
// against the runtime and sets them on the draft record.
func (s *Service) prepare(_ context.Context, c *sandbox.Creation) error {
	plan, err := s.validateNetwork(c.Req, c.Runtime)
	if err != nil || plan == nil {
		return err
	}
	p := sandbox.NormalPolicy(plan.policy.Policy())
	c.Sandbox.Network, c.Sandbox.Secrets = sandbox.Network{Policy: &p}, plan.secrets
	return nil
}

// spec is the network's Spec hook: an egress sandbox starts with the egress network, the
// CA bundle and the proxy's environment (validateNetwork refused any name its env also sets).
func (s *Service) spec(sb sandbox.Sandbox, spec *runtime.Spec) {
	if sb.Network.Policy == nil {
		return
	}
	spec.Network, spec.CABundle = runtime.NetworkEgress, s.core.Config().Egress.CABundle
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, egressEnv(s.core.Config().Egress, sb.Secrets))
	spec.Env = env
}

// up is the network's Up hook: an egress sandbox's first session opens before the create
// reports it running, and is served once it runs.
func (s *Service) up(ctx context.Context, c *sandbox.Creation, gc *guest.Client) error {
	if c.Sandbox.Network.Policy == nil {
		return nil
	}
	sess, err := s.openNet(ctx, c.Runtime, *c.Sandbox, gc)
	if err != nil {
		return err
	}
	rt := c.Runtime
	c.OnStarted(func(sb sandbox.Sandbox, ok bool) {
		if !ok {
			sess.Close()
			return
		}
		s.startNet(sb, rt, sess)
	})
	return nil
}

// claimed is the network's Claimed hook: a claimed egress sandbox's session takes the
// claimant's policy and secrets (its record has them already) before the claimant has its id.
func (s *Service) claimed(_ context.Context, sb sandbox.Sandbox) {
	if sb.Network.Policy == nil {
		return
	}
	compiled, err := egress.ParsePolicy(*sb.Network.Policy)
	if err != nil {
		s.core.Log().Error("claimed sandbox's network policy is refused; its egress stays closed", "sandbox_id", sb.ID, "err", err)
		return
	}
	s.setNetPolicy(sb.ID, compiled)
	s.setNetSecrets(sb.ID, sb.Secrets)
}

// woken is the network's Woken hook: a woken egress sandbox's session opens before the wake
// returns (else it is reopened in the background, with backoff).
func (s *Service) woken(ctx context.Context, sb sandbox.Sandbox) {
	if s.net.proxy == nil || sb.Network.Policy == nil {
		return
	}
	rt, err := s.core.RuntimeOf(sb)
	if err != nil {
		return
	}
	gc := s.core.Guest(sb.ID)
	var sess *guest.NetSession
	if gc != nil {
		if sess, err = s.openNet(ctx, rt, sb, gc); err != nil {
			s.core.Log().Warn("woken sandbox's network session did not open; retrying in the background", "sandbox_id", sb.ID, "err", err)
			sess = nil
		}
	}
	s.startNet(sb, rt, sess)
}

// startNet keeps sb's network session up while sb runs, starting with sess (nil: open one).
func (s *Service) startNet(sb sandbox.Sandbox, rt runtime.Runtime, sess *guest.NetSession) {
	if s.net.proxy == nil || sb.Network.Policy == nil {
		if sess != nil {
			sess.Close()
		}
		return
	}
	compiled, err := egress.ParsePolicy(*sb.Network.Policy)
	if err != nil {
		// The stored policy was valid when it was stored; a newer build refusing it must not
		// open the sandbox to anything.
		s.core.Log().Error("sandbox's stored network policy is refused; its egress stays closed", "sandbox_id", sb.ID, "err", err)
		if sess != nil {
			sess.Close()
		}
		return
	}
	n := &netSandbox{id: sb.ID, req: s.netRequest(rt), slots: make(chan struct{}, maxNetStreams), changed: make(chan struct{})}
	n.policy.Store(compiled)
	n.target.Store(&egress.Target{SandboxID: sb.ID, Policy: n.policy.Load, Secrets: sb.Secrets})
	n.ctx, n.cancel = context.WithCancel(s.core.Context())
	s.net.mu.Lock()
	if old := s.net.m[sb.ID]; old != nil {
		old.cancel()
	}
	s.net.m[sb.ID] = n
	s.net.mu.Unlock()
	s.core.Go(func(context.Context) { s.netLoop(n, sess) })
}

// stopNet ends sandbox id's session and its streams (they finish in the background; Close
// waits for them).
func (s *Service) stopNet(id string) {
	s.net.mu.Lock()
	n := s.net.m[id]
	delete(s.net.m, id)
	s.net.mu.Unlock()
	if n != nil {
		n.cancel()
	}
}

// forgetNet removes n if it is still id's.
func (s *Service) forgetNet(n *netSandbox) {
	s.net.mu.Lock()
	if s.net.m[n.id] == n {
		delete(s.net.m, n.id)
	}
	s.net.mu.Unlock()
	n.cancel()
}

// setNetPolicy makes compiled the policy of the next connection of sandbox id.
func (s *Service) setNetPolicy(id string, compiled *egress.Compiled) {
	if n := s.netOf(id); n != nil {
		n.policy.Store(compiled)
	}
}

// setNetSecrets makes secrets those of the next connection of sandbox id (a claimed pooled
// sandbox's: it was started without any).
func (s *Service) setNetSecrets(id string, secrets []egress.Secret) {
	if n := s.netOf(id); n != nil {
		n.target.Store(&egress.Target{SandboxID: id, Policy: n.policy.Load, Secrets: secrets})
	}
}

// netLoop serves n's sessions until n is stopped or its sandbox no longer runs.
func (s *Service) netLoop(n *netSandbox, sess *guest.NetSession) {
	defer n.cancel()
	backoff := netBackoffMin
	failures := 0
	for {
		if sess != nil {
			began := time.Now()
			s.serveSession(n, sess)
			if n.ctx.Err() != nil {
				return
			}
			if time.Since(began) >= time.Second {
				backoff = netBackoffMin
			}
			s.core.Log().Info("sandbox network session ended; reopening", "sandbox_id", n.id)
			sess = nil
			if !sleepCtx(n.ctx, backoff) {
				return
			}
			backoff = min(2*backoff, netBackoffMax)
		}
		if n.ctx.Err() != nil {
			return
		}
		_, gc, err := s.core.Running(n.ctx, n.id, false)
		if c := errcode.Of(err); c == errcode.SandboxNotRunning || c == errcode.SandboxNotFound {
			s.forgetNet(n)
			return
		}
		if err == nil {
			sess, err = gc.NetSession(n.ctx, n.req)
		}
		if err != nil {
			if n.ctx.Err() != nil {
				return
			}
			if failures++; failures == 1 || failures%60 == 0 {
				s.core.Log().Warn("sandbox network session did not open; retrying", "sandbox_id", n.id, "attempt", failures, "err", err)
			}
			sess = nil
			if !sleepCtx(n.ctx, backoff) {
				return
			}
			backoff = min(2*backoff, netBackoffMax)
			continue
		}
		failures = 0
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// serveSession hands each stream of sess to the proxy until sess ends, then closes it. A
// stream is served in the goroutine that read its header (NetSession.Handle); the Accept loop
// only serves those that came before Handle.
func (s *Service) serveSession(n *netSandbox, sess *guest.NetSession) {
	stop := context.AfterFunc(n.ctx, func() { sess.Close() })
	defer stop()
	defer sess.Close()
	n.setUp(true, sess.Reply)
	defer n.setUp(false, guest.NetSessionReply{})
	sess.Handle(func(st *guest.NetStream) func() { return s.startStream(n, sess, st) })
	for {
		st, err := sess.Accept()
		if err != nil {
			return
		}
		if run := s.startStream(n, sess, st); run != nil {
			go run()
		}
	}
}

// startStream checks st's header and takes one of n's slots (waiting while maxNetStreams are
// served, until sess or n ends); it returns what serves st, or nil when st was closed. It
// runs while a goroutine of the service (serveSession's, or one sess counts and Close waits
// for, inside serveSession) is still held by the core, so its Hold is safe.
func (s *Service) startStream(n *netSandbox, sess *guest.NetSession, st *guest.NetStream) func() {
	kind := egress.Kind(st.Header.Kind)
	var dst netip.AddrPort
	switch kind {
	case egress.KindProxy, egress.KindDNS:
	case egress.KindTransparent:
		var err error
		if dst, err = netip.ParseAddrPort(st.Header.Dst); err != nil {
			s.core.Log().Warn("sandbox agent sent a transparent stream without a destination", "sandbox_id", n.id, "dst", text.Truncate(st.Header.Dst, 64))
			st.Close()
			return nil
		}
	default:
		s.core.Log().Warn("sandbox agent sent a stream of unknown kind", "sandbox_id", n.id, "kind", text.Truncate(st.Header.Kind, 32))
		st.Close()
		return nil
	}
	select {
	case n.slots <- struct{}{}:
	case <-n.ctx.Done():
		st.Close()
		return nil
	case <-sess.Done():
		st.Close()
		return nil
	}
	done := s.core.Hold()
	return func() {
		defer done()
		defer func() { <-n.slots }()
		// The connection itself, not the NetStream around it: the proxy's copies between it
		// and TCP then splice. A handed-over socket (st.Header.FD) is the sandbox's own TCP
		// socket, which the proxy splices straight to the upstream; it holds this slot, so
		// maxNetStreams bounds them as it bounds relayed streams.
		s.net.proxy.Serve(n.ctx, n.target.Load(), st.Conn, kind, dst)
	}
}

// SessionReply waits until sandbox id's network session is up and returns where its listeners
// are (the proxy's and resolver's addresses as the sandbox sees them).
func (s *Service) SessionReply(ctx context.Context, id string) (guest.NetSessionReply, error) {
	for {
		n := s.netOf(id)
		if n == nil || n.ctx.Err() != nil {
			return guest.NetSessionReply{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s has no network session", id)
		}
		n.mu.Lock()
		up, reply, ch := n.up, n.reply, n.changed
		n.mu.Unlock()
		if up {
			return reply, nil
		}
		select {
		case <-ctx.Done():
			return guest.NetSessionReply{}, ctx.Err()
		case <-ch:
		case <-n.ctx.Done():
		}
	}
}
