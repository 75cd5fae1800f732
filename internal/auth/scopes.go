package auth

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
)

// Public marks a route that needs no scope: it answers without a key (GET /health) or checks
// its own credential (a run artifact's signed URL).
const Public = "public"

// Required is the scope each call needs, by gate.Call.Tool: MCP tool names and REST route
// patterns. read: gets, lists, logs, events, metrics, health; operate: everything that
// creates, executes, writes or deletes sandboxes, jobs, runs and images; admin: keys,
// approval decisions, server-level operations. A call whose tool is not here needs admin (a
// new route or tool without an entry fails TestScopeTableCoversEveryTool and
// TestScopeTableCoversEveryRoute).
var Required = map[string]string{
	// MCP tools.
	"health": ScopeRead,
	// api_call's inner request passes the REST gate with the same caller (its route's scope).
	"api_call": ScopeRead,
	// execute_sql's views show every caller's audit records and every owner's sandboxes.
	"execute_sql": ScopeAdmin,
	// run_python and run_shell create sandboxes and run code; fetch_metrics reads.
	"run_python": ScopeOperate, "run_shell": ScopeOperate, "fetch_metrics": ScopeRead,
	"sandbox_list": ScopeRead, "sandbox_get": ScopeRead, "sandbox_metrics": ScopeRead,
	"sandbox_connections": ScopeRead, "sandbox_secret_calls": ScopeRead,
	"file_read": ScopeRead, "file_list": ScopeRead,
	"job_list": ScopeRead, "job_status": ScopeRead, "job_logs": ScopeRead, "job_wait": ScopeRead,
	"image_list": ScopeRead, "watch": ScopeRead, "watch_fleet": ScopeRead,
	"run_get": ScopeRead, "run_list": ScopeRead, "run_events": ScopeRead, "run_logs": ScopeRead,
	"run_artifact": ScopeRead, "batch_get": ScopeRead,
	"sandbox_create": ScopeOperate, "sandbox_destroy": ScopeOperate, "sandbox_extend": ScopeOperate,
	"exec": ScopeOperate, "file_write": ScopeOperate,
	"job_start": ScopeOperate, "job_cancel": ScopeOperate,
	"sandbox_network_update": ScopeOperate, "sandbox_expose": ScopeOperate, "sandbox_unexpose": ScopeOperate,
	"sandbox_commit": ScopeOperate, "image_pull": ScopeOperate,
	"run": ScopeOperate, "run_cancel": ScopeOperate, "run_batch": ScopeOperate, "run_matrix": ScopeOperate,
	"agent_compare": ScopeOperate, "agent_test": ScopeOperate,
	// snapshots, fork, sleep, wake, diff: reads list and compare; the rest write
	"snapshot_list": ScopeRead, "sandbox_diff": ScopeRead,
	"sandbox_snapshot": ScopeOperate, "snapshot_delete": ScopeOperate, "sandbox_fork": ScopeOperate,
	"sandbox_sleep": ScopeOperate, "sandbox_wake": ScopeOperate,
	// the file relay: moving files to and from joined machines writes
	"remote_pull": ScopeOperate, "remote_push": ScopeOperate,
	// joined machines: running on a machine operates it; its screen may show
	// anything, so a screenshot needs operate too
	"remote_exec": ScopeOperate, "remote_screenshot": ScopeOperate,

	// REST routes.
	"GET /health":                                  Public,
	"/v1/runs/{id}/artifacts/{path...}":            Public, // a signed URL, or the caller's key (checked by the handler)
	"GET /v1/blobs/{id}":                           Public, // a signed link, or the owner's key (checked by the handler)
	"POST /v1/blobs":                               ScopeOperate,
	"DELETE /v1/blobs/{id}":                        ScopeOperate,
	"POST /v1/machines/{ref}/pull":                 ScopeOperate,
	"POST /v1/machines/{ref}/push":                 ScopeOperate,
	"/v1/":                                         ScopeRead, // the "no such endpoint" answer
	"GET /metrics":                                 ScopeRead,
	"GET /v1/sandboxes":                            ScopeRead,
	"GET /v1/sandboxes/{id}":                       ScopeRead,
	"GET /v1/sandboxes/{id}/files":                 ScopeRead,
	"GET /v1/sandboxes/{id}/files/stat":            ScopeRead,
	"GET /v1/sandboxes/{id}/files/list":            ScopeRead,
	"GET /v1/sandboxes/{id}/events":                ScopeRead,
	"GET /v1/sandboxes/{id}/jobs":                  ScopeRead,
	"GET /v1/sandboxes/{id}/jobs/{job_id}":         ScopeRead,
	"GET /v1/sandboxes/{id}/jobs/{job_id}/logs":    ScopeRead,
	"GET /v1/sandboxes/{id}/jobs/{job_id}/wait":    ScopeRead,
	"GET /v1/events":                               ScopeRead,
	"GET /v1/sandboxes/{id}/watch":                 ScopeRead,
	"GET /v1/capacity":                             ScopeRead,
	"GET /v1/openapi.json":                         ScopeRead,
	"GET /v1/runtimes":                             ScopeRead,
	"GET /v1/sandboxes/{id}/metrics":               ScopeRead,
	"GET /v1/fleet/metrics":                        ScopeRead,
	"GET /v1/sandboxes/{id}/connections":           ScopeRead,
	"GET /v1/sandboxes/{id}/secret-calls":          ScopeRead,
	"GET /v1/sandboxes/{id}/expose":                ScopeRead,
	"GET /v1/images":                               ScopeRead,
	"GET /v1/images/inspect":                       ScopeRead,
	"POST /v1/machines/{ref}/exec":                 ScopeOperate, // remote_exec
	"GET /v1/machines/{ref}/screenshot":            ScopeOperate, // remote_screenshot: the screen may show anything
	"GET /v1/runs":                                 ScopeRead,
	"GET /v1/runs/{id}":                            ScopeRead,
	"GET /v1/runs/{id}/events":                     ScopeRead,
	"GET /v1/runs/{id}/logs":                       ScopeRead,
	"GET /v1/batches":                              ScopeRead,
	"GET /v1/batches/{id}":                         ScopeRead,
	"POST /v1/sandboxes":                           ScopeOperate,
	"DELETE /v1/sandboxes/{id}":                    ScopeOperate,
	"POST /v1/sandboxes/{id}/extend":               ScopeOperate,
	"POST /v1/sandboxes/{id}/exec":                 ScopeOperate,
	"PUT /v1/sandboxes/{id}/files":                 ScopeOperate,
	"DELETE /v1/sandboxes/{id}/files":              ScopeOperate,
	"POST /v1/sandboxes/{id}/files/mkdir":          ScopeOperate,
	"POST /v1/sandboxes/{id}/jobs":                 ScopeOperate,
	"POST /v1/sandboxes/{id}/jobs/{job_id}/cancel": ScopeOperate,
	"GET /v1/sandboxes/{id}/pty":                   ScopeOperate, // an interactive shell
	"PATCH /v1/sandboxes/{id}/network":             ScopeOperate,
	"POST /v1/sandboxes/{id}/expose":               ScopeOperate,
	"DELETE /v1/sandboxes/{id}/expose/{port}":      ScopeOperate,
	"POST /v1/images/pull":                         ScopeOperate,
	"DELETE /v1/images":                            ScopeOperate,
	"POST /v1/images/prune":                        ScopeOperate,
	"POST /v1/images/import":                       ScopeOperate,
	"POST /v1/images/push":                         ScopeOperate,
	"POST /v1/sandboxes/{id}/commit":               ScopeOperate,
	"POST /v1/runs":                                ScopeOperate,
	"POST /v1/runs/{id}/cancel":                    ScopeOperate,
	"POST /v1/batches":                             ScopeOperate,
	"POST /v1/batches/matrix":                      ScopeOperate,
	"POST /v1/batches/agent-compare":               ScopeOperate,
	"POST /v1/batches/agent-test":                  ScopeOperate,
	"POST /v1/batches/{id}/cancel":                 ScopeOperate,
	"POST /v1/keys":                                ScopeAdmin,
	"GET /v1/keys":                                 ScopeAdmin,
	"GET /v1/audit":                                ScopeAdmin, // every caller's calls
	"POST /v1/run_python":                          ScopeOperate,
	"POST /v1/run_shell":                           ScopeOperate,
	"GET /v1/approvals":                            ScopeAdmin, // the operator's queue
	"GET /v1/approvals/{id}":                       ScopeAdmin,
	"POST /v1/approvals/{id}/approve":              ScopeAdmin,
	"POST /v1/approvals/{id}/deny":                 ScopeAdmin,
	"POST /v1/sql":                                 ScopeAdmin, // the views show every caller's calls and sandboxes
	"DELETE /v1/keys/{ref}":                        ScopeAdmin,
	// snapshots, fork, sleep, wake, diff
	"GET /v1/sandboxes/{id}/snapshots":   ScopeRead,
	"GET /v1/snapshots":                  ScopeRead,
	"GET /v1/snapshots/{snapshot_id}":    ScopeRead,
	"GET /v1/sandboxes/{id}/diff":        ScopeRead,
	"POST /v1/sandboxes/{id}/diff":       ScopeRead, // the same read, with a body
	"POST /v1/sandboxes/{id}/snapshots":  ScopeOperate,
	"DELETE /v1/snapshots/{snapshot_id}": ScopeOperate,
	"POST /v1/sandboxes/{id}/fork":       ScopeOperate,
	"POST /v1/sandboxes/{id}/sleep":      ScopeOperate,
	"POST /v1/sandboxes/{id}/wake":       ScopeOperate,
	// Warm pools: setting one reserves server capacity, so it is admin.
	"pool_list": ScopeRead, "pool_set": ScopeAdmin, "pool_delete": ScopeAdmin,
	"GET /v1/pools":           ScopeRead,
	"PUT /v1/pools/{name}":    ScopeAdmin,
	"POST /v1/pools/{name}":   ScopeAdmin,
	"DELETE /v1/pools/{name}": ScopeAdmin,
	// Joined machines: join and connect check their own credential (a join token,
	// the machine's key); reading the registry is read; removing machines, aliases and join
	// tokens are admin.
	"machine_list": ScopeRead, "machine_status": ScopeRead,
	"POST /v1/machines/join":                    Public,
	"GET /v1/machines/connect":                  Public,
	"GET /v1/machines":                          ScopeRead,
	"GET /v1/machines/{ref}":                    ScopeRead,
	"GET /v1/machines/{ref}/agent":              ScopeRead, // asks the machine's agent over its session
	"DELETE /v1/machines/{ref}":                 ScopeAdmin,
	"POST /v1/machines/{ref}/aliases":           ScopeAdmin,
	"DELETE /v1/machines/{ref}/aliases/{alias}": ScopeAdmin,
	"POST /v1/machines/tokens":                  ScopeAdmin,
	"GET /v1/machines/tokens":                   ScopeAdmin,
	"DELETE /v1/machines/tokens/{ref}":          ScopeAdmin,
	// Remote jobs: starting or canceling one runs or stops code on a joined machine.
	"remote_job_start": ScopeOperate, "remote_job_cancel": ScopeOperate,
	"remote_job_list": ScopeRead, "remote_job_status": ScopeRead, "remote_job_logs": ScopeRead,
	"POST /v1/machines/{ref}/jobs":                 ScopeOperate,
	"GET /v1/machines/{ref}/jobs":                  ScopeRead,
	"GET /v1/machines/{ref}/jobs/{job_id}":         ScopeRead,
	"GET /v1/machines/{ref}/jobs/{job_id}/logs":    ScopeRead,
	"POST /v1/machines/{ref}/jobs/{job_id}/cancel": ScopeOperate,
}

