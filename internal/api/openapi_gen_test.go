package api

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/lease"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/openapi"
	"github.com/agentbox/agentbox/internal/remotejobs"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/snippet"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/wire"
)

// The OpenAPI document (internal/openapi/openapi.json) is generated here from the Go types of
// the requests and replies: `go generate ./internal/api` (go test -run ^TestOpenAPIDocument$
// -update-openapi) writes it; TestOpenAPIDocument fails when the committed file differs. Only
// what the types cannot say is written by hand below: each route's summary, query parameters,
// status and content types.

var updateOpenAPI = flag.Bool("update-openapi", false, "write internal/openapi/openapi.json")

const openAPIFile = "../openapi/openapi.json"

// healthReply is the reply of GET /health.
type healthReply struct {
	Status  string `json:"status"`
	Version string `json:"version"`
	// Replica is this server process (several replicas on one store).
	Replica *lease.Status `json:"replica,omitempty"`
}

// qp is a query parameter.
type qp struct {
	name, typ, desc string
	array           bool
}

// op describes one route for the document.
type op struct {
	pattern string // as the mux registers it (a pattern without method: method is set)
	method  string
	summary string
	tag     string
	query   []qp
	// req is the JSON request body's Go value (nil: none); reqType a non-JSON body's media type.
	req         any
	reqOptional bool
	reqType     string
	status      int
	resp        any    // the JSON reply's Go value (nil: none or non-JSON)
	respType    string // a non-JSON reply's media type
	ndjson      any    // the line of the NDJSON alternative (Accept: application/x-ndjson or ?stream=true)
}

