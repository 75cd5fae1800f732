// Package gate is the one seam every call passes on its way in — each REST route and each MCP
// tool — so that scopes, approvals and the audit log see every call the same way, whatever the
// surface. The surfaces (api, mcpserver) build a Call and Enter the server's Chain before the
// call acts, and call the returned exit with its outcome.
package gate

import (
	"context"
	"encoding/json"
	"strings"
	"time"
)

// Surfaces.
const (
	SurfaceREST     = "rest"
	SurfaceMCP      = "mcp"       // MCP over streamable HTTP or SSE (behind the REST auth)
	SurfaceMCPStdio = "mcp-stdio" // `agentbox mcp` in process
)

// Caller is who makes a call: an API key (its id and name, never the key) or the stdio
// session, with the key's scope.
type Caller struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Scope string `json:"scope"`
	// Principal is who the caller acts as, owning what it creates: an API key's "key:<id>",
	// or AdminPrincipal for the server's token and the stdio session.
	Principal string `json:"principal,omitempty"`
}

// AdminPrincipal is the principal of the server's token (and of the stdio session, and of
// records made before principals were recorded).
const AdminPrincipal = "admin"

// KeyPrincipalPrefix begins the principal of an API key: "key:" and its id (what auth.Key.Owner
// records as the owner of what the key creates).
const KeyPrincipalPrefix = "key:"

// PrincipalOf is the principal a recorded owner stands for: an API key's owner is the key;
// anything else (the server's token, an MCP session without a key, a run without a key's
// owner, nobody) is the admin's.
func PrincipalOf(owner string) string {
	if strings.HasPrefix(owner, KeyPrincipalPrefix) && len(owner) > len(KeyPrincipalPrefix) {
		return owner
	}
	return AdminPrincipal
}

// Object is what a call names and acts on: a sandbox, a run, a snapshot… Kind is one of the
// Object* kinds; ID is its id as the call gave it ("" for lists and server-level calls).
type Object struct {
	Kind string `json:"kind,omitempty"`
	ID   string `json:"id,omitempty"`
}

// Object kinds. Sandbox, Job and Expose are owned through their sandbox (their ID is the
// sandbox's); Run, Batch and Snapshot have their own principal; the others are the server's
// (their scope decides who may act on them).
const (
	ObjectNone     = ""
	ObjectSandbox  = "sandbox"
	ObjectJob      = "job"
	ObjectExpose   = "expose"
	ObjectRun      = "run"
	ObjectBatch    = "batch"
	ObjectSnapshot = "snapshot"
	ObjectApproval = "approval"
	ObjectKey      = "key"
	ObjectMachine  = "machine"
	ObjectPool     = "pool"
	ObjectBlob     = "blob"
	ObjectImage    = "image"
	// ObjectConversation: a conversation of agentbox chat (its own principal).
	ObjectConversation = "conversation"
)

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller WithCaller put on ctx.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// Call is one call on its way in.
type Call struct {
	Surface string
	// Tool is the MCP tool's name, or for REST the route's pattern ("POST
	// /v1/sandboxes/{id}/exec").
	Tool string
	// Action is the MCP tool a REST route is the same operation as ("exec", "file_write"…), so
	// that a rule naming a tool covers both surfaces; for MCP it is Tool.
	Action string
	// Args are the call's arguments as JSON: the MCP tool's arguments; for REST an object of
	// the path values, the query and the JSON body (a streamed body is represented by its
	// length and SHA-256, never its content).
	Args      json.RawMessage
	SandboxID string
	// Scope is the scope the call needs as its surface declares it (the REST route table); ""
	// lets the scope gate look it up by Tool (MCP tools).
	Scope string
	// ReadOnly is the surface's declaration that the call only reads: approvals never gate
	// it.
	ReadOnly bool
	// Object is what the call names, resolved to its principal by the authorization gate.
	Object  Object
	Caller  Caller
	Started time.Time
	// ApprovalID is set by the approvals gate: the approval the call waited for (audit records
	// it).
	ApprovalID string
	// Progress, if non-nil, tells the caller why the call waits (an approval pending).
	Progress func(msg string)
	// Elicit, if non-nil, asks the MCP client's user a question (elicitation/create) and
	// returns whether they accepted, with their optional reason.
	Elicit func(ctx context.Context, message string) (accepted bool, reason string, err error)
	// NotRecorded is set by the exit of a gate that must keep a durable record of the call (the
	// audit log) when it could not: a typed error (UNAVAILABLE) that the surface answers instead
	// of the call's own reply, so no call is acknowledged without its record.
	NotRecorded error
}

// Gate sees a call before it acts. An error refuses the call (its typed error is the call's
// reply, and nothing acts). When err is nil, exit is non-nil and must be called exactly once
// with the call's outcome (nil, or the error it returned).
type Gate interface {
	Enter(ctx context.Context, c *Call) (exit func(outcome error), err error)
}

// Chain is gates entered in order and exited in reverse. The zero Chain lets everything in.
type Chain []Gate

// Enter enters every gate in order; if one refuses, those already entered are exited with its
// error.
func (ch Chain) Enter(ctx context.Context, c *Call) (func(error), error) {
	exits := make([]func(error), 0, len(ch))
	exitAll := func(outcome error) {
		for i := len(exits) - 1; i >= 0; i-- {
			exits[i](outcome)
		}
	}
	for _, g := range ch {
		if g == nil {
			continue
		}
		exit, err := g.Enter(ctx, c)
		if err != nil {
			exitAll(err)
			return nil, err
		}
		exits = append(exits, exit)
	}
	return exitAll, nil
}

// Observer is a gate that also sees the calls a surface refused before the chain (arguments
// that fail the tool's schema, a request that failed authentication): they never act, and only
// observers (the audit log) hear of them.
type Observer interface {
	Observe(c *Call, outcome error)
}

// Observe tells every Observer of the chain about a call refused before it.
func (ch Chain) Observe(c *Call, outcome error) {
	for _, g := range ch {
		if o, ok := g.(Observer); ok {
			o.Observe(c, outcome)
		}
	}
}
