// Package pools keeps warm pools: each keeps Size running sandboxes of one shape, so that a
// create of that shape claims one instead of starting one. It is a feature over the sandbox
// lifecycle core, which it reaches through its sandbox.Core handle and whose creates it joins
// through the create hooks (a caller's create claims in Prepare; a refill's sandbox is primed in
// Up); it reads and writes the pools and their sandboxes through its own Store.
//
// A pool's sandboxes are ordinary sandbox records (counted against capacity, driven by the
// control loop, adopted after a restart) whose Pool field names the pool and whose owner is
// "pool:<name>"; the core's List leaves them out unless asked for a pool's members. A create
// whose shape (after defaults) equals a pool's claims the pool's oldest ready sandbox in one
// conditional store update (sandbox.PoolStore.ClaimPooled): the record takes the caller's
// owner, labels, env, TTL and idempotency key, loses its Pool and gains FromPool. A claimed
// sandbox is never returned to a pool: it is destroyed like any other, so nothing of one
// claimant can reach another.
//
// Network: a pool's network is "none" or "egress". An egress pool's sandboxes are started with
// the egress plumbing (proxy env, CA bundle, network session) and a policy that allows nothing;
// a create with any network policy matches it, and its claim writes the claimant's policy and
// secrets to the record in the same transaction, then the core's Claimed hooks apply them to
// the sandbox's session before the create returns. The secrets' placeholders reach the
// claimant's commands as its env does (the core lays a claimed sandbox's env under every
// command's own).
//
// Env: a pooled sandbox was started without its claimant's env. The claimant's env is kept on
// the record (Sandbox.Env) and, for a sandbox with FromPool, the core lays it under every later
// command's own env (exec, jobs, pty, and what runs on them: Core.Env).
//
// Refill: a loop started by the core's Run keeps every pool at its size, one create at a time,
// never while a caller's create is in flight, backing off (1 s doubling to a minute) after
// failures. It also retires (destroys) what a pool holds beyond its size or after the pool is
// deleted.
package pools

import (
	"context"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/faultpoint"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
)

// Store is what warm pools read and write of durable state (sandbox.Store includes it).
type Store interface {
	sandbox.PoolStore
	GetSandbox(ctx context.Context, id string) (sandbox.Sandbox, error)
	ListSandboxes(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Sandbox, error)
}

// Service keeps the warm pools. It is safe for concurrent use.
type Service struct {
	core  *sandbox.Core
	store Store
	log   *slog.Logger
	pools poolState
}

type featureKey struct{}

// New returns the warm pools over core, reading and writing st, and registers their hooks: one
// per core, however often asked. Build it at wiring time, after the features whose Prepare its
// claim reads (the egress feature's network).
func New(core *sandbox.Core, st Store) *Service {
	return core.Feature(featureKey{}, func() any {
		s := &Service{core: core, store: st, log: core.Log()}
		core.Register(sandbox.Hooks{Name: "pools", Capacity: s.capacity, Start: s.start,
			Prepare: s.prepare, Up: s.up})
		return s
	}).(*Service)
}

// capacity is the pools' part of a capacity reply.
func (s *Service) capacity(ctx context.Context, c *sandbox.Capacity) error {
	var err error
	if c.Pools, err = s.ListPools(ctx); err != nil {
		return err
	}
	c.MaxPooled = s.maxPooled()
	return nil
}

// Bounds of the refill.
const (
	// poolRefillEvery is how often the refill loop looks at the pools without being kicked.
	poolRefillEvery = time.Second
	poolBackoffMax  = time.Minute
	// poolRefillDelay is how long after a claim the refill waits before starting a sandbox, so
	// that the claimant's first calls (its first exec) do not share the CPU with a container
	// start.
	poolRefillDelay = 150 * time.Millisecond
	// poolCacheFor is how long a create trusts the pools it (or the refill loop) last read.
	poolCacheFor = 2 * time.Second
)

var poolNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// poolState is the service's in-memory side of pools: hit and miss counters, refill backoff,
// the refill loop's wake-up and the count of interactive creates in flight. Its zero value is
// ready to use.
type poolState struct {
	interactive atomic.Int64 // creates in flight that are not refills
	lastClaim   atomic.Int64 // when the last claim was made (unix nanoseconds)
	once        sync.Once
	kickCh      chan struct{}
	started     atomic.Bool

	mu    sync.Mutex
	stats map[string]*poolStats // by pool name; at most sandbox.MaxPools (+ names whose members retire)
	// The pools as last read from the store, so that a create does not read them: cached is
	// valid while cachedGen == gen and for poolCacheFor after cachedAt. SetPool and DeletePool
	// bump gen (a read that began before a change is never kept); the refill loop re-reads
	// them every pass, which also brings in another server process's changes.
	gen       uint64
	cachedGen uint64
	cachedAt  time.Time
	cached    []sandbox.Pool
}

type poolStats struct {
	hits, misses int64
	failures     int
	nextTry      time.Time
	lastErr      string
}

func (p *poolState) kickChan() chan struct{} {
	p.once.Do(func() { p.kickCh = make(chan struct{}, 1) })
	return p.kickCh
}

// kick wakes the refill loop (never blocks).
func (p *poolState) kick() {
	select {
	case p.kickChan() <- struct{}{}:
	default:
	}
}

func (p *poolState) stat(name string) *poolStats {
	if p.stats == nil {
		p.stats = map[string]*poolStats{}
	}
	st := p.stats[name]
	if st == nil {
		st = &poolStats{}
		p.stats[name] = st
	}
	return st
}

// invalidate forgets the cached pools (a pool was set or deleted).
func (p *poolState) invalidate() {
	p.mu.Lock()
	p.gen++
	p.cached = nil
	p.mu.Unlock()
}

// listPools returns the pools: the cached ones while they are fresh, else the store's (which
// it caches).
func (s *Service) listPools(ctx context.Context, ps Store, fresh bool) ([]sandbox.Pool, error) {
	s.pools.mu.Lock()
	gen := s.pools.gen
	if !fresh && s.pools.cached != nil && s.pools.cachedGen == gen && time.Since(s.pools.cachedAt) < poolCacheFor {
		out := s.pools.cached
		s.pools.mu.Unlock()
		return out, nil
	}
	s.pools.mu.Unlock()
	began := time.Now()
	pools, err := ps.ListPools(ctx)
	if err != nil {
		return nil, err
	}
	s.pools.mu.Lock()
	if s.pools.gen == gen { // no SetPool or DeletePool since the read began
		s.pools.cached, s.pools.cachedGen, s.pools.cachedAt = slices.Clip(pools), gen, began
		if s.pools.cached == nil {
			s.pools.cached = []sandbox.Pool{}
		}
	}
	s.pools.mu.Unlock()
	return pools, nil
}

// maxPooled is the server-wide bound on the sum of all pools' sizes (serve --max-pooled; at
// most the live bound, by default half of it).
func (s *Service) maxPooled() int {
	if s.core.Config().MaxPooled > 0 {
		return min(s.core.Config().MaxPooled, s.core.Config().MaxSandboxes)
	}
	return max(1, s.core.Config().MaxSandboxes/2)
}

// normalizePool validates p and fills its shape's defaults as a create would.
func (s *Service) normalizePool(p *sandbox.Pool) error {
	if !poolNameRE.MatchString(p.Name) {
		return errcode.New(errcode.InvalidArgument, "name: a pool name is 1-63 characters of a-z, 0-9, '-' and '_', starting with a letter or digit; got %q", text.Truncate(p.Name, 80))
	}
	if p.Size < 0 || p.Size > s.maxPooled() {
		return errcode.New(errcode.InvalidArgument, "size must be between 0 and %d (the server's bound on pooled sandboxes); got %d", s.maxPooled(), p.Size)
	}
	switch p.Network {
	case "", sandbox.PoolNetworkNone:
		p.Network = sandbox.PoolNetworkNone
	case sandbox.PoolNetworkEgress:
	default:
		return errcode.New(errcode.InvalidArgument, "network: a pool's network is %q or %q (each claimant brings its own allow/deny policy); got %q", sandbox.PoolNetworkNone, sandbox.PoolNetworkEgress, text.Truncate(p.Network, 64))
	}
	req := createRequest(*p)
	// Checked as a create of it would be: an egress pool needs the proxy and a runtime with egress.
	if err := s.core.CheckCreate(context.Background(), &req); err != nil {
		return err
	}
	p.Image, p.Runtime, p.CPU, p.MemoryMB, p.DiskMB = req.Image, req.Runtime, req.CPU, req.MemoryMB, req.DiskMB
	return nil
}

