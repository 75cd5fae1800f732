package api

import (
	"maps"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/gate"
)

// Route is a REST route's declaration: everything the gate chain decides a call by. The
// scope gate reads Scope, the authorization gate resolves Object to its principal, approvals
// read Action and ReadOnly, the audit log records them all. Registering a route that has no
// declaration here panics (patternMux), and TestEveryRouteDeclared checks the table against
// the routes and the OpenAPI document both ways, so a new route cannot slip past the gate.
type Route struct {
	// Action is the MCP tool the route is the same operation as ("exec"), so that a rule naming
	// a tool (an approval for "exec") covers both surfaces; else the route's own name.
	Action string
	// Scope is the scope a caller needs (auth.ScopeRead, ScopeOperate, ScopeAdmin), or
	// auth.Public for a route that checks its own credential.
	Scope string
	// Object is the kind of object the route's path names (gate.Object*): the caller must be
	// its principal, or an admin.
	Object string
	// ReadOnly says the route only reads: approvals never gate it.
	ReadOnly bool
	// Body is how the gate shows the request's body to the approver and the audit log.
	Body BodyKind
	// E2B marks a route of the E2B-compatible API (e2b.go): its errors, the gate's included,
	// are written in E2B's shapes, and it is not part of agentbox's OpenAPI document.
	E2B bool
}

// BodyKind is how a route's request body is shown.
type BodyKind int

const (
	// BodyJSON: a body, if any, is one JSON value whatever its Content-Type, shown whole; any
	// other body is refused before the chain (the handler would see what the approver did
	// not).
	BodyJSON BodyKind = iota
	// BodyStream: raw bytes (a file upload, an image archive), shown by length and SHA-256.
	BodyStream
	// BodySecret: a JSON body that holds a credential (a join token), shown by length only.
	BodySecret
)