func ops() []op {
	path := qp{"path", "string", "The absolute path inside the sandbox.", false}
	limit := func(d string) qp { return qp{"limit", "integer", d, false} }
	after := qp{"after", "integer", "Only records with a sequence number above this.", false}
	return []op{
		{pattern: "GET /health", summary: "Liveness (no token needed)", tag: "server", status: 200, resp: healthReply{}},
		{pattern: "GET /metrics", summary: "Prometheus metrics (text exposition format; served when the server counts metrics)", tag: "server", status: 200, respType: "text/plain"},
		{pattern: "GET /v1/openapi.json", summary: "This document", tag: "server", status: 200, respType: "application/json"},
		{pattern: "GET /v1/capacity", summary: "The server's capacity: budgets, use and what one more sandbox may take", tag: "server", status: 200, resp: wire.Capacity{}},
		{pattern: "GET /v1/runtimes", summary: "The runtimes this server offers and the default", tag: "server", status: 200, resp: wire.RuntimeList{}},
		{pattern: "GET /v1/fleet/metrics", summary: "Resource use of every running sandbox", tag: "metrics", status: 200, resp: sandbox.FleetMetrics{}},
		{pattern: "GET /v1/events", summary: "The event log, oldest first", tag: "events", status: 200, resp: EventList{},
			query: []qp{after, limit("At most this many events (bounded by the server)."), {"wait", "string", "Long-poll up to this Go duration (e.g. 30s) for an event after `after`.", false}, {"sandbox_id", "string", "Only this sandbox's events.", false}}},

		{pattern: "POST /v1/sandboxes", summary: "Create a sandbox", tag: "sandboxes", req: sandbox.CreateRequest{}, status: 201, resp: wire.Sandbox{}, ndjson: ImageFrame{}},
		{pattern: "GET /v1/sandboxes", summary: "List sandboxes", tag: "sandboxes", status: 200, resp: SandboxList{},
			query: []qp{{"state", "string", "Only these states (comma-separated, repeatable).", true}, {"label", "string", "Only sandboxes with this label (key=value, repeatable).", true}, limit("At most this many sandboxes.")}},
		{pattern: "GET /v1/sandboxes/{id}", summary: "Get a sandbox", tag: "sandboxes", status: 200, resp: wire.Sandbox{}},
		{pattern: "DELETE /v1/sandboxes/{id}", summary: "Destroy a sandbox", tag: "sandboxes", status: 200, resp: wire.Sandbox{}},
		{pattern: "POST /v1/sandboxes/{id}/extend", summary: "Push a sandbox's expiry further", tag: "sandboxes", req: ExtendRequest{}, status: 200, resp: wire.Sandbox{}},
		{pattern: "GET /v1/sandboxes/{id}/events", summary: "One sandbox's events", tag: "events", status: 200, resp: EventList{},
			query: []qp{after, limit("At most this many events (bounded by the server)."), {"wait", "string", "Long-poll up to this Go duration for an event after `after`.", false}}},
		{pattern: "GET /v1/sandboxes/{id}/watch", summary: "Stream a sandbox's events, metrics, job output and connections (Server-Sent Events)", tag: "events", status: 200, respType: "text/event-stream",
			query: []qp{{"stream", "string", "What to stream.", false}, {"job_id", "string", "The job whose output to stream.", false}, {"duration_seconds", "integer", "End the stream after this long.", false}, {"interval_seconds", "integer", "Seconds between metric samples.", false}, {"last_event_id", "string", "Resume after this event id (as the Last-Event-ID header).", false}}},
		{pattern: "GET /v1/sandboxes/{id}/pty", summary: "An interactive terminal (WebSocket upgrade)", tag: "exec", status: 101,
			query: []qp{{"arg", "string", "The command's argv (repeatable; default a login shell).", true}, {"env", "string", "NAME=value (repeatable).", true}, {"user", "string", "Run as this user.", false}, {"term", "string", "TERM.", false}, {"cwd", "string", "Working directory.", false}}},

		{pattern: "POST /v1/sandboxes/{id}/exec", summary: "Run a command (never through a shell); with background: true, start it as a job", tag: "exec", req: ExecRequest{}, status: 200, resp: sandbox.ExecResult{}, ndjson: ExecFrame{},
			query: []qp{{"stream", "boolean", "true: NDJSON ExecFrame lines as output happens, then the result.", false}}},
		{pattern: "PUT /v1/sandboxes/{id}/files", summary: "Write a file (the body is its content)", tag: "files", reqType: "application/octet-stream", status: 200, resp: sandbox.FileInfo{},
			query: []qp{path, {"mode", "string", "Permission bits in octal (default 0644).", false}}},
		{pattern: "GET /v1/sandboxes/{id}/files", summary: "Read a file (a byte range)", tag: "files", status: 200, respType: "application/octet-stream",
			query: []qp{path, {"offset", "integer", "First byte.", false}, {"length", "integer", "Bytes to read (0: to the end).", false}}},
		{pattern: "DELETE /v1/sandboxes/{id}/files", summary: "Remove a file or directory", tag: "files", status: 204,
			query: []qp{path, {"recursive", "boolean", "Remove a directory and its contents.", false}}},
		{pattern: "GET /v1/sandboxes/{id}/files/stat", summary: "Stat a file", tag: "files", status: 200, resp: sandbox.FileInfo{}, query: []qp{path}},
		{pattern: "GET /v1/sandboxes/{id}/files/list", summary: "List a directory (bounded)", tag: "files", status: 200, resp: sandbox.DirList{}, query: []qp{path}},
		{pattern: "POST /v1/sandboxes/{id}/files/mkdir", summary: "Make a directory", tag: "files", req: sandbox.MkdirRequest{}, status: 200, resp: sandbox.FileInfo{}},

		{pattern: "POST /v1/sandboxes/{id}/jobs", summary: "Start a detached job", tag: "jobs", req: ExecRequest{}, status: 201, resp: wire.Job{}},
		{pattern: "GET /v1/sandboxes/{id}/jobs", summary: "List a sandbox's jobs", tag: "jobs", status: 200, resp: wire.JobList{}, query: []qp{limit("At most this many jobs.")}},
		{pattern: "GET /v1/sandboxes/{id}/jobs/{job_id}", summary: "Get a job", tag: "jobs", status: 200, resp: wire.Job{}},
		{pattern: "GET /v1/sandboxes/{id}/jobs/{job_id}/logs", summary: "A job's output (a bounded window)", tag: "jobs", status: 200, resp: sandbox.JobLogs{},
			query: []qp{{"stream", "string", "stdout or stderr.", false}, {"offset", "integer", "First byte.", false}, {"max_bytes", "integer", "At most this many bytes.", false}, {"tail_lines", "integer", "Only the last lines.", false}}},
		{pattern: "GET /v1/sandboxes/{id}/jobs/{job_id}/wait", summary: "Wait for a job to end (bounded)", tag: "jobs", status: 200, resp: wire.Job{},
			query: []qp{{"timeout_seconds", "integer", "Wait at most this long.", false}}},
		{pattern: "POST /v1/sandboxes/{id}/jobs/{job_id}/cancel", summary: "Cancel a job", tag: "jobs", req: JobCancelRequest{}, reqOptional: true, status: 200, resp: wire.Job{}},

		{pattern: "GET /v1/sandboxes/{id}/metrics", summary: "A sandbox's resource use", tag: "metrics", status: 200, resp: sandbox.SandboxMetrics{}},

		{pattern: "PATCH /v1/sandboxes/{id}/network", summary: "Change a sandbox's egress policy live", tag: "network", req: NetworkUpdate{}, status: 200, resp: wire.Sandbox{}},
		{pattern: "GET /v1/sandboxes/{id}/connections", summary: "The sandbox's egress connections", tag: "network", status: 200, resp: wire.ConnectionList{}, query: []qp{after, limit("At most this many records.")}},
		{pattern: "GET /v1/sandboxes/{id}/secret-calls", summary: "Requests that had a secret swapped in", tag: "network", status: 200, resp: wire.SecretCallList{}, query: []qp{after, limit("At most this many records.")}},
		{pattern: "POST /v1/sandboxes/{id}/expose", summary: "Expose a port as a preview URL", tag: "network", req: ExposeRequest{}, status: 201, resp: wire.Exposure{}},
		{pattern: "GET /v1/sandboxes/{id}/expose", summary: "A sandbox's exposed ports", tag: "network", status: 200, resp: ExposureList{}},
		{pattern: "DELETE /v1/sandboxes/{id}/expose/{port}", summary: "Stop exposing a port", tag: "network", status: 200, resp: Unexposed{}},

		{pattern: "GET /v1/images", summary: "The image cache", tag: "images", status: 200, resp: ImageList{}},
		{pattern: "GET /v1/images/inspect", summary: "One cached image", tag: "images", status: 200, resp: image.Image{}, query: []qp{{"ref", "string", "A reference or digest.", false}}},
		{pattern: "POST /v1/images/pull", summary: "Pull an image into the cache", tag: "images", req: PullRequest{}, status: 200, resp: image.Image{}, ndjson: ImageFrame{}},
		{pattern: "DELETE /v1/images", summary: "Remove a cached image", tag: "images", status: 200, resp: RemoveResult{},
			query: []qp{{"ref", "string", "A reference or digest.", false}, {"force", "boolean", "Remove even when tagged more than once.", false}}},
		{pattern: "POST /v1/images/prune", summary: "Remove images no live sandbox uses", tag: "images", req: PruneRequest{}, reqOptional: true, status: 200, resp: image.PruneReport{}},
		{pattern: "POST /v1/images/import", summary: "Import images from an OCI or docker-save tar", tag: "images", reqType: "application/x-tar", status: 201, resp: ImportResult{}, ndjson: ImageFrame{}},
		{pattern: "POST /v1/images/push", summary: "Push a cached image to a registry", tag: "images", req: PushRequest{}, status: 200, resp: PushResult{}, ndjson: ImageFrame{}},
		{pattern: "POST /v1/sandboxes/{id}/commit", summary: "Commit a sandbox's root as a new image", tag: "images", req: CommitRequest{}, status: 201, resp: image.Image{}},

		{pattern: "POST /v1/sandboxes/{id}/snapshots", summary: "Snapshot a sandbox's files (and memory, with memory: true, where the runtime can)", tag: "snapshots", req: sandbox.SnapshotRequest{}, reqOptional: true, status: 201, resp: wire.Snapshot{}},
		{pattern: "GET /v1/sandboxes/{id}/snapshots", summary: "A sandbox's snapshots, oldest first (paged)", tag: "snapshots", status: 200, resp: SnapshotList{},
			query: []qp{{"cursor", "string", "Continue after this snapshot_id (the previous page's next_cursor).", false}, limit("At most this many snapshots (1–1000, default 100).")}},
		{pattern: "GET /v1/snapshots", summary: "List snapshots, oldest first (paged)", tag: "snapshots", status: 200, resp: SnapshotList{},
			query: []qp{{"sandbox_id", "string", "Only this sandbox's snapshots.", false}, {"cursor", "string", "Continue after this snapshot_id (the previous page's next_cursor).", false}, limit("At most this many snapshots (1–1000, default 100).")}},
		{pattern: "GET /v1/snapshots/{snapshot_id}", summary: "Get a snapshot", tag: "snapshots", status: 200, resp: wire.Snapshot{}},
		{pattern: "DELETE /v1/snapshots/{snapshot_id}", summary: "Delete a snapshot and its files", tag: "snapshots", status: 200, resp: DeletedSnapshot{}},
		{pattern: "POST /v1/sandboxes/{id}/fork", summary: "Fork a sandbox into 1–20 new sandboxes from a snapshot (taken now, or snapshot_id)", tag: "snapshots", req: sandbox.ForkRequest{}, reqOptional: true, status: 201, resp: wire.ForkResult{}},
		{pattern: "POST /v1/sandboxes/{id}/sleep", summary: "Put a sandbox to sleep: snapshot it, release its memory and CPU (state sleeping)", tag: "snapshots", status: 200, resp: wire.Sandbox{}},
		{pattern: "POST /v1/sandboxes/{id}/wake", summary: "Wake a sleeping sandbox under the same id", tag: "snapshots", status: 200, resp: wire.Sandbox{}},
		{pattern: "GET /v1/sandboxes/{id}/diff", summary: "What changed in a sandbox against another sandbox, a snapshot or its image (paged)", tag: "snapshots", status: 200, resp: sandbox.DiffResult{},
			query: []qp{{"other_sandbox_id", "string", "Compare with this sandbox.", false}, {"snapshot_id", "string", "Compare with this snapshot (neither: the sandbox's image).", false},
				{"cursor", "string", "Continue a paged diff (the previous page's next_cursor).", false}, limit("At most this many changes (1–10000, default 1000)."),
				{"max_diff_bytes", "integer", "Bound of the unified diff of text files (1–1048576, default 65536).", false}, {"no_unified", "boolean", "true: leave the unified diff out.", false}}},
		{pattern: "POST /v1/sandboxes/{id}/diff", summary: "The same diff, with its arguments as a JSON body", tag: "snapshots", req: sandbox.DiffRequest{}, reqOptional: true, status: 200, resp: sandbox.DiffResult{}},

		{pattern: "POST /v1/conversations", summary: "Record a new conversation of agentbox chat (the caller's)", tag: "conversations", req: wire.ConversationCreate{}, status: 201, resp: wire.Conversation{}},
		{pattern: "GET /v1/conversations", summary: "The caller's conversations, newest first", tag: "conversations", status: 200, resp: wire.ConversationList{}, query: []qp{limit("At most this many conversations (1–1000, default 50).")}},
		{pattern: "GET /v1/conversations/{id}", summary: "A conversation and its transcript", tag: "conversations", status: 200, resp: wire.ConversationDetail{}},
		{pattern: "PATCH /v1/conversations/{id}", summary: "Set a conversation's sandbox", tag: "conversations", req: wire.ConversationUpdate{}, status: 200, resp: wire.Conversation{}},
		{pattern: "POST /v1/conversations/{id}/messages", summary: "Append messages to a conversation, in order (seq continues it, else CONFLICT)", tag: "conversations", req: wire.ConversationMessages{}, status: 200, resp: wire.Conversation{}},
		{pattern: "DELETE /v1/conversations/{id}", summary: "Delete a conversation and its transcript", tag: "conversations", status: 200, resp: wire.DeletedConversation{}},

		{pattern: "POST /v1/runs", summary: "Start a durable run", tag: "runs", req: RunRequest{}, status: 201, resp: wire.Run{}},
		{pattern: "GET /v1/runs", summary: "List runs, newest first", tag: "runs", status: 200, resp: wire.RunList{},
			query: []qp{{"state", "string", "Only these states (repeatable).", true}, {"batch_id", "string", "Only this batch's runs.", false}, {"before", "string", "Page: runs before this id.", false}, {"label", "string", "key=value (repeatable).", true}, limit("At most this many runs.")}},
		{pattern: "GET /v1/runs/{id}", summary: "Get a run", tag: "runs", status: 200, resp: wire.Run{}},
		{pattern: "POST /v1/runs/{id}/cancel", summary: "Cancel a run", tag: "runs", status: 200, resp: wire.Run{}},
		{pattern: "GET /v1/runs/{id}/events", summary: "A run's events", tag: "runs", status: 200, resp: wire.RunEventList{}, query: []qp{after, limit("At most this many events.")}},
		{pattern: "GET /v1/runs/{id}/logs", summary: "A run's phase output (a bounded window)", tag: "runs", status: 200, resp: runs.Logs{},
			query: []qp{{"phase", "string", "The phase.", false}, {"stream", "string", "stdout or stderr.", false}, {"offset", "integer", "First byte.", false}, {"max_bytes", "integer", "At most this many bytes.", false}}},
		{pattern: "/v1/runs/{id}/artifacts/{path...}", method: "GET", summary: "Download a run's artifact (the token, or the signed URL's expires and sig)", tag: "runs", status: 200, respType: "application/octet-stream",
			query: []qp{{"expires", "integer", "The signed URL's expiry (unix time).", false}, {"sig", "string", "The signed URL's signature.", false}}},
		{pattern: "GET /v1/approvals", summary: "The approval queue (admin; never a file's content)", tag: "governance", status: 200, resp: ApprovalList{},
			query: []qp{{"state", "string", "pending, approved, denied, expired or used.", false}, limit("At most this many approvals.")}},
		{pattern: "GET /v1/approvals/policy", summary: "Which calls wait for a decision, and whether this key may decide them", tag: "governance", status: 200, resp: wire.ApprovalPolicy{}},
		{pattern: "GET /v1/approvals/{id}", summary: "One approval", tag: "governance", status: 200, resp: wire.Approval{}},
		{pattern: "POST /v1/approvals/{id}/approve", summary: "Approve one pending call (admin)", tag: "governance", req: DecisionRequest{}, reqOptional: true, status: 200, resp: wire.Approval{}},
		{pattern: "POST /v1/approvals/{id}/deny", summary: "Deny one pending call with a reason (admin)", tag: "governance", req: DecisionRequest{}, reqOptional: true, status: 200, resp: wire.Approval{}},
		{pattern: "POST /v1/run_python", summary: "Run a Python snippet in a fresh locked-down sandbox (or a given one)", tag: "tools", req: snippet.Request{}, status: 200, resp: snippet.Result{}},
		{pattern: "POST /v1/run_shell", summary: "Run a shell snippet in a fresh locked-down sandbox (or a given one)", tag: "tools", req: snippet.Request{}, status: 200, resp: snippet.Result{}},
		// joined machines (remote.go)
		{pattern: "POST /v1/machines/{ref}/exec", summary: "Run a script on a joined machine (remote_exec); partial: true when cut short", tag: "machines", req: wire.RemoteExecRequest{}, status: 200, resp: wire.RemoteExecResult{}},
		{pattern: "GET /v1/machines/{ref}/screenshot", summary: "A screenshot of a joined machine's display (remote_screenshot), the PNG in base64", tag: "machines",
			query: []qp{{"display", "integer", "The display index (0–999); default the machine's.", false}}, status: 200, resp: ScreenshotReply{}},
		{pattern: "POST /v1/sql", summary: "Read-only SQL over the published views (admin)", tag: "governance", req: SQLRequest{}, status: 200, resp: sqlquery.Result{}},
		{pattern: "GET /v1/audit", summary: "The audit log: every REST and MCP call (admin)", tag: "governance", status: 200, resp: wire.AuditList{},
			query: []qp{after, limit("At most this many records (1–1000, default 100)."), {"tool", "string", "An MCP tool, an action or a route pattern.", false}, {"sandbox_id", "string", "Only this sandbox's calls.", false}}},
		{pattern: "POST /v1/keys", summary: "Create a named API key (admin; the key is in this reply only)", tag: "keys", req: auth.CreateRequest{}, status: 201, resp: wire.CreatedKey{}},
		{pattern: "GET /v1/keys", summary: "List API keys (admin; never the keys)", tag: "keys", status: 200, resp: KeyList{}},
		{pattern: "DELETE /v1/keys/{ref}", summary: "Revoke an API key by id or name (admin)", tag: "keys", status: 200, resp: wire.APIKey{}},
		{pattern: "POST /v1/batches", summary: "Start a batch of runs", tag: "runs", req: BatchStartRequest{}, status: 201, resp: wire.Batch{}},
		{pattern: "POST /v1/batches/matrix", summary: "Start a matrix of runs", tag: "runs", req: MatrixStartRequest{}, status: 201, resp: wire.Batch{}},
		{pattern: "POST /v1/batches/agent-compare", summary: "Compare coding agents on one task", tag: "runs", req: CompareStartRequest{}, status: 201, resp: wire.Batch{}},
		{pattern: "POST /v1/batches/agent-test", summary: "Test a coding agent on tasks", tag: "runs", req: CompareStartRequest{}, status: 201, resp: wire.Batch{}},
		{pattern: "GET /v1/batches", summary: "List batches, newest first", tag: "runs", status: 200, resp: wire.BatchList{}, query: []qp{{"before", "string", "Page: batches before this id.", false}, limit("At most this many batches.")}},
		{pattern: "GET /v1/batches/{id}", summary: "Get a batch", tag: "runs", status: 200, resp: wire.Batch{}},
		{pattern: "POST /v1/batches/{id}/cancel", summary: "Cancel a batch", tag: "runs", status: 200, resp: wire.Batch{}},
		// The file relay (blobs.go).
		{pattern: "POST /v1/machines/{ref}/pull", summary: "Copy a regular file from a joined machine into a blob (remote_pull)", tag: "machines", req: RemotePullRequest{}, status: 200, resp: wire.Blob{}},
		{pattern: "POST /v1/machines/{ref}/push", summary: "Write a blob to a joined machine atomically (remote_push)", tag: "machines", req: RemotePushRequest{}, status: 200, resp: wire.BlobPush{}},
		{pattern: "POST /v1/blobs", summary: "Upload a blob (the body is its content)", tag: "machines", reqType: "application/octet-stream", status: 201, resp: wire.Blob{},
			query: []qp{{"name", "string", "The file name offered on download.", false}}},
		{pattern: "GET /v1/blobs/{id}", summary: "Download a blob (the signed link's expires and sig, or the owner's token)", tag: "machines", status: 200, respType: "application/octet-stream",
			query: []qp{{"expires", "integer", "The signed link's expiry (unix time).", false}, {"sig", "string", "The signed link's signature.", false}}},
		{pattern: "DELETE /v1/blobs/{id}", summary: "Delete a blob", tag: "machines", status: 200, resp: BlobDeleted{}},
		// Warm pools (pools.go).
		{pattern: "GET /v1/pools", summary: "Warm pools: shape, size, ready, hits and misses", tag: "pools", status: 200, resp: PoolList{}},
		{pattern: "PUT /v1/pools/{name}", summary: "Create or replace a warm pool (admin)", tag: "pools", req: PoolSetRequest{}, status: 200, resp: wire.PoolStatus{}},
		{pattern: "POST /v1/pools/{name}", summary: "Create or replace a warm pool (admin; as PUT)", tag: "pools", req: PoolSetRequest{}, status: 200, resp: wire.PoolStatus{}},
		{pattern: "DELETE /v1/pools/{name}", summary: "Delete a warm pool; its ready sandboxes are destroyed (admin)", tag: "pools", status: 200, resp: PoolDeleted{}},
		// Joined machines (machines.go).
		{pattern: "POST /v1/machines/join", summary: "Enroll a machine with a join token (no bearer token: the join token is the credential; `agentbox join` sends it)", tag: "machines", req: proto.JoinRequest{}, status: 201, resp: proto.JoinReply{}},
		{pattern: "GET /v1/machines/connect", summary: "A joined machine's connection (WebSocket upgrade; no bearer token: the machine signs a nonce with its key, then a yamux session runs over it)", tag: "machines", status: 101},
		{pattern: "GET /v1/machines", summary: "Joined machines: online, platform, last heartbeat, GPUs", tag: "machines", status: 200, resp: MachineList{}},
		{pattern: "GET /v1/machines/{ref}", summary: "One joined machine by id, name or alias", tag: "machines", status: 200, resp: wire.Machine{}},
		{pattern: "GET /v1/machines/{ref}/agent", summary: "Ask a connected machine's agent who it is (over a stream of its session): host name, pid, start time", tag: "machines", status: 200, resp: wire.AgentInfo{}},
		{pattern: "DELETE /v1/machines/{ref}", summary: "Remove a machine: its connection is cut and its key refused (admin)", tag: "machines", status: 200, resp: wire.Machine{}},
		{pattern: "POST /v1/machines/{ref}/aliases", summary: "Give a machine an alias (admin)", tag: "machines", req: AliasRequest{}, status: 200, resp: wire.Machine{}},
		{pattern: "DELETE /v1/machines/{ref}/aliases/{alias}", summary: "Take an alias from a machine (admin)", tag: "machines", status: 200, resp: wire.Machine{}},
		{pattern: "POST /v1/machines/tokens", summary: "Create a join token; its secret is in the reply, once (admin)", tag: "machines", req: wire.TokenRequest{}, reqOptional: true, status: 201, resp: wire.CreatedToken{}},
		{pattern: "GET /v1/machines/tokens", summary: "Join tokens, newest first, without their secrets (admin)", tag: "machines", status: 200, resp: JoinTokenList{}},
		{pattern: "DELETE /v1/machines/tokens/{ref}", summary: "Revoke a join token by id or prefix; machines it joined stay (admin)", tag: "machines", status: 200, resp: wire.JoinToken{}},
		// Remote jobs on joined machines (remotejobs.go).
		{pattern: "POST /v1/machines/{ref}/jobs", summary: "Start a detached job on a joined machine (gpu_index reserves a GPU)", tag: "machines", req: remotejobs.StartRequest{}, status: 201, resp: wire.RemoteJob{}},
		{pattern: "GET /v1/machines/{ref}/jobs", summary: "A machine's jobs, newest first", tag: "machines", status: 200, resp: wire.RemoteJobList{}, query: []qp{limit("At most this many jobs (1-1000, default 20).")}},
		{pattern: "GET /v1/machines/{ref}/jobs/{job_id}", summary: "A remote job's status", tag: "machines", status: 200, resp: wire.RemoteJob{}},
		{pattern: "GET /v1/machines/{ref}/jobs/{job_id}/logs", summary: "A remote job's output (the last lines, or a page)", tag: "machines", status: 200, resp: wire.RemoteJobLogs{},
			query: []qp{{"tail_lines", "integer", "The last N lines (1-10000; default 200).", false}, {"offset_bytes", "integer", "Page from this byte.", false}, {"max_bytes", "integer", "Bytes per page (1-262144, default 65536).", false}}},
		{pattern: "POST /v1/machines/{ref}/jobs/{job_id}/cancel", summary: "Cancel a remote job (its whole tree; its GPU released)", tag: "machines", req: RemoteJobCancelRequest{}, reqOptional: true, status: 200, resp: wire.RemoteJob{},
			query: []qp{{"grace_seconds", "integer", "Seconds between SIGTERM and SIGKILL (0-600, default 10).", false}}},
	}
}