// SetPool creates or replaces a pool (its shape and size). Sandboxes of an old shape are
// retired and the pool is refilled in the background.
func (s *Service) SetPool(ctx context.Context, p sandbox.Pool) (sandbox.PoolStatus, error) {
	ps := s.store
	if err := s.normalizePool(&p); err != nil {
		return sandbox.PoolStatus{}, err
	}
	pools, err := ps.ListPools(ctx)
	if err != nil {
		return sandbox.PoolStatus{}, err
	}
	total, exists := p.Size, false
	for _, o := range pools {
		if o.Name == p.Name {
			exists = true
			p.CreatedAt = o.CreatedAt
			continue
		}
		total += o.Size
	}
	if !exists && len(pools) >= sandbox.MaxPools {
		return sandbox.PoolStatus{}, errcode.New(errcode.InvalidArgument, "name: this server keeps at most %d pools; delete one first (pool_delete)", sandbox.MaxPools)
	}
	if total > s.maxPooled() {
		return sandbox.PoolStatus{}, errcode.New(errcode.InvalidArgument, "size: all pools together may keep at most %d sandboxes (the server's bound on pooled sandboxes); the other pools keep %d, so this one may keep at most %d; got %d",
			s.maxPooled(), total-p.Size, s.maxPooled()-(total-p.Size), p.Size)
	}
	now := s.core.Now()
	if p.CreatedAt.IsZero() {
		p.CreatedAt = now
	}
	p.UpdatedAt = now
	if err := ps.PutPool(ctx, p); err != nil {
		return sandbox.PoolStatus{}, err
	}
	s.pools.invalidate()
	s.pools.mu.Lock()
	st := s.pools.stat(p.Name)
	st.failures, st.nextTry, st.lastErr = 0, time.Time{}, ""
	s.pools.mu.Unlock()
	s.pools.kick()
	s.log.Info("pool set", "pool", p.Name, "image", p.Image, "runtime", p.Runtime, "size", p.Size)
	return s.poolStatus(ctx, ps, p)
}

// ListPools returns every pool with what it holds now and its hits and misses.
func (s *Service) ListPools(ctx context.Context) ([]sandbox.PoolStatus, error) {
	ps := s.store
	pools, err := ps.ListPools(ctx)
	if err != nil {
		return nil, err
	}
	counts, err := ps.CountPooled(ctx, s.core.Config().Node)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.PoolStatus, 0, len(pools))
	for _, p := range pools {
		out = append(out, s.statusOf(p, counts[p.Name]))
	}
	return out, nil
}

// DeletePool removes a pool; the ready sandboxes it holds are destroyed in the background.
func (s *Service) DeletePool(ctx context.Context, name string) error {
	if !poolNameRE.MatchString(name) {
		return errcode.New(errcode.InvalidArgument, "name: a pool name is 1-63 characters of a-z, 0-9, '-' and '_'; got %q", text.Truncate(name, 80))
	}
	ps := s.store
	if err := ps.DeletePool(ctx, name); err != nil {
		return err
	}
	s.pools.invalidate()
	s.pools.mu.Lock()
	delete(s.pools.stats, name) // a pool set again under this name starts its counts anew
	s.pools.mu.Unlock()
	s.pools.kick()
	s.log.Info("pool deleted", "pool", name)
	return nil
}

func (s *Service) poolStatus(ctx context.Context, ps Store, p sandbox.Pool) (sandbox.PoolStatus, error) {
	counts, err := ps.CountPooled(ctx, s.core.Config().Node)
	if err != nil {
		return sandbox.PoolStatus{}, err
	}
	return s.statusOf(p, counts[p.Name]), nil
}

