package sqlquery

import "strings"

// View is one published view: its name and its columns, in order. The list is a stable
// contract (docs/ARCHITECTURE.md, "SQL views"): columns may be added, never renamed or removed,
// and every store driver serves exactly these names and types.
//
// Conventions: every time is two columns, NAME (ISO-8601 UTC text with milliseconds,
// "2026-12-02T14:03:05.123Z") and NAME_ms (integer unix milliseconds, indexed where the table
// is: filter and order on the _ms column); JSON documents are text; booleans are integers 0/1.
// No view exposes a secret: never a sandbox's environment values, its secrets' placeholders or
// references, an exposure's token digest, or a job's output.
type View struct {
	Name    string
	Doc     string
	Columns []Column
}

// Column is one column of a view.
type Column struct {
	Name string
	// Type is "text", "integer", "real" or "json" (JSON as text).
	Type string
	Doc  string
}

// times returns the two columns of one time.
func times(name, doc string) []Column {
	return []Column{{name, "text", doc + " (ISO-8601 UTC)"}, {name + "_ms", "integer", doc + " (unix milliseconds)"}}
}

func cols(groups ...[]Column) []Column {
	var out []Column
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

func c(name, typ, doc string) []Column { return []Column{{name, typ, doc}} }

// Views are the published views, in documentation order.
var Views = []View{
	{Name: "audit_log", Doc: "every call on every surface (the audit log), oldest first by seq",
		Columns: cols(
			c("seq", "integer", "the record's cursor (increasing)"),
			times("time", "when the call started"),
			c("surface", "text", "rest, mcp or mcp-stdio"),
			c("caller_id", "text", "the caller: an API key's id, or the stdio session's owner"),
			c("caller_name", "text", "the caller's name"),
			c("tool", "text", "the MCP tool, or the REST route pattern (\"POST /v1/sandboxes/{id}/exec\")"),
			c("action", "text", "the MCP tool the call is (a REST route's too); '' for REST routes that are none"),
			c("sandbox_id", "text", "the sandbox the call named, or ''"),
			c("args_sha256", "text", "hex SHA-256 of the arguments' canonical JSON"),
			c("summary", "json", "the arguments, redacted (never file contents or secret values)"),
			c("outcome", "text", "ok, or the error code"),
			c("duration_ms", "real", "how long the call took"),
			c("approval_id", "text", "the approval the call waited for, or ''"),
		)},
	{Name: "events", Doc: "sandbox lifecycle events, by seq",
		Columns: cols(
			c("seq", "integer", "the event's cursor (increasing)"),
			c("sandbox_id", "text", "the sandbox"),
			c("type", "text", "the event type (created, state_changed, …)"),
			c("from_state", "text", "the state before"),
			c("to_state", "text", "the state after"),
			c("reason", "text", "why"),
			times("time", "when it happened"),
		)},
	{Name: "sandboxes", Doc: "sandbox records (live and kept finished ones); never env values or secrets",
		Columns: cols(
			c("id", "text", "the sandbox id"),
			c("state", "text", "creating, running, destroyed, failed, lost, expired, …"),
			c("image", "text", "the image reference"),
			c("image_digest", "text", "the OCI manifest digest, or ''"),
			c("runtime", "text", "the runtime (runc, crun, gvisor, …)"),
			c("isolation", "text", "process, kernel or vm"),
			c("cpu", "real", "cores"),
			c("memory_mb", "integer", "memory limit"),
			c("disk_mb", "integer", "disk limit"),
			c("pids_limit", "integer", "process limit"),
			c("labels", "json", "the labels, a JSON object"),
			c("owner", "text", "who created it"),
			c("node", "text", "the node it runs on"),
			c("network", "json", "the egress policy ({\"allow\": […], \"deny\": […]}), or '' for none"),
			c("error", "text", "why it failed or ended, or ''"),
			times("created_at", "created"),
			times("updated_at", "last changed"),
			times("expires_at", "expires"),
		)},
	{Name: "jobs", Doc: "detached jobs; never their environment values or output",
		Columns: cols(
			c("id", "text", "the job id"),
			c("sandbox_id", "text", "its sandbox"),
			c("argv", "json", "the command, a JSON array"),
			c("env_names", "json", "the names of its environment variables (never values)"),
			c("cwd", "text", "working directory"),
			c("user_name", "text", "the user it runs as"),
			c("state", "text", "starting, running, exited, killed, failed, …"),
			c("exit_code", "integer", "exit status, or NULL"),
			c("signal", "text", "the signal that ended it, or ''"),
			c("oom_killed", "integer", "1 if the OOM killer ended it"),
			c("cpu_seconds", "real", "CPU time used"),
			c("log_bytes", "integer", "output bytes written"),
			c("log_truncated", "integer", "1 if output was dropped"),
			c("error", "text", "why it failed, or ''"),
			times("started_at", "started"),
			times("finished_at", "finished (NULL while running)"),
			times("created_at", "created"),
			times("updated_at", "last changed"),
		)},
	{Name: "runs", Doc: "durable runs",
		Columns: cols(
			c("id", "text", "the run id"),
			c("owner", "text", "who started it"),
			c("batch_id", "text", "its batch, or ''"),
			c("state", "text", "queued, running, succeeded, failed, cancelled, …"),
			times("created_at", "created"),
			times("updated_at", "last changed"),
			times("settled_at", "settled (NULL until then)"),
		)},
	{Name: "run_events", Doc: "runs' state and phase events, by seq",
		Columns: cols(
			c("seq", "integer", "the event's cursor (increasing)"),
			c("run_id", "text", "the run"),
			c("from_state", "text", "the state before"),
			c("to_state", "text", "the state after"),
			c("phase", "text", "the phase"),
			c("reason", "text", "why"),
			times("time", "when it happened"),
		)},
	{Name: "conversations", Doc: "conversations of agentbox chat; never an API key",
		Columns: cols(
			c("id", "text", "the conversation id"),
			c("principal", "text", "the key that owns it, or admin"),
			c("title", "text", "its first question, cut to 80 characters"),
			c("model", "text", "the model"),
			c("endpoint", "text", "the model's base URL"),
			c("sandbox_id", "text", "its sandbox, or ''"),
			c("tools", "json", "the tools offered ([]: all)"),
			c("messages", "integer", "messages kept"),
			c("prompt_tokens", "integer", "prompt tokens of every reply"),
			c("completion_tokens", "integer", "completion tokens of every reply"),
			times("created_at", "started"),
			times("updated_at", "last message"),
		)},
	{Name: "conversation_messages", Doc: "every message of every conversation, by conversation_id and seq",
		Columns: cols(
			c("conversation_id", "text", "the conversation"),
			c("seq", "integer", "the message's place (1, 2, …)"),
			c("role", "text", "system, user, assistant or tool"),
			c("content", "text", "the text (a tool's result as fed back to the model)"),
			c("tool_calls", "json", "an assistant message's calls: [{id, name, arguments}]"),
			c("tool_call_id", "text", "a tool message's call"),
			c("tool", "text", "a tool message's tool"),
			c("is_error", "integer", "1 if the call failed"),
			c("truncated", "integer", "1 if the result was cut to the loop's bound"),
			c("output_bytes", "integer", "the whole result's size"),
			c("prompt_tokens", "integer", "an assistant message's prompt tokens"),
			c("completion_tokens", "integer", "an assistant message's completion tokens"),
			c("duration_ms", "integer", "the model's reply time, or the call's"),
			c("model", "text", "the model that wrote an assistant message"),
			times("created_at", "written"),
		)},
}

// ViewNames lists the published views' names, comma-separated.
func ViewNames() string {
	names := make([]string, len(Views))
	for i, v := range Views {
		names[i] = v.Name
	}
	return strings.Join(names, ", ")
}