// docPath is a mux pattern's path as OpenAPI writes it: "{path...}" is "{path}".
func docPath(p string) string { return strings.ReplaceAll(p, "...}", "}") }

var pathParam = regexp.MustCompile(`\{([a-z_]+)(\.\.\.)?\}`)

// schemaTypes are the types whose JSON is not what their Go fields say.
var schemaTypes = map[reflect.Type]*jsonschema.Schema{
	// encoding/json writes bytes as standard base64.
	reflect.TypeFor[[]byte]():          {Type: "string", ContentEncoding: "base64"},
	reflect.TypeFor[sandbox.Network](): networkSchema,
	reflect.TypeFor[wire.Network]():    networkSchema,
}

// networkSchema is the schema of a sandbox's network (sandbox.Network, wire.Network).
var networkSchema = &jsonschema.Schema{
	Description: `"none" (no network), or the egress policy {"allow": [...], "deny": [...]}.`,
	OneOf: []*jsonschema.Schema{
		{Type: "string", Enum: []any{"none"}},
		{Type: "object", Properties: map[string]*jsonschema.Schema{
			"allow": {Type: "array", Items: &jsonschema.Schema{Type: "string"}},
			"deny":  {Type: "array", Items: &jsonschema.Schema{Type: "string"}},
		}, AdditionalProperties: &jsonschema.Schema{Not: &jsonschema.Schema{}}},
	},
}

