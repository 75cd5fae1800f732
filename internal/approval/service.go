package approval

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
)

// Defaults.
const (
	DefaultTimeout       = 5 * time.Minute
	MaxTimeout           = 24 * time.Hour
	DefaultProgressEvery = 5 * time.Second
	DefaultValidity      = time.Hour
	DefaultMaxPending    = 256
	DefaultRetention     = 7 * 24 * time.Hour
)

// Config configures a Service.
type Config struct {
	// Required gates every call that acts (everything but ReadOnly tools, read-only REST routes and the
	// approval routes). Tools, when set, gates only these (matched against gate.Call.Action,
	// so a REST route of the same operation is gated too, and against Tool). Neither: nothing
	// is gated (the Service still serves the queue).
	Required bool
	Tools    []string
	// Timeout is how long a call waits for a decision (default DefaultTimeout).
	Timeout time.Duration
	// Elicit lets the MCP client itself decide (elicitation/create) when it supports it. Off by
	// default: the client asked is the model's own, and its user approving the model's call in
	// the same window is not always the separation an operator wants.
	Elicit bool
	// Audit, if set, records the decisions made inside a call rather than by a call of their
	// own (an elicited one: the MCP client's user answering within the gated call) as audit
	// records, like an operator's approve or deny call.
	Audit gate.Observer
	// ProgressEvery is how often a waiting call reports progress (default 5 s).
	ProgressEvery time.Duration
	// Validity is how long an approval stays bound to its digest: within it a call with the same
	// digest by the same caller joins the pending approval, uses an approved one, or is refused
	// once it was used (default 1 h). After it, the same call asks anew.
	Validity time.Duration
	// MaxPending bounds the pending queue (default 256); past it calls are refused with
	// CAPACITY_UNAVAILABLE.
	MaxPending int
	// Retention is how long decided approvals are kept (default 7 days).
	Retention time.Duration
	// MayDecide says whether a caller may approve or deny. Default: scope "admin" (the auth
	// work's hook: approving needs an admin key).
	MayDecide func(gate.Caller) error
	Now       func() time.Time
	Log       *slog.Logger
}

// Service is the approvals gate and queue.
type Service struct {
	st    Store
	cfg   Config
	tools map[string]bool
	log   *slog.Logger

	mu        sync.Mutex          // find-or-create of one digest; wake channels
	wake      map[string]*waiters // the calls waiting on an approval
	lastPrune time.Time
}

var _ gate.Gate = (*Service)(nil)