func (s *Service) statusOf(p sandbox.Pool, c sandbox.PoolCount) sandbox.PoolStatus {
	out := sandbox.PoolStatus{Pool: p, Ready: c.Ready, Starting: c.Starting}
	s.pools.mu.Lock()
	if st := s.pools.stats[p.Name]; st != nil {
		out.Hits, out.Misses, out.LastError = st.hits, st.misses, st.lastErr
	}
	s.pools.mu.Unlock()
	return out
}

// matchPool returns the pool whose shape req (validated, defaults filled; egress: it has a
// network policy) has, if any.
func matchPool(pools []sandbox.Pool, req sandbox.CreateRequest, egress bool) (sandbox.Pool, bool) {
	for _, p := range pools {
		if p.Size > 0 && p.Image == req.Image && p.Runtime == req.Runtime && p.CPU == req.CPU &&
			p.MemoryMB == req.MemoryMB && p.DiskMB == req.DiskMB && (p.Network == sandbox.PoolNetworkEgress) == egress {
			return p, true
		}
	}
	return sandbox.Pool{}, false
}

// createRequest is the create that fills p: an egress pool's sandboxes start with a policy that
// allows nothing (a claim replaces it).
func createRequest(p sandbox.Pool) sandbox.CreateRequest {
	req := sandbox.CreateRequest{Image: p.Image, Runtime: p.Runtime, CPU: p.CPU, MemoryMB: p.MemoryMB, DiskMB: p.DiskMB}
	if p.Network == sandbox.PoolNetworkEgress {
		req.Network = &sandbox.Network{Policy: &egress.Policy{}}
	}
	return req
}

// prepare is the pools' Prepare hook. A refill's create (c.Pool) makes a sandbox the pool
// holds: nobody's until claimed, replaced before the longest TTL ends. A caller's create counts
// as interactive while it runs (refills yield to it) and claims a ready sandbox of its shape
// when a pool has one, which answers it.
func (s *Service) prepare(ctx context.Context, c *sandbox.Creation) error {
	if c.Check {
		return nil
	}
	if c.Pool != "" {
		c.Sandbox.Pool, c.Sandbox.Owner, c.Sandbox.ExpiresAt = c.Pool, sandbox.PoolOwnerPrefix+c.Pool, c.Sandbox.CreatedAt.Add(s.core.Config().MaxTTL)
		c.Sandbox.Principal = gate.AdminPrincipal // nobody's until claimed: the claim gives it the claimant's
		return nil
	}
	s.pools.interactive.Add(1)
	c.Defer(func() { s.pools.interactive.Add(-1) })
	if sb, ok, err := s.claim(ctx, *c.Req, *c.Sandbox); ok {
		c.Answer(sb, err)
	}
	return nil
}

// up is the pools' Up hook: a refill's sandbox is primed before it becomes claimable, so
// its claimant's first exec finds the agent warm.
func (s *Service) up(ctx context.Context, c *sandbox.Creation, _ *guest.Client) error {
	if c.Pool != "" {
		s.primePooled(ctx, c.Sandbox.ID)
	}
	return nil
}