// schemaNames name the schemas of this package's unexported types, and of the wire types whose
// schemas the document named after the domain types the replies were before (the document's
// names do not change when a reply's Go type does).
var schemaNames = map[reflect.Type]string{
	reflect.TypeFor[errorBody]():              "Error",
	reflect.TypeFor[healthReply]():            "Health",
	reflect.TypeFor[wire.Machine]():           "Info",
	reflect.TypeFor[wire.RemoteExecRequest](): "RemoteexecRequest",
	reflect.TypeFor[wire.RemoteExecResult]():  "RemoteexecResult",
	reflect.TypeFor[wire.Screenshot]():        "ScreenshotReply",
	reflect.TypeFor[wire.Blob]():              "BlobsResult",
	reflect.TypeFor[wire.BlobPush]():          "BlobsPushResult",
	reflect.TypeFor[wire.RemoteJob]():         "RemotejobsJob",
	reflect.TypeFor[wire.RemoteJobList]():     "RemotejobsList",
	reflect.TypeFor[wire.RemoteJobLogs]():     "HostjobsLogs",
	reflect.TypeFor[wire.APIKey]():            "Key",
	reflect.TypeFor[wire.CreatedKey]():        "Created",
	reflect.TypeFor[wire.AuditList]():         "List",
	reflect.TypeFor[wire.RunEventList]():      "RunsEventList",
}

