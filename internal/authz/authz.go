// Package authz is the one authorization decision every call passes, whatever its surface:
// the scope its caller needs (auth: the REST route table's declaration, or the MCP tool's
// entry) and, when the call names an object that belongs to a principal — a sandbox (and its
// jobs, files, terminal and exposed ports), a run, a batch, a snapshot, an approval — whether it is the
// caller's. Another principal's object is answered with the same typed NotFound as a missing
// one, so that a key learns nothing of what it may not touch; an admin key sees and acts on
// everything. Lists are filtered by the handlers with ListPrincipal, from the same caller.
package authz

import (
	"context"
	"encoding/json"
	"sort"
	"strings"

	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Store is what the decision reads: the records that carry a principal.
type Store interface {
	GetSandbox(ctx context.Context, id string) (sandbox.Sandbox, error)
	GetSnapshot(ctx context.Context, id string) (sandbox.Snapshot, error)
}

// ApprovalStore is what the decision reads of approvals (their principal is the requesting
// key's).
type ApprovalStore interface {
	GetApproval(ctx context.Context, id string) (approval.Approval, error)
}

// RunStore is what the decision reads of runs and batches (their owner is their principal's).
type RunStore interface {
	GetRun(ctx context.Context, id string) (runs.Run, error)
	GetBatch(ctx context.Context, id string) (runs.Batch, error)
}

// ConversationStore is what the decision reads of agentbox chat's conversations: the
// principal of one (CONVERSATION_NOT_FOUND when none).
type ConversationStore interface {
	ConversationPrincipal(ctx context.Context, id string) (string, error)
}

// Gate is the authorization gate: a gate.Gate in the server's chain after the audit gate (so
// that every refusal is recorded) and before approvals (so that nobody is asked to approve a
// call that would be refused). It replaces auth.ScopeGate there, deciding the scope the same
// way.
type Gate struct {
	// Store resolves sandboxes and snapshots; nil: non-admin calls naming one are refused
	// (deny by default).
	Store Store
	// Runs resolves runs and batches; nil: likewise.
	Runs RunStore
	// Approvals resolves approvals; nil: likewise.
	Approvals ApprovalStore
	// Conversations resolves conversations; nil: likewise.
	Conversations ConversationStore
}

var _ gate.Gate = Gate{}

// Enter implements gate.Gate.
func (g Gate) Enter(ctx context.Context, c *gate.Call) (func(error), error) {
	if err := auth.CheckScope(c); err != nil {
		return nil, err
	}
	if auth.NeededScope(c) != auth.Public { // a public route checks its own credential
		for _, o := range Named(c) {
			if err := g.Decide(ctx, c.Caller, o); err != nil {
				return nil, err
			}
		}
	}
	return func(error) {}, nil
}

// argObjects are the argument names that name an owned object, in MCP tool arguments and REST
// request bodies alike; argObjectLists those that name several (watch_fleet's sandboxes).
var (
	argObjects = map[string]string{"sandbox_id": gate.ObjectSandbox, "snapshot_id": gate.ObjectSnapshot,
		"snapshot": gate.ObjectSnapshot, "run_id": gate.ObjectRun, "batch_id": gate.ObjectBatch}
	argObjectLists = map[string]string{"sandbox_ids": gate.ObjectSandbox}
)

// Named is every object c names: the one its REST path names (gate.Call.Object), and those its
// arguments name — an MCP tool's arguments, or a REST call's query and JSON body (a
// run_python's sandbox_id, a create's snapshot, a fork's snapshot_id, an event list's
// sandbox_id).
func Named(c *gate.Call) []gate.Object {
	var out []gate.Object
	if c.Object.ID != "" {
		out = append(out, c.Object)
	}
	var args map[string]json.RawMessage
	if json.Unmarshal(c.Args, &args) != nil {
		return out
	}
	if c.Surface == gate.SurfaceREST {
		// The query names objects too (GET /v1/events?sandbox_id=…): every value of each.
		var q map[string][]string
		if json.Unmarshal(args["query"], &q) == nil {
			for n, vs := range q {
				if kind, ok := argObjects[n]; ok {
					for _, id := range vs {
						if id != "" {
							out = append(out, gate.Object{Kind: kind, ID: id})
						}
					}
				}
			}
		}
		body := args["body"]
		args = nil
		if json.Unmarshal(body, &args) != nil {
			return out
		}
	}
	// Every key, matched as encoding/json matches a field (Unicode case folding: "SANDBOX_ID"
	// and "\u017fandbox_id" decode into sandbox_id too).
	names := make([]string, 0, len(args))
	for n := range args {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for an, kind := range argObjects {
			var id string
			if strings.EqualFold(n, an) && json.Unmarshal(args[n], &id) == nil && id != "" {
				out = append(out, gate.Object{Kind: kind, ID: id})
			}
		}
		for an, kind := range argObjectLists {
			var ids []string
			if strings.EqualFold(n, an) && json.Unmarshal(args[n], &ids) == nil {
				for _, id := range ids {
					if id != "" {
						out = append(out, gate.Object{Kind: kind, ID: id})
					}
				}
			}
		}
	}
	return out
}

// SeesAll reports whether caller sees and acts on every principal's objects: an admin key,
// the server's token, the stdio session.
func SeesAll(caller gate.Caller) bool { return caller.Scope == auth.ScopeAdmin }

// ListPrincipal is the principal a list made for ctx's caller is filtered to, and whether it
// is filtered at all (an admin's lists show everything).
func ListPrincipal(ctx context.Context) (string, bool) {
	c, ok := gate.CallerFrom(ctx)
	if !ok || SeesAll(c) {
		return "", false
	}
	if c.Principal == "" {
		return gate.AdminPrincipal, true
	}
	return c.Principal, true
}

// ListOwner is the owner a list of runs or batches made for ctx's caller is filtered to:
// ListPrincipal's principal (a key's runs and batches are owned by its principal), or "" for
// every owner's (an admin's lists).
func ListOwner(ctx context.Context) string {
	p, filtered := ListPrincipal(ctx)
	if !filtered {
		return ""
	}
	return p
}

// Owned reports whether the object kind has a principal of its own (or its sandbox's).
func Owned(kind string) bool {
	switch kind {
	case gate.ObjectSandbox, gate.ObjectJob, gate.ObjectExpose, gate.ObjectRun, gate.ObjectBatch, gate.ObjectSnapshot, gate.ObjectApproval, gate.ObjectConversation:
		return true
	}
	return false
}

// Decide lets caller act on o when o has no principal (a server-level object: its scope
// decides), when caller sees all, or when o is caller's; else it is o's NotFound, the same as
// for an object that does not exist.
func (g Gate) Decide(ctx context.Context, caller gate.Caller, o gate.Object) error {
	if o.ID == "" || !Owned(o.Kind) || SeesAll(caller) {
		return nil
	}
	p, err := g.principal(ctx, o)
	if err != nil {
		return err
	}
	if caller.Principal == "" || p != caller.Principal {
		return NotFound(o)
	}
	return nil
}

// principal resolves o to its principal; a missing object is NotFound(o).
func (g Gate) principal(ctx context.Context, o gate.Object) (string, error) {
	var p string
	var err error
	switch o.Kind {
	case gate.ObjectSandbox, gate.ObjectJob, gate.ObjectExpose:
		if g.Store == nil {
			return "", NotFound(o)
		}
		var sb sandbox.Sandbox
		sb, err = g.Store.GetSandbox(ctx, o.ID)
		p = sb.Principal
	case gate.ObjectSnapshot:
		if g.Store == nil {
			return "", NotFound(o)
		}
		var sn sandbox.Snapshot
		sn, err = g.Store.GetSnapshot(ctx, o.ID)
		p = sn.Principal
	case gate.ObjectRun:
		if g.Runs == nil {
			return "", NotFound(o)
		}
		var r runs.Run
		r, err = g.Runs.GetRun(ctx, o.ID)
		p = gate.PrincipalOf(r.Owner)
	case gate.ObjectBatch:
		if g.Runs == nil {
			return "", NotFound(o)
		}
		var b runs.Batch
		b, err = g.Runs.GetBatch(ctx, o.ID)
		p = gate.PrincipalOf(b.Owner)
	case gate.ObjectApproval:
		if g.Approvals == nil {
			return "", NotFound(o)
		}
		var a approval.Approval
		a, err = g.Approvals.GetApproval(ctx, o.ID)
		p = a.Principal
	case gate.ObjectConversation:
		if g.Conversations == nil {
			return "", NotFound(o)
		}
		p, err = g.Conversations.ConversationPrincipal(ctx, o.ID)
	}
	switch errcode.Of(err) {
	case "":
	case errcode.SandboxNotFound, errcode.RunNotFound, errcode.SnapshotNotFound, errcode.ApprovalNotFound, errcode.ConversationNotFound, errcode.InvalidArgument:
		return "", NotFound(o) // (a malformed id names nothing either)
	default:
		return "", err
	}
	if p == "" {
		p = gate.AdminPrincipal
	}
	return p, nil
}

// NotFound is the typed error for o not existing, the same whether it does not or belongs to
// another principal.
func NotFound(o gate.Object) error {
	switch o.Kind {
	case gate.ObjectRun:
		return errcode.New(errcode.RunNotFound, "run %s not found; run_list shows the runs kept", o.ID)
	case gate.ObjectBatch:
		return errcode.New(errcode.RunNotFound, "batch %s not found; the batch list shows the batches kept", o.ID)
	case gate.ObjectSnapshot:
		return errcode.New(errcode.SnapshotNotFound, "snapshot %s not found; snapshot_list shows which exist", o.ID)
	case gate.ObjectApproval:
		return errcode.New(errcode.ApprovalNotFound, "approval %s not found; `agentbox approvals ls` (GET /v1/approvals) lists those kept", o.ID).With("approval_id", o.ID)
	case gate.ObjectConversation:
		return errcode.New(errcode.ConversationNotFound, "conversation %s not found; agentbox chat ls shows yours", o.ID)
	}
	return errcode.New(errcode.SandboxNotFound, "sandbox %s not found; list sandboxes to see which exist", o.ID)
}

// SandboxPredicate is which sandboxes' series ctx's caller may see in the server's metrics
// (fetch_metrics and GET /metrics both apply it, through metricsnap.Query.Sandboxes and
// metricsnap.Filter): nil for a caller whose lists are not filtered (an admin: every
// sandbox); else exactly the sandboxes list returns for the caller's principal (the same
// principal ListPrincipal filters sandbox lists to). list is the sandbox list of that
// principal (live ones: a destroyed sandbox has no series).
func SandboxPredicate(ctx context.Context, list func(ctx context.Context, principal string) ([]string, error)) (func(sandboxID string) bool, error) {
	p, filtered := ListPrincipal(ctx)
	if !filtered {
		return nil, nil
	}
	ids, err := list(ctx, p)
	if err != nil {
		return nil, err
	}
	own := make(map[string]bool, len(ids))
	for _, id := range ids {
		own[id] = true
	}
	return func(id string) bool { return own[id] }, nil
}

// PrincipalSandboxes lists a principal's sandboxes that are not destroyed (pooled ones are
// nobody's until claimed), for SandboxPredicate: svc is the sandbox service, or an MCP
// server's backend.
func PrincipalSandboxes(svc interface {
	List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Sandbox, error)
}) func(ctx context.Context, principal string) ([]string, error) {
	return func(ctx context.Context, principal string) ([]string, error) {
		sbs, err := svc.List(ctx, sandbox.ListFilter{Principal: principal, Limit: sandbox.MaxList})
		if err != nil {
			return nil, err
		}
		ids := make([]string, len(sbs))
		for i, sb := range sbs {
			ids[i] = sb.ID
		}
		return ids, nil
	}
}