// claim takes a ready sandbox of a pool for a create of its shape. ok says the create is
// answered (by the claimed sandbox, the key's earlier sandbox, or err); !ok means start one as
// usual. draft is the create's draft record, whose network and secrets the network's Prepare
// set. Creates from a snapshot or with one of the sleep options (a pooled sandbox was started
// without them) never match.
func (s *Service) claim(ctx context.Context, req sandbox.CreateRequest, draft sandbox.Sandbox) (_ sandbox.Sandbox, ok bool, _ error) {
	if req.Snapshot != "" || req.AutoWake || req.TTLWhileSleeping || req.OnExpiry != "" {
		return sandbox.Sandbox{}, false, nil
	}
	ps := s.store
	pools, err := s.listPools(ctx, ps, false)
	if err != nil {
		s.log.Warn("pools: cannot read the pools; starting a sandbox", "err", err)
		return sandbox.Sandbox{}, false, nil
	}
	p, found := matchPool(pools, req, draft.Network.Policy != nil)
	if !found {
		return sandbox.Sandbox{}, false, nil
	}
	now := s.core.Now()
	owner := sandbox.OwnerFrom(ctx)
	c := sandbox.PoolClaim{Pool: p.Name, Node: s.core.Config().Node, Owner: owner, Principal: sandbox.PrincipalFrom(ctx),
		IdempotencyKey: req.IdempotencyKey, Env: req.Env, Labels: req.Labels,
		ExpiresAt: now.Add(time.Duration(req.TTLSeconds) * time.Second), At: now}
	if draft.Network.Policy != nil {
		c.Network, c.Secrets = draft.Network, draft.Secrets
	}
	claimed, prior, err := ps.ClaimPooled(ctx, c)
	if err != nil {
		return sandbox.Sandbox{}, true, err
	}
	if prior.ID != "" {
		asked := sandbox.Sandbox{Image: req.Image, Runtime: req.Runtime, CPU: req.CPU, MemoryMB: req.MemoryMB, DiskMB: req.DiskMB,
			Env: req.Env, Labels: req.Labels, IdempotencyKey: req.IdempotencyKey}
		sb, err := s.core.SameCreate(ctx, prior, asked, req)
		return sb, true, err
	}
	if claimed.ID != "" && !holds(p, claimed) {
		// The pool was set to another shape and this one of the old shape was not retired
		// yet: it is not what the caller asked for. It is the caller's now (nobody else can
		// claim it), so it is destroyed, and the create starts a sandbox of its shape.
		s.log.Info("pools: claimed a sandbox of the pool's old shape; destroying it", "sandbox_id", claimed.ID, "pool", p.Name)
		id, dctx := claimed.ID, context.WithoutCancel(ctx)
		s.core.Go(func(context.Context) {
			if _, err := s.core.Destroy(dctx, id); err != nil {
				s.log.Warn("pools: destroy a sandbox of an old shape", "sandbox_id", id, "err", err)
			}
		})
		claimed = sandbox.Sandbox{}
	}
	s.pools.mu.Lock()
	st := s.pools.stat(p.Name)
	if claimed.ID == "" {
		st.misses++
	} else {
		st.hits++
	}
	s.pools.mu.Unlock()
	if claimed.ID == "" {
		s.pools.kick()
		return sandbox.Sandbox{}, false, nil
	}
	s.core.Claimed(ctx, claimed) // its network and secrets, recorded above, now live
	s.pools.lastClaim.Store(time.Now().UnixNano())
	// The refill is woken once the claimant's first calls are likely done (afterClaimDelay
	// waits as long anyway): until then even its reads of the pools would share the CPU
	// with them.
	time.AfterFunc(poolRefillDelay, s.pools.kick)
	s.log.Info("sandbox claimed from pool", "sandbox_id", claimed.ID, "pool", p.Name, "owner", owner)
	return claimed, true, nil
}

// runPools is the refill loop: it keeps each pool at its size until ctx ends.
func (s *Service) runPools(ctx context.Context) {
	tick := time.NewTicker(poolRefillEvery)
	defer tick.Stop()
	for {
		s.refillPass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.pools.kickChan():
		}
	}
}

// Refill runs one pass of the refill now, as the loop does every second and after each claim
// (refillPass).
func (s *Service) Refill(ctx context.Context) { s.refillPass(ctx) }