// RequiredScope is the scope a call of tool needs: its entry in Required, else admin.
func RequiredScope(tool string) string {
	if s, ok := Required[tool]; ok {
		return s
	}
	return ScopeAdmin
}

// ScopeGate refuses a call its caller's scope does not cover (PERMISSION_DENIED, naming both
// scopes). It is a gate.Gate: in the server's chain after the audit gate (so refusals are
// recorded) and before approvals (so nobody is asked to approve a call that would be refused).
type ScopeGate struct{}

var _ gate.Gate = ScopeGate{}

// Enter implements gate.Gate.
func (ScopeGate) Enter(ctx context.Context, c *gate.Call) (func(error), error) {
	need := RequiredScope(c.Tool)
	if !Covers(c.Caller.Scope, need) {
		who := c.Caller.Name
		if who == "" {
			who = "an unauthenticated caller"
		} else {
			who = fmt.Sprintf("key %q", who)
		}
		have := c.Caller.Scope
		if have == "" {
			have = "none"
		}
		return nil, errcode.New(errcode.PermissionDenied, "%s needs scope %s; %s has scope %s (create a key with `agentbox token create NAME --scope %s`)",
			c.Tool, need, who, have, need).With("required_scope", need).With("scope", have)
	}
	return func(error) {}, nil
}