// docBuilder collects the named schemas (components) of the document.
type docBuilder struct {
	schemas map[string]*jsonschema.Schema
	names   map[reflect.Type]string
}

// ref returns a $ref to v's type's schema, adding it under a name: the type's, or its package's
// and the type's when two packages use one name.
func (b *docBuilder) ref(v any) map[string]any {
	t := reflect.TypeOf(v)
	name, ok := b.names[t]
	if !ok {
		name = t.Name()
		if n, ok := schemaNames[t]; ok {
			name = n
		}
		if _, taken := b.schemas[name]; taken {
			pkg := t.PkgPath()[strings.LastIndex(t.PkgPath(), "/")+1:]
			name = strings.ToUpper(pkg[:1]) + pkg[1:] + name
		}
		s, err := jsonschema.ForType(t, &jsonschema.ForOptions{TypeSchemas: schemaTypes})
		if err != nil {
			panic(fmt.Sprintf("schema of %s: %v", t, err))
		}
		b.schemas[name], b.names[t] = s, name
	}
	return map[string]any{"$ref": "#/components/schemas/" + name}
}

// buildOpenAPI returns the document as it should be.
func buildOpenAPI() ([]byte, error) {
	b := &docBuilder{schemas: map[string]*jsonschema.Schema{}, names: map[reflect.Type]string{}}
	errRef := b.ref(errorBody{})
	paths := map[string]map[string]any{}
	for _, o := range ops() {
		method, p, ok := strings.Cut(o.pattern, " ")
		if !ok {
			method, p = o.method, o.pattern
		}
		var params []any
		for _, m := range pathParam.FindAllStringSubmatch(p, -1) {
			d := "The " + strings.ReplaceAll(m[1], "_", " ") + "."
			if m[2] != "" {
				d = "A path of one or more segments."
			}
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]any{"type": "string"}, "description": d})
		}
		for _, q := range o.query {
			sch := map[string]any{"type": q.typ}
			if q.array {
				sch = map[string]any{"type": "array", "items": map[string]any{"type": q.typ}}
			}
			params = append(params, map[string]any{"name": q.name, "in": "query", "schema": sch, "description": q.desc})
		}
		operation := map[string]any{
			"operationId": operationID(method, p),
			"summary":     o.summary,
			"tags":        []string{o.tag},
		}
		if len(params) > 0 {
			operation["parameters"] = params
		}
		if o.req != nil {
			operation["requestBody"] = map[string]any{"required": !o.reqOptional, "content": map[string]any{"application/json": map[string]any{"schema": b.ref(o.req)}}}
		} else if o.reqType != "" {
			operation["requestBody"] = map[string]any{"required": true, "content": map[string]any{o.reqType: map[string]any{"schema": map[string]any{"type": "string", "contentMediaType": o.reqType}}}}
		}
		ok200 := map[string]any{"description": o.summary}
		content := map[string]any{}
		switch {
		case o.resp != nil:
			content["application/json"] = map[string]any{"schema": b.ref(o.resp)}
		case o.respType == "application/json":
			content["application/json"] = map[string]any{"schema": map[string]any{"type": "object"}}
		case o.respType != "":
			content[o.respType] = map[string]any{"schema": map[string]any{"type": "string"}}
		}
		if o.ndjson != nil {
			content["application/x-ndjson"] = map[string]any{"schema": map[string]any{"description": "Each line is one JSON frame of this shape.", "$ref": b.ref(o.ndjson)["$ref"]}}
		}
		if len(content) > 0 {
			ok200["content"] = content
		}
		responses := map[string]any{fmt.Sprint(o.status): ok200,
			"default": map[string]any{"description": "A typed error: {\"error\": {\"code\", \"message\", \"details\"}}.", "content": map[string]any{"application/json": map[string]any{"schema": errRef}}}}
		operation["responses"] = responses
		if p != "/health" {
			operation["security"] = []any{map[string]any{"bearer": []string{}}}
		}
		dp := docPath(p)
		if paths[dp] == nil {
			paths[dp] = map[string]any{}
		}
		if _, dup := paths[dp][strings.ToLower(method)]; dup {
			return nil, fmt.Errorf("route %s listed twice", o.pattern)
		}
		paths[dp][strings.ToLower(method)] = operation
	}
	d := map[string]any{
		"openapi":           "3.1.0",
		"jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
		"info": map[string]any{
			"title":       "agentbox REST API",
			"version":     "v1",
			"description": "Disposable Linux sandboxes for AI agents. Every route but /health needs \"Authorization: Bearer <token>\". Errors are {\"error\": {\"code\", \"message\", \"details\"}} with the typed code's HTTP status. Generated from the server's Go types (internal/api/openapi_gen_test.go); the server's version is in GET /health.",
		},
		"servers": []any{map[string]any{"url": "http://127.0.0.1:8765"}},
		"paths":   paths,
		"components": map[string]any{
			"schemas":         b.schemas,
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}},
		},
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// operationID is a route's id: the method and the path's literal segments, camel-cased.
func operationID(method, p string) string {
	var sb strings.Builder
	sb.WriteString(strings.ToLower(method))
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "v1" {
			continue
		}
		if m := pathParam.FindStringSubmatch(seg); m != nil {
			seg = "by_" + m[1]
		}
		for _, w := range strings.FieldsFunc(seg, func(r rune) bool { return r == '_' || r == '-' || r == '.' }) {
			sb.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return sb.String()
}

// TestOpenAPIDocument keeps internal/openapi/openapi.json what the Go types say.
func TestOpenAPIDocument(t *testing.T) {
	want, err := buildOpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	if *updateOpenAPI {
		if err := os.WriteFile(openAPIFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(openAPIFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("internal/openapi/openapi.json is not what the Go types say: run `go generate ./internal/api` and commit it")
	}
	if !bytes.Equal(openapi.Document(), want) {
		t.Fatalf("the embedded document differs from the file")
	}
}