// refillPass retires what pools hold beyond their size (or of a deleted pool, or of an old
// shape), then creates the missing sandboxes one at a time, yielding to interactive creates.
func (s *Service) refillPass(ctx context.Context) {
	ps := s.store
	pools, err := s.listPools(ctx, ps, true)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("pools: cannot read the pools", "err", err)
		}
		return
	}
	counts, err := ps.CountPooled(ctx, s.core.Config().Node)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("pools: cannot count pooled sandboxes", "err", err)
		}
		return
	}
	byName := map[string]sandbox.Pool{}
	for _, p := range pools {
		byName[p.Name] = p
	}
	held := 0 // what the pools hold together, kept within maxPooled (a server restarted with a
	// lower --max-pooled than its stored pools' sizes add up to fills them in name order)
	for name, c := range counts {
		p, exists := byName[name]
		if !exists || c.Ready+c.Starting > p.Size || s.hasStale(ctx, p) {
			s.retirePooled(ctx, name, p, exists)
		}
		if exists {
			held += min(c.Ready+c.Starting, p.Size)
		}
	}
	for _, p := range pools {
		for ctx.Err() == nil {
			c := counts[p.Name]
			if c.Ready+c.Starting >= p.Size || held >= s.maxPooled() || !s.refillDue(p.Name) {
				break
			}
			if s.pools.interactive.Load() > 0 || !s.afterClaimDelay(ctx) {
				return // interactive creates go first; the next pass (kicked or ticked) resumes
			}
			err := s.fillOne(ctx, p)
			if ctx.Err() != nil {
				return
			}
			s.refillDone(p.Name, err)
			if err != nil {
				s.log.Warn("pools: refill failed", "pool", p.Name, "err", err)
				break
			}
			c.Ready++
			counts[p.Name] = c
			held++
		}
	}
}

