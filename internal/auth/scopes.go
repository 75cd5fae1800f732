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

// Required is the scope each MCP tool needs, by gate.Call.Tool. read: gets, lists, logs,
// events, metrics, health; operate: everything that creates, executes, writes or deletes
// sandboxes, jobs, runs and images; admin: keys, approval decisions, server-level
// operations. A tool not here needs admin (a new tool without an entry fails
// TestScopeTableCoversEveryTool). REST routes declare theirs in the route table
// (internal/api/routetable.go), which the REST surface puts on gate.Call.Scope.
var Required = map[string]string{
	// MCP tools.
	"health": ScopeRead,
	// api_call's inner request passes the REST gate with the same caller (its route's scope).
	"api_call": ScopeRead,
	// execute_sql's views show every caller's audit records and every owner's sandboxes.
	"execute_sql": ScopeAdmin,
	// run_python and run_shell create sandboxes and run code; fetch_metrics reads.
	"run_python": ScopeOperate, "run_shell": ScopeOperate, "fetch_metrics": ScopeRead,
	// run_code and code_context_create run code in a sandbox's interpreter.
	"run_code": ScopeOperate, "code_context_create": ScopeOperate,
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

	// Warm pools: setting one reserves server capacity, so it is admin.
	"pool_list": ScopeRead, "pool_set": ScopeAdmin, "pool_delete": ScopeAdmin,
	// Joined machines: join and connect check their own credential (a join token,
	// the machine's key); reading the registry is read; removing machines, aliases and join
	// tokens are admin.
	"machine_list": ScopeRead, "machine_status": ScopeRead,
	// Remote jobs: starting or canceling one runs or stops code on a joined machine.
	"remote_job_start": ScopeOperate, "remote_job_cancel": ScopeOperate,
	"remote_job_list": ScopeRead, "remote_job_status": ScopeRead, "remote_job_logs": ScopeRead,
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
	if err := CheckScope(c); err != nil {
		return nil, err
	}
	return func(error) {}, nil
}

// NeededScope is the scope c needs: the one its surface declared (a REST route's), else its
// tool's entry in Required; a REST call that declares none needs admin.
func NeededScope(c *gate.Call) string {
	switch {
	case c.Scope != "":
		return c.Scope
	case c.Surface == gate.SurfaceREST:
		return ScopeAdmin
	}
	return RequiredScope(c.Tool)
}

// CheckScope refuses c when its caller's scope does not cover NeededScope(c).
func CheckScope(c *gate.Call) error {
	need := NeededScope(c)
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
		return errcode.New(errcode.PermissionDenied, "%s needs scope %s; %s has scope %s (create a key with `agentbox token create NAME --scope %s`)",
			c.Tool, need, who, have, need).With("required_scope", need).With("scope", have)
	}
	return nil
}