// routeTable declares every REST route, by its pattern as registered.
var routeTable = map[string]Route{
	"GET /health":           read("health", auth.Public, gate.ObjectNone),
	"/v1/":                  read("no_such_endpoint", auth.ScopeRead, gate.ObjectNone),   // the catch-all answering unknown paths
	"GET /metrics":          read("prometheus_metrics", auth.ScopeRead, gate.ObjectNone), // a key's own sandboxes' series (authz.SandboxPredicate)
	"GET /v1/openapi.json":  read("openapi", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/capacity":      read("capacity", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/runtimes":      read("runtimes", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/events":        read("events", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/fleet/metrics": read("fleet_metrics", auth.ScopeRead, gate.ObjectNone),

	// sandboxes
	"POST /v1/sandboxes":                  act("sandbox_create", auth.ScopeOperate, gate.ObjectNone),
	"GET /v1/sandboxes":                   read("sandbox_list", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/sandboxes/{id}":              read("sandbox_get", auth.ScopeRead, gate.ObjectSandbox),
	"DELETE /v1/sandboxes/{id}":           act("sandbox_destroy", auth.ScopeOperate, gate.ObjectSandbox),
	"POST /v1/sandboxes/{id}/extend":      act("sandbox_extend", auth.ScopeOperate, gate.ObjectSandbox),
	"POST /v1/sandboxes/{id}/exec":        act("exec", auth.ScopeOperate, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/pty":          act("exec", auth.ScopeOperate, gate.ObjectSandbox), // an interactive shell: a WebSocket
	"PUT /v1/sandboxes/{id}/files":        stream("file_write", auth.ScopeOperate, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/files":        read("file_read", auth.ScopeRead, gate.ObjectSandbox),
	"DELETE /v1/sandboxes/{id}/files":     act("file_remove", auth.ScopeOperate, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/files/stat":   read("file_stat", auth.ScopeRead, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/files/list":   read("file_list", auth.ScopeRead, gate.ObjectSandbox),
	"POST /v1/sandboxes/{id}/files/mkdir": act("file_mkdir", auth.ScopeOperate, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/events":       read("sandbox_events", auth.ScopeRead, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/watch":        read("watch", auth.ScopeRead, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/metrics":      read("sandbox_metrics", auth.ScopeRead, gate.ObjectSandbox),
	// jobs
	"POST /v1/sandboxes/{id}/jobs":                 act("job_start", auth.ScopeOperate, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/jobs":                  read("job_list", auth.ScopeRead, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/jobs/{job_id}":         read("job_status", auth.ScopeRead, gate.ObjectJob),
	"GET /v1/sandboxes/{id}/jobs/{job_id}/logs":    read("job_logs", auth.ScopeRead, gate.ObjectJob),
	"GET /v1/sandboxes/{id}/jobs/{job_id}/wait":    read("job_wait", auth.ScopeRead, gate.ObjectJob),
	"POST /v1/sandboxes/{id}/jobs/{job_id}/cancel": act("job_cancel", auth.ScopeOperate, gate.ObjectJob),
	// network
	"PATCH /v1/sandboxes/{id}/network":        act("sandbox_network_update", auth.ScopeOperate, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/connections":      read("sandbox_connections", auth.ScopeRead, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/secret-calls":     read("sandbox_secret_calls", auth.ScopeRead, gate.ObjectSandbox),
	"POST /v1/sandboxes/{id}/expose":          act("sandbox_expose", auth.ScopeOperate, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/expose":           read("sandbox_exposures", auth.ScopeRead, gate.ObjectSandbox),
	"DELETE /v1/sandboxes/{id}/expose/{port}": act("sandbox_unexpose", auth.ScopeOperate, gate.ObjectExpose),
	// images
	"GET /v1/images":                 read("image_list", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/images/inspect":         read("image_inspect", auth.ScopeRead, gate.ObjectImage),
	"POST /v1/images/pull":           act("image_pull", auth.ScopeOperate, gate.ObjectNone),
	"DELETE /v1/images":              act("image_remove", auth.ScopeOperate, gate.ObjectImage),
	"POST /v1/images/prune":          act("image_prune", auth.ScopeOperate, gate.ObjectNone),
	"POST /v1/images/import":         stream("image_import", auth.ScopeOperate, gate.ObjectNone),
	"POST /v1/images/push":           act("image_push", auth.ScopeOperate, gate.ObjectImage),
	"POST /v1/sandboxes/{id}/commit": act("sandbox_commit", auth.ScopeOperate, gate.ObjectSandbox),
	// snapshots, fork, sleep, wake, diff
	"POST /v1/sandboxes/{id}/snapshots":  act("sandbox_snapshot", auth.ScopeOperate, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/snapshots":   read("snapshot_list", auth.ScopeRead, gate.ObjectSandbox),
	"GET /v1/snapshots":                  read("snapshot_list", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/snapshots/{snapshot_id}":    read("snapshot_get", auth.ScopeRead, gate.ObjectSnapshot),
	"DELETE /v1/snapshots/{snapshot_id}": act("snapshot_delete", auth.ScopeOperate, gate.ObjectSnapshot),
	"POST /v1/sandboxes/{id}/fork":       act("sandbox_fork", auth.ScopeOperate, gate.ObjectSandbox),
	"POST /v1/sandboxes/{id}/sleep":      act("sandbox_sleep", auth.ScopeOperate, gate.ObjectSandbox),
	"POST /v1/sandboxes/{id}/wake":       act("sandbox_wake", auth.ScopeOperate, gate.ObjectSandbox),
	"GET /v1/sandboxes/{id}/diff":        read("sandbox_diff", auth.ScopeRead, gate.ObjectSandbox),
	"POST /v1/sandboxes/{id}/diff":       read("sandbox_diff", auth.ScopeRead, gate.ObjectSandbox), // the same read, with a body
	// warm pools: setting one reserves server capacity
	"GET /v1/pools":           read("pool_list", auth.ScopeRead, gate.ObjectNone),
	"PUT /v1/pools/{name}":    act("pool_set", auth.ScopeAdmin, gate.ObjectPool),
	"POST /v1/pools/{name}":   act("pool_set", auth.ScopeAdmin, gate.ObjectPool),
	"DELETE /v1/pools/{name}": act("pool_delete", auth.ScopeAdmin, gate.ObjectPool),
	// durable runs and batches
	"POST /v1/runs":                     act("run", auth.ScopeOperate, gate.ObjectNone),
	"GET /v1/runs":                      read("run_list", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/runs/{id}":                 read("run_get", auth.ScopeRead, gate.ObjectRun),
	"POST /v1/runs/{id}/cancel":         act("run_cancel", auth.ScopeOperate, gate.ObjectRun),
	"GET /v1/runs/{id}/events":          read("run_events", auth.ScopeRead, gate.ObjectRun),
	"GET /v1/runs/{id}/logs":            read("run_logs", auth.ScopeRead, gate.ObjectRun),
	"/v1/runs/{id}/artifacts/{path...}": read("run_artifact", auth.Public, gate.ObjectRun), // a signed URL, or the caller's key (checked by the handler)
	"POST /v1/batches":                  act("run_batch", auth.ScopeOperate, gate.ObjectNone),
	"POST /v1/batches/matrix":           act("run_matrix", auth.ScopeOperate, gate.ObjectNone),
	"POST /v1/batches/agent-compare":    act("agent_compare", auth.ScopeOperate, gate.ObjectNone),
	"POST /v1/batches/agent-test":       act("agent_test", auth.ScopeOperate, gate.ObjectNone),
	"GET /v1/batches":                   read("batch_list", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/batches/{id}":              read("batch_get", auth.ScopeRead, gate.ObjectBatch),
	"POST /v1/batches/{id}/cancel":      act("batch_cancel", auth.ScopeOperate, gate.ObjectBatch),
	// API keys, the audit log, approvals, SQL: the operator's
	"POST /v1/keys":                   act("key_create", auth.ScopeAdmin, gate.ObjectNone),
	"GET /v1/keys":                    read("key_list", auth.ScopeAdmin, gate.ObjectNone),
	"DELETE /v1/keys/{ref}":           act("key_revoke", auth.ScopeAdmin, gate.ObjectKey),
	"GET /v1/audit":                   read("audit_list", auth.ScopeAdmin, gate.ObjectNone),      // every caller's calls
	"GET /v1/approvals":               read("approval_list", auth.ScopeRead, gate.ObjectNone),    // a key's own principal's (authz.ListOwner)
	"GET /v1/approvals/policy":        read("approval_policy", auth.ScopeRead, gate.ObjectNone),  // what waits, and whether this key may decide
	"GET /v1/approvals/{id}":          read("approval_get", auth.ScopeRead, gate.ObjectApproval), // another principal's: 404
	"POST /v1/approvals/{id}/approve": act("approval_approve", auth.ScopeAdmin, gate.ObjectApproval),
	"POST /v1/approvals/{id}/deny":    act("approval_deny", auth.ScopeAdmin, gate.ObjectApproval),
	"POST /v1/sql":                    read("execute_sql", auth.ScopeAdmin, gate.ObjectNone), // the views show every caller's calls and sandboxes
	// data-assistant tools
	"POST /v1/run_python": act("run_python", auth.ScopeOperate, gate.ObjectNone),
	"POST /v1/run_shell":  act("run_shell", auth.ScopeOperate, gate.ObjectNone),
	// joined machines: join and connect check their own credential (a join token, the
	// machine's key); running on a machine operates it, and its screen may show anything
	"POST /v1/machines/join":                       {Action: "machine_join", Scope: auth.Public, Body: BodySecret},
	"GET /v1/machines/connect":                     read("machine_connect", auth.Public, gate.ObjectNone),
	"GET /v1/machines":                             read("machine_list", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/machines/{ref}":                       read("machine_status", auth.ScopeRead, gate.ObjectMachine),
	"GET /v1/machines/{ref}/agent":                 read("machine_probe", auth.ScopeRead, gate.ObjectMachine),
	"DELETE /v1/machines/{ref}":                    act("machine_remove", auth.ScopeAdmin, gate.ObjectMachine),
	"POST /v1/machines/{ref}/aliases":              act("machine_alias_add", auth.ScopeAdmin, gate.ObjectMachine),
	"DELETE /v1/machines/{ref}/aliases/{alias}":    act("machine_alias_remove", auth.ScopeAdmin, gate.ObjectMachine),
	"POST /v1/machines/tokens":                     act("join_token_create", auth.ScopeAdmin, gate.ObjectNone),
	"GET /v1/machines/tokens":                      read("join_token_list", auth.ScopeAdmin, gate.ObjectNone),
	"DELETE /v1/machines/tokens/{ref}":             act("join_token_revoke", auth.ScopeAdmin, gate.ObjectNone),
	"POST /v1/machines/{ref}/exec":                 act("remote_exec", auth.ScopeOperate, gate.ObjectMachine),
	"GET /v1/machines/{ref}/screenshot":            read("remote_screenshot", auth.ScopeOperate, gate.ObjectMachine),
	"POST /v1/machines/{ref}/jobs":                 act("remote_job_start", auth.ScopeOperate, gate.ObjectMachine),
	"GET /v1/machines/{ref}/jobs":                  read("remote_job_list", auth.ScopeRead, gate.ObjectMachine),
	"GET /v1/machines/{ref}/jobs/{job_id}":         read("remote_job_status", auth.ScopeRead, gate.ObjectMachine),
	"GET /v1/machines/{ref}/jobs/{job_id}/logs":    read("remote_job_logs", auth.ScopeRead, gate.ObjectMachine),
	"POST /v1/machines/{ref}/jobs/{job_id}/cancel": act("remote_job_cancel", auth.ScopeOperate, gate.ObjectMachine),
	// the file relay (blobs are checked against their owner by the handler)
	"POST /v1/machines/{ref}/pull": act("remote_pull", auth.ScopeOperate, gate.ObjectMachine),
	"POST /v1/machines/{ref}/push": act("remote_push", auth.ScopeOperate, gate.ObjectMachine),
	"POST /v1/blobs":               stream("blob_upload", auth.ScopeOperate, gate.ObjectNone),
	"GET /v1/blobs/{id}":           read("blob_download", auth.Public, gate.ObjectBlob), // a signed link, or the owner's key (checked by the handler)
	"DELETE /v1/blobs/{id}":        act("blob_delete", auth.ScopeOperate, gate.ObjectBlob),
	// conversations of agentbox chat: the chat process records its own conversation as it
	// goes (create, messages, its sandbox); that bookkeeping acts on nothing but the caller's
	// own record, so approvals never hold it up (ReadOnly), while deleting one is an action
	"GET /v1/conversations":                read("conversation_list", auth.ScopeRead, gate.ObjectNone),
	"GET /v1/conversations/{id}":           read("conversation_get", auth.ScopeRead, gate.ObjectConversation),
	"POST /v1/conversations":               {Action: "conversation_create", Scope: auth.ScopeOperate, Object: gate.ObjectNone, ReadOnly: true},
	"PATCH /v1/conversations/{id}":         {Action: "conversation_update", Scope: auth.ScopeOperate, Object: gate.ObjectConversation, ReadOnly: true},
	"POST /v1/conversations/{id}/messages": {Action: "conversation_append", Scope: auth.ScopeOperate, Object: gate.ObjectConversation, ReadOnly: true},
	"DELETE /v1/conversations/{id}":        act("conversation_delete", auth.ScopeOperate, gate.ObjectConversation),
}

func read(action, scope, object string) Route {
	return Route{Action: action, Scope: scope, Object: object, ReadOnly: true}
}

func act(action, scope, object string) Route {
	return Route{Action: action, Scope: scope, Object: object}
}

func stream(action, scope, object string) Route {
	return Route{Action: action, Scope: scope, Object: object, Body: BodyStream}
}

// RouteTable returns every route's declaration, by pattern.
func RouteTable() map[string]Route { return maps.Clone(routeTable) }

// objectOf is the object a request to a route of kind names, from its path values.
func objectOf(kind string, pathValue func(string) string) gate.Object {
	o := gate.Object{Kind: kind}
	switch kind {
	case gate.ObjectNone:
	case gate.ObjectSnapshot:
		o.ID = pathValue("snapshot_id")
	case gate.ObjectKey, gate.ObjectMachine:
		o.ID = pathValue("ref")
	case gate.ObjectPool:
		o.ID = pathValue("name")
	case gate.ObjectImage:
	default: // sandbox, job and expose (by their sandbox), run, batch, approval, blob
		o.ID = pathValue("id")
	}
	return o
}