// New returns a Service over st.
func New(st Store, cfg Config) (*Service, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Timeout < 0 || cfg.Timeout > MaxTimeout {
		return nil, errcode.New(errcode.InvalidArgument, "--approval-timeout %v must be between 1s and %v (default %v)", cfg.Timeout, MaxTimeout, DefaultTimeout)
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = DefaultProgressEvery
	}
	if cfg.Validity <= 0 {
		cfg.Validity = DefaultValidity
	}
	if cfg.Validity < cfg.Timeout {
		cfg.Validity = cfg.Timeout
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.MayDecide == nil {
		cfg.MayDecide = AdminOnly
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{st: st, cfg: cfg, log: cfg.Log, wake: map[string]*waiters{}}
	if len(cfg.Tools) > 0 {
		s.tools = map[string]bool{}
		for _, t := range cfg.Tools {
			if t = strings.TrimSpace(t); t != "" {
				s.tools[t] = true
			}
		}
	}
	return s, nil
}

// ElicitedDecision is the audit records' tool of a decision made through elicitation.
const ElicitedDecision = "approval_elicited_decision"

// AdminOnly is the default MayDecide: the caller's scope must be admin.
func AdminOnly(c gate.Caller) error {
	if c.Scope != "admin" {
		return errcode.New(errcode.PermissionDenied, "deciding on approvals needs an admin key (this caller's scope is %q)", c.Scope).With("retryable", false)
	}
	return nil
}

// Policy is what a Service holds for a decision, as a client reads it (GET
// /v1/approvals/policy).
type Policy struct {
	Required bool          // every call that acts waits
	Tools    []string      // only these tools (and their REST routes) wait; nil: Required decides
	Timeout  time.Duration // how long a call waits
	Elicit   bool          // the MCP client itself may decide
}

// Policy returns the service's policy.
func (s *Service) Policy() Policy {
	p := Policy{Required: s.cfg.Required && s.tools == nil, Timeout: s.cfg.Timeout, Elicit: s.cfg.Elicit}
	for t := range s.tools {
		p.Tools = append(p.Tools, t)
	}
	slices.Sort(p.Tools)
	return p
}

// MayDecide reports whether c may approve or deny (nil) or why not.
func (s *Service) MayDecide(c gate.Caller) error { return s.cfg.MayDecide(c) }

// Enabled reports whether any call is gated.
func (s *Service) Enabled() bool { return s.cfg.Required || len(s.tools) > 0 }

// Gated reports whether c waits for a decision.
func (s *Service) Gated(c *gate.Call) bool {
	if s.tools != nil {
		return s.tools[c.Action] || s.tools[c.Tool]
	}
	if !s.cfg.Required {
		return false
	}
	if c.Surface == gate.SurfaceREST {
		// The route's declaration says whether it only reads (a GET may act: the terminal);
		// deciding on approvals is never itself held.
		_, path, _ := strings.Cut(c.Tool, " ")
		return !c.ReadOnly && !strings.HasPrefix(path, "/v1/approvals/")
	}
	return !ReadOnly[c.Tool]
}

// Enter implements gate.Gate: a gated call waits for its approval, and runs only once it has
// claimed it.
func (s *Service) Enter(ctx context.Context, c *gate.Call) (func(error), error) {
	if !s.Gated(c) {
		return func(error) {}, nil
	}
	digest, err := Digest(c.Tool, c.Args)
	if err != nil {
		return nil, err
	}
	bound := false
	var probe struct {
		BodyBytes *int64 `json:"body_bytes"`
	}
	if c.Surface == gate.SurfaceREST && json.Unmarshal(c.Args, &probe) == nil && probe.BodyBytes != nil {
		bound = true
	}
	a, err := s.findOrCreate(ctx, c, digest, bound)
	if err != nil {
		return nil, err
	}
	c.ApprovalID = a.ID // the audit log records which approval the call waited for
	if a.State == Used {
		return nil, s.usedError(a)
	}
	if a.State == Pending {
		if a, err = s.wait(ctx, c, a); err != nil {
			return nil, err
		}
	}
	// Approved: claim it, so that it is used exactly once.
	ok, err := s.st.ClaimApproval(ctx, a.ID, s.cfg.Now())
	if err != nil {
		return nil, err
	}
	if !ok {
		cur, err := s.st.GetApproval(ctx, a.ID)
		if err != nil {
			return nil, err
		}
		return nil, s.usedError(cur)
	}
	s.log.Info("approval used", "approval_id", a.ID, "tool", c.Tool, "digest", digest)
	id := a.ID
	return func(outcome error) {
		o := "ok"
		if outcome != nil {
			o = string(errcode.Of(outcome))
		}
		octx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.st.SetApprovalOutcome(octx, id, o); err != nil {
			s.log.Warn("record approval outcome", "approval_id", id, "err", err)
		}
	}, nil
}

// findOrCreate returns the approval this call is: one of the same caller and digest within
// Validity (pending: join it; approved: use it; used: refuse), else a new pending one.
func (s *Service) findOrCreate(ctx context.Context, c *gate.Call, digest string, bound bool) (Approval, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	if _, err := s.st.ExpireApprovals(ctx, now); err != nil {
		return Approval{}, err
	}
	if now.Sub(s.lastPrune) > time.Minute {
		s.lastPrune = now
		if n, err := s.st.PruneApprovals(ctx, now.Add(-s.cfg.Retention)); err != nil {
			s.log.Warn("prune approvals", "err", err)
		} else if n > 0 {
			s.log.Info("pruned approvals", "count", n)
		}
	}
	if !bound {
		a, found, err := s.st.FindApproval(ctx, c.Caller.ID, digest, now.Add(-s.cfg.Validity))
		if err != nil {
			return Approval{}, err
		}
		if found {
			return a, nil
		}
	}
	n, err := s.st.CountPendingApprovals(ctx)
	if err != nil {
		return Approval{}, err
	}
	if n >= s.cfg.MaxPending {
		return Approval{}, errcode.New(errcode.CapacityUnavailable, "the approval queue is full (%d pending); decide or let some expire first", n).With("max_pending", s.cfg.MaxPending)
	}
	a := Approval{ID: newID(), State: Pending, Tool: c.Tool, Action: c.Action, Surface: c.Surface, SandboxID: c.SandboxID,
		Digest: digest, Summary: Summarize(c), CallerID: c.Caller.ID, CallerName: c.Caller.Name, Principal: principalOf(c.Caller),
		CreatedAt: now, ExpiresAt: now.Add(s.cfg.Timeout), Bound: bound}
	if err := s.st.CreateApproval(ctx, a); err != nil {
		return Approval{}, err
	}
	s.log.Info("approval requested", "approval_id", a.ID, "tool", c.Tool, "digest", digest, "caller", c.Caller.Name)
	return a, nil
}

// wait waits for a's decision: an operator's, the MCP client's (elicitation, when allowed), or
// its expiry. It returns the approved approval, or the refusal.
func (s *Service) wait(ctx context.Context, c *gate.Call, a Approval) (Approval, error) {
	wctx, cancel := context.WithDeadline(ctx, a.ExpiresAt)
	defer cancel()
	deadline := time.NewTimer(time.Until(a.ExpiresAt))
	defer deadline.Stop()
	late := false
	// An elicited decision is audited before the call goes on: once the elicitation decides,
	// a decided state waits for its record.
	var elicited chan struct{}
	var deciding atomic.Bool
	if s.cfg.Elicit && c.Elicit != nil {
		elicited = make(chan struct{})
		go func() {
			defer close(elicited)
			s.elicit(wctx, c, a, &deciding)
		}()
	}
	settled := func() {
		if elicited != nil && deciding.Load() {
			select {
			case <-elicited:
			case <-ctx.Done():
			}
		}
	}
	tick := time.NewTicker(s.cfg.ProgressEvery)
	defer tick.Stop()
	wakeChan, leave := s.join(a.ID)
	defer leave()
	s.progress(c, a)
	for {
		wake := wakeChan()
		cur, err := s.st.GetApproval(ctx, a.ID)
		if err != nil {
			if ctx.Err() != nil {
				return Approval{}, abandoned(ctx, a)
			}
			return Approval{}, err
		}
		if cur.State != Pending {
			settled()
		}
		switch cur.State {
		case Approved:
			return cur, nil
		case Used:
			return Approval{}, s.usedError(cur)
		case Denied:
			msg := fmt.Sprintf("approval %s was denied by %s", cur.ID, cur.Decider)
			if cur.Reason != "" {
				msg += ": " + cur.Reason
			}
			return Approval{}, errcode.New(errcode.ApprovalRefused, "%s; the call did not run", msg).
				With("approval_id", cur.ID).With("reason", cur.Reason).With("retryable", false)
		case Expired:
			return Approval{}, unreachable(cur, s.cfg.Timeout)
		}
		if late {
			return Approval{}, unreachable(cur, s.cfg.Timeout)
		}
		select {
		case <-wake:
		case <-tick.C:
			s.progress(c, cur)
		case <-ctx.Done():
			return Approval{}, abandoned(ctx, a)
		case <-deadline.C:
			// Expire it, then look once more: a decision that raced the deadline wins.
			if _, err := s.st.ExpireApprovals(ctx, a.ExpiresAt); err != nil {
				return Approval{}, err
			}
			late = true
		}
	}
}

func (s *Service) progress(c *gate.Call, a Approval) {
	if c.Progress == nil {
		return
	}
	left := time.Until(a.ExpiresAt).Round(time.Second)
	c.Progress(fmt.Sprintf("waiting for an operator to approve %s (%s, digest %.12s): `agentbox approvals approve %s`; %v left", a.ID, a.Tool, a.Digest, a.ID, max(left, 0)))
}

// elicit asks the MCP client's user; an answer is a decision like an operator's.
// deciding is set before its decision is stored.
func (s *Service) elicit(ctx context.Context, c *gate.Call, a Approval, deciding *atomic.Bool) {
	msg := fmt.Sprintf("agentbox: approve this call?\n\n%s\n\napproval %s, digest %s", a.Summary, a.ID, a.Digest)
	ok, reason, err := c.Elicit(ctx, msg)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("elicitation failed; waiting for an operator", "approval_id", a.ID, "err", err)
		}
		return
	}
	decider := gate.Caller{ID: c.Caller.ID, Name: "elicitation:" + c.Caller.Name, Scope: "admin"}
	if !ok && reason == "" {
		reason = "declined in the MCP client"
	}
	started := time.Now()
	deciding.Store(true)
	_, err = s.decide(ctx, a.ID, ok, decider, reason)
	if err != nil && !errcode.Is(err, errcode.Conflict) {
		s.log.Warn("elicited decision", "approval_id", a.ID, "err", err)
	}
	if s.cfg.Audit != nil {
		args, _ := json.Marshal(map[string]any{"approval_id": a.ID, "approve": ok, "reason": reason, "tool": a.Tool, "digest": a.Digest})
		s.cfg.Audit.Observe(&gate.Call{Surface: c.Surface, Tool: ElicitedDecision, Action: ElicitedDecision, Caller: decider, SandboxID: c.SandboxID,
			Args: args, Started: started, ApprovalID: a.ID}, err)
	}
}