// afterClaimDelay waits until poolRefillDelay has passed since the last claim (false if ctx
// ended first, or an interactive create started meanwhile).
func (s *Service) afterClaimDelay(ctx context.Context) bool {
	for {
		wait := poolRefillDelay - time.Since(time.Unix(0, s.pools.lastClaim.Load()))
		if wait <= 0 {
			return s.pools.interactive.Load() == 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// primePooled runs `true` once in a sandbox made for a pool, before it becomes claimable: the
// first command a sandbox runs pays for warming its agent's exec path, and that is the pool's
// cost, not its claimant's. It runs as the default user and leaves nothing; a failure is only
// logged (the sandbox is still usable, or its watch finds it lost).
func (s *Service) primePooled(ctx context.Context, id string) {
	gc := s.core.Guest(id)
	if gc == nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := gc.Exec(pctx, guest.ExecRequest{Argv: []string{"true"}, TimeoutMs: 10_000}, nil); err != nil {
		s.log.Warn("pools: priming a pooled sandbox failed", "sandbox_id", id, "err", err)
	}
}

// fillOne creates one sandbox for p (through Create, as the pool).
func (s *Service) fillOne(ctx context.Context, p sandbox.Pool) error {
	_, err := s.core.CreatePooled(ctx, p.Name, createRequest(p))
	if err == nil {
		faultpoint.Hit(faultpoint.PoolRefill) // the pool's new sandbox runs; the refill has not counted it
	}
	return err
}

func (s *Service) refillDue(name string) bool {
	s.pools.mu.Lock()
	defer s.pools.mu.Unlock()
	return !s.core.Now().Before(s.pools.stat(name).nextTry)
}

func (s *Service) refillDone(name string, err error) {
	s.pools.mu.Lock()
	defer s.pools.mu.Unlock()
	st := s.pools.stat(name)
	if err == nil {
		st.failures, st.nextTry, st.lastErr = 0, time.Time{}, ""
		return
	}
	st.failures++
	st.nextTry = s.core.Now().Add(min(poolBackoffMax, time.Second<<min(st.failures-1, 6)))
	st.lastErr = text.Truncate(errcode.Message(err), 512)
}

// poolMembers lists the running sandboxes pool name holds (bounded by the pooled bound).
func (s *Service) poolMembers(ctx context.Context, name string) ([]sandbox.Sandbox, error) {
	return s.store.ListSandboxes(ctx, sandbox.ListFilter{Pool: name, States: []sandbox.State{sandbox.StateRunning}, Limit: sandbox.MaxList})
}

// hasStale reports whether p holds a ready sandbox of another shape than p's (the pool was set
// to a new shape).
func (s *Service) hasStale(ctx context.Context, p sandbox.Pool) bool {
	members, err := s.poolMembers(ctx, p.Name)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(members, func(sb sandbox.Sandbox) bool { return !holds(p, sb) })
}

func holds(p sandbox.Pool, sb sandbox.Sandbox) bool {
	return sb.Image == p.Image && sb.Runtime == p.Runtime && sb.CPU == p.CPU && sb.MemoryMB == p.MemoryMB && sb.DiskMB == p.DiskMB &&
		(sb.Network.Policy != nil) == (p.Network == sandbox.PoolNetworkEgress)
}

// retire destroys the ready sandboxes pool name holds that it should not: all of them when the
// pool is gone, those of an old shape, and the newest beyond its size. A sandbox claimed
// meanwhile is left alone (the destroy is conditional on the record still being pooled).
func (s *Service) retirePooled(ctx context.Context, name string, p sandbox.Pool, exists bool) {
	members, err := s.poolMembers(ctx, name)
	if err != nil {
		return
	}
	keep := 0
	for _, sb := range members { // oldest first
		if exists && holds(p, sb) && keep < p.Size {
			keep++
			continue
		}
		s.retireOne(ctx, sb.ID, name)
	}
}

func (s *Service) retireOne(ctx context.Context, id, pool string) {
	unlock, ok := s.core.TryLock(id)
	if !ok {
		return
	}
	defer unlock()
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil || sb.Pool != pool || sb.State != sandbox.StateRunning {
		return
	}
	if _, err := s.core.StopAndDestroy(ctx, sb, "retired from pool "+pool); err != nil && ctx.Err() == nil {
		if errcode.Of(err) != errcode.Conflict { // a claim won the race: it is the claimant's now
			s.log.Warn("pools: retire", "sandbox_id", id, "pool", pool, "err", err)
		}
	}
}

// start starts the refill loop, on the service's background context and ctx both, unless
// it runs already; wait waits for a loop it started to end (after ctx does).
func (s *Service) start(ctx context.Context) (wait func()) {
	if !s.pools.started.CompareAndSwap(false, true) {
		return func() {}
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	s.core.Go(func(bg context.Context) {
		defer close(done)
		defer s.pools.started.Store(false)
		defer context.AfterFunc(bg, cancel)()
		defer cancel()
		s.runPools(rctx)
	})
	return func() { <-done }
}

// ParseFlag parses serve's --pool value: comma-separated key=value pairs, name and size
// required, the shape's fields optional (the server's defaults): e.g.
// "name=py,image=python:3.12,runtime=runc,cpu=1,memory_mb=512,disk_mb=1024,size=4".
func ParseFlag(v string) (sandbox.Pool, error) {
	var p sandbox.Pool
	seen := map[string]bool{}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k == "" {
			return sandbox.Pool{}, errcode.New(errcode.InvalidArgument, "--pool %q: %q is not key=value (keys: name, image, runtime, cpu, memory_mb, disk_mb, network, size)", text.Truncate(v, 200), text.Truncate(kv, 80))
		}
		if seen[k] {
			return sandbox.Pool{}, errcode.New(errcode.InvalidArgument, "--pool: %s is given twice", k)
		}
		seen[k] = true
		var err error
		switch k {
		case "name":
			p.Name = val
		case "image":
			p.Image = val
		case "runtime":
			p.Runtime = val
		case "network":
			p.Network = val
		case "cpu":
			p.CPU, err = strconv.ParseFloat(val, 64)
		case "memory_mb":
			p.MemoryMB, err = strconv.ParseInt(val, 10, 64)
		case "disk_mb":
			p.DiskMB, err = strconv.ParseInt(val, 10, 64)
		case "size":
			p.Size, err = strconv.Atoi(val)
		default:
			return sandbox.Pool{}, errcode.New(errcode.InvalidArgument, "--pool: unknown key %q (keys: name, image, runtime, cpu, memory_mb, disk_mb, network, size)", text.Truncate(k, 40))
		}
		if err != nil {
			return sandbox.Pool{}, errcode.New(errcode.InvalidArgument, "--pool: %s must be a number; got %q", k, text.Truncate(val, 40))
		}
	}
	if !seen["name"] || !seen["size"] {
		return sandbox.Pool{}, errcode.New(errcode.InvalidArgument, "--pool %q: name and size are required, e.g. name=py,image=python:3.12,size=4", text.Truncate(v, 200))
	}
	return p, nil
}