// waiters are the calls waiting on one approval: ch is closed (and replaced) when it is
// decided; the entry goes when the last waiter leaves.
type waiters struct {
	ch chan struct{}
	n  int
}

// join registers a waiter on id; it calls leave when it stops waiting.
func (s *Service) join(id string) (wake func() chan struct{}, leave func()) {
	s.mu.Lock()
	w, ok := s.wake[id]
	if !ok {
		w = &waiters{ch: make(chan struct{})}
		s.wake[id] = w
	}
	w.n++
	s.mu.Unlock()
	return func() chan struct{} {
			s.mu.Lock()
			defer s.mu.Unlock()
			return w.ch
		}, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if w.n--; w.n == 0 {
				delete(s.wake, id)
			}
		}
}

// StoreChanged wakes every waiting call to reread its approval: another replica may have
// decided it (sandbox.FollowChanges calls it on the shared store's change notifications).
func (s *Service) StoreChanged() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.wake {
		close(w.ch)
		w.ch = make(chan struct{})
	}
}

func (s *Service) wakeUp(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.wake[id]; ok {
		close(w.ch)
		w.ch = make(chan struct{})
	}
}

// List returns approvals newest first.
func (s *Service) List(ctx context.Context, f Filter) ([]Approval, error) {
	if f.State != "" && !validState(f.State) {
		return nil, errcode.New(errcode.InvalidArgument, "state %q: use one of pending, approved, denied, expired, used", f.State)
	}
	if f.Limit < 0 || f.Limit > MaxListLimit {
		return nil, errcode.New(errcode.InvalidArgument, "limit %d must be between 1 and %d (default %d)", f.Limit, MaxListLimit, DefaultListLimit)
	}
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	if _, err := s.st.ExpireApprovals(ctx, s.cfg.Now()); err != nil {
		return nil, err
	}
	return s.st.ListApprovals(ctx, f)
}

// Get returns one approval.
func (s *Service) Get(ctx context.Context, id string) (Approval, error) {
	if _, err := s.st.ExpireApprovals(ctx, s.cfg.Now()); err != nil {
		return Approval{}, err
	}
	return s.st.GetApproval(ctx, id)
}

// Decide approves or denies a pending approval, for decider (who must pass MayDecide), and
// wakes the call waiting on it.
func (s *Service) Decide(ctx context.Context, id string, approve bool, decider gate.Caller, reason string) (Approval, error) {
	if err := s.cfg.MayDecide(decider); err != nil {
		return Approval{}, err
	}
	if len(reason) > MaxReasonBytes {
		return Approval{}, errcode.New(errcode.InvalidArgument, "reason is %d bytes; at most %d", len(reason), MaxReasonBytes)
	}
	return s.decide(ctx, id, approve, decider, reason)
}

func (s *Service) decide(ctx context.Context, id string, approve bool, decider gate.Caller, reason string) (Approval, error) {
	to := Denied
	if approve {
		to = Approved
	}
	who := decider.Name
	if decider.ID != "" && decider.ID != decider.Name {
		who += " (" + decider.ID + ")"
	}
	a, err := s.st.DecideApproval(ctx, id, to, who, reason, s.cfg.Now())
	if err != nil {
		return Approval{}, err
	}
	s.log.Info("approval decided", "approval_id", id, "state", a.State, "decider", who, "reason", reason)
	s.wakeUp(id)
	return a, nil
}

func (s *Service) usedError(a Approval) error {
	msg := fmt.Sprintf("approval %s for this exact call (digest %.12s…) was already used", a.ID, a.Digest)
	if a.UsedAt != nil {
		msg += " at " + a.UsedAt.UTC().Format(time.RFC3339)
	}
	if a.Outcome != "" {
		msg += " (outcome: " + a.Outcome + ")"
	}
	e := errcode.New(errcode.ApprovalRefused, "%s; an approval covers one invocation, so the call is not run again: change an argument, or ask again after %s",
		msg, a.CreatedAt.Add(s.cfg.Validity).UTC().Format(time.RFC3339)).
		With("approval_id", a.ID).With("used", true).With("retryable", false)
	if a.Outcome != "" {
		e = e.With("outcome", a.Outcome)
	}
	return e
}

// abandoned is the error of a call whose caller went away while it waited: its approval stays
// pending, and a retry joins it.
func abandoned(ctx context.Context, a Approval) error {
	return errcode.Wrap(errcode.ApprovalRefused, ctx.Err(), "the call was abandoned while approval %s was pending", a.ID).With("approval_id", a.ID)
}

func unreachable(a Approval, timeout time.Duration) error {
	return errcode.New(errcode.ApprovalRefused, "nobody decided on approval %s within %v; the call did not run", a.ID, timeout).
		With("approval_id", a.ID).With("unreachable", true).With("retryable", false)
}

func validState(st State) bool {
	for _, v := range States {
		if v == st {
			return true
		}
	}
	return false
}

func newID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(errors.New("crypto/rand failed"))
	}
	return "ap-" + hex.EncodeToString(b[:])
}

// principalOf is the principal an approval c asks for is recorded with: the caller's, or the
// admin's for a caller without one (the server's token, the stdio session).
func principalOf(c gate.Caller) string {
	if c.Principal == "" {
		return gate.AdminPrincipal
	}
	return c.Principal
}
