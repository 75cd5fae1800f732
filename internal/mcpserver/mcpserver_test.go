package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
)

var allTools = []string{"agent_compare", "agent_test", "api_call", "batch_get", // durable runs; api_call
	"code_context_create", // the stateful interpreter
	"exec", "execute_sql", "fetch_metrics", "file_list", "file_read", "file_write", "health",
	"image_list", "image_pull", // images
	"job_cancel", "job_list", "job_logs", "job_start", "job_status", "job_wait",
	"machine_list", "machine_status", // joined machines
	"pool_delete", "pool_list", "pool_set", // warm pools
	"remote_exec",                                                                                      // joined machines
	"remote_job_cancel", "remote_job_list", "remote_job_logs", "remote_job_start", "remote_job_status", // remote jobs
	"remote_pull", "remote_push", // the file relay
	"remote_screenshot",                                                                                                         // joined machines
	"run", "run_artifact", "run_batch", "run_cancel", "run_code", "run_events", "run_get", "run_list", "run_logs", "run_matrix", // durable runs; run_code
	"run_python", "run_shell", // data-assistant tools
	"sandbox_commit", "sandbox_connections", "sandbox_create", "sandbox_destroy",
	"sandbox_diff",
	"sandbox_expose", "sandbox_extend",
	"sandbox_fork",
	"sandbox_get", "sandbox_list", "sandbox_metrics", "sandbox_network_update", "sandbox_secret_calls",
	"sandbox_sleep", "sandbox_snapshot",
	"sandbox_unexpose",
	"sandbox_wake", "snapshot_delete", "snapshot_list",
	"watch", "watch_fleet"}

// TestToolsList: every tool is listed with a description, an input schema and an output schema;
// the argument names clients rely on are there.
func TestToolsList(t *testing.T) {
	t.Parallel()
	srv := mcpserver.New(nil, mcpserver.Options{}) // listing never reaches the backend
	defer srv.Close()
	for _, v := range protocolVersions {
		c := connect(t, srv, v)
		var names []string
		for n := range c.tools {
			names = append(names, n)
		}
		slices.Sort(names)
		if !slices.Equal(names, allTools) {
			t.Fatalf("%s: tools %v, want %v", v, names, allTools)
		}
		type schema struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
			AnyOf      []struct {
				Required []string `json:"required"`
			} `json:"anyOf"`
		}
		get := func(v any) schema {
			var s schema
			b, _ := json.Marshal(v)
			json.Unmarshal(b, &s)
			return s
		}
		wantArgs := map[string][]string{
			"run_python":    {"code", "sandbox_id", "timeout_seconds", "network", "keep"},
			"run_shell":     {"code", "sandbox_id", "timeout_seconds", "network", "keep"},
			"fetch_metrics": {"name", "prefix", "sandbox_id", "window_seconds"},
			"sandbox_create": {"image", "runtime", "cpu", "memory_mb", "disk_mb", "ttl_seconds", "env", "labels", "requirements", "network", "secrets",
				"snapshot", "auto_wake", "ttl_while_sleeping"},
			// network
			"sandbox_network_update": {"sandbox_id", "allow", "deny"},
			"sandbox_connections":    {"sandbox_id", "after", "limit"},
			"sandbox_secret_calls":   {"sandbox_id", "after", "limit"},
			"sandbox_expose":         {"sandbox_id", "port", "public"},
			"sandbox_unexpose":       {"sandbox_id", "port"},
			// images
			"image_pull":      {"ref"},
			"sandbox_commit":  {"sandbox_id", "name"},
			"sandbox_get":     {"sandbox_id"},
			"sandbox_destroy": {"sandbox_id"},
			"sandbox_extend":  {"sandbox_id", "ttl_seconds"},
			"exec":            {"sandbox_id", "command", "env", "cwd", "stdin", "timeout_seconds"},
			"file_write":      {"sandbox_id", "path", "content", "content_base64", "mode"},
			"file_read":       {"sandbox_id", "path", "offset", "length"},
			"file_list":       {"sandbox_id", "path"},
			// durable runs: the names the contract gives
			"run": {"repo_url", "ref", "setup", "command", "validation_commands", "artifacts", "env", "secrets", "image", "runtime",
				"cpu", "memory_mb", "disk_mb", "network", "requirements", "timeout_seconds", "phase_timeout_seconds", "retention",
				"keep_ttl_seconds", "idempotency_key", "wait"},
			"run_batch":     {"runs", "max_parallel", "wait"},
			"run_matrix":    {"base", "axes", "max_parallel", "wait"},
			"agent_compare": {"baseline", "candidate", "target_repo_url", "target_ref", "task", "build_command", "setup_command", "validation_commands", "repetitions"},
			"agent_test":    {"candidate", "keep_sandbox"},
			// snapshots, fork, sleep, wake, diff: the names the contract gives
			"sandbox_snapshot": {"sandbox_id", "memory", "labels"},
			"snapshot_list":    {"sandbox_id", "cursor", "limit"},
			"snapshot_delete":  {"snapshot_id"},
			"sandbox_fork":     {"sandbox_id", "count", "snapshot_id", "memory", "ttl_seconds", "labels"},
			"sandbox_sleep":    {"sandbox_id"},
			"sandbox_wake":     {"sandbox_id"},
			"sandbox_diff":     {"sandbox_id", "other_sandbox_id", "snapshot_id", "cursor", "limit", "max_diff_bytes"},
		}
		wantOut := map[string][]string{
			"sandbox_create": {"sandbox_id", "state"},
			"exec":           {"exit_code", "signal", "stdout", "stderr", "truncated", "duration_ms", "timed_out"},
			"file_read":      {"size"},
			"health":         {"runtimes", "capacity", "version"},
			"sandbox_list":   {"sandboxes", "count"},
			// network
			"sandbox_connections":  {"sandbox_id", "connections", "next"},
			"sandbox_secret_calls": {"sandbox_id", "calls", "next"},
			"sandbox_expose":       {"url", "port", "public", "access_token"},
			// images
			"image_list":     {"images", "count"},
			"image_pull":     {"ref", "digest", "layers", "in_use"},
			"sandbox_commit": {"sandbox_id", "image"},
			// durable runs: the names the contract gives
			"run":       {"run_id", "state", "commit", "phases", "changed_files", "diff", "artifacts", "started_at", "finished_at", "sandbox_id", "cleanup_failed"},
			"run_get":   {"run_id", "state", "phases"},
			"run_batch": {"batch_id", "runs", "submission_failures"},
			// the data-assistant tools
			"run_python":    {"sandbox_id", "kept", "exit_code", "stdout", "stderr", "truncated", "timed_out", "duration_ms", "value", "exception", "artifacts"},
			"run_shell":     {"sandbox_id", "kept", "exit_code", "stdout", "stderr", "artifacts"},
			"fetch_metrics": {"metrics", "truncated", "sandbox", "history"},
			// snapshots, forks, sleep, wake, diff
			"sandbox_snapshot": {"snapshot_id", "kind", "size_bytes", "sandbox_id", "state", "created_at"},
			"snapshot_list":    {"snapshots", "count", "next_cursor"},
			"snapshot_delete":  {"snapshot_id", "deleted"},
			"sandbox_fork":     {"sandboxes", "kind", "snapshot_id", "count"},
			"sandbox_sleep":    {"sandbox_id", "state", "slept_at"},
			"sandbox_wake":     {"sandbox_id", "state"},
			"sandbox_diff":     {"changes", "diff", "next_cursor", "against", "diff_truncated", "skipped"},
		}
		for name, tl := range c.tools {
			if len(tl.Description) < 100 {
				t.Errorf("%s: description too thin for a model: %q", name, tl.Description)
			}
			in, out := get(tl.InputSchema), get(tl.OutputSchema)
			if in.Type != "object" || out.Type != "object" {
				t.Errorf("%s: schemas must be objects: in %q out %q", name, in.Type, out.Type)
			}
			for _, a := range wantArgs[name] {
				if _, ok := in.Properties[a]; !ok {
					t.Errorf("%s: no argument %q", name, a)
				}
			}
			for _, f := range append(wantOut[name], "error") {
				if _, ok := out.Properties[f]; !ok {
					t.Errorf("%s: output has no %q", name, f)
				}
			}
			// The data-assistant tools take an optional sandbox_id (omitted: a fresh sandbox, or the server).
			optionalID := name == "run_python" || name == "run_shell" || name == "fetch_metrics" ||
				name == "snapshot_list" // a filter
			if _, ok := in.Properties["sandbox_id"]; ok && !optionalID && !slices.Contains(in.Required, "sandbox_id") {
				t.Errorf("%s: sandbox_id must be required", name)
			}
		}
		var cmd struct {
			Type     any `json:"type"`
			MinItems int `json:"minItems"`
		}
		json.Unmarshal(get(c.tools["exec"].InputSchema).Properties["command"], &cmd)
		if cmd.Type != "array" || cmd.MinItems != 1 {
			t.Errorf("exec command schema: %+v (want a non-nullable array, minItems 1)", cmd)
		}
		if r := get(c.tools["exec"].InputSchema).Required; !slices.Equal(r, []string{"sandbox_id", "command"}) {
			t.Errorf("exec required %v", r)
		}
	}
}

// TestLoop is the whole loop a model runs, under each protocol version, end to end on real
// runc sandboxes: create, exec with progress, users, files in and out of /workspace (text and
// binary, paged), list, extend, destroy.
func TestLoop(t *testing.T) {
	svc := service(t, sandbox.Config{})
	srv := mcpserver.New(svc, mcpserver.Options{ControlPlane: "test"})
	defer srv.Close()
	for _, v := range protocolVersions {
		t.Run(v, func(t *testing.T) {
			c := connect(t, srv, v)
			var sb mcpserver.SandboxInfo
			txt := c.ok("sandbox_create", obj{"ttl_seconds": 600, "labels": obj{"t": "loop"}}, &sb)
			if sb.State != "running" || !sandbox.ValidID(sb.SandboxID) || sb.ExpiresInSeconds < 590 || !strings.Contains(txt, sb.SandboxID) {
				t.Fatalf("create: %+v %q", sb, txt)
			}
			id := sb.SandboxID

			// exec with a progress token: the output arrives while the command runs, before
			// the result.
			start := time.Now()
			res := c.callCtx(context.Background(), "exec", obj{"sandbox_id": id, "command": []string{"sh", "-c",
				"for i in 1 2 3; do echo line $i; sleep 0.3; done; echo done >&2; exit 4"}}, "tok-"+v)
			returned := time.Now()
			var ex mcpserver.ExecOut
			decode(t, res, &ex)
			if res.IsError || ex.ExitCode != 4 || ex.Stdout != "line 1\nline 2\nline 3\n" || ex.Stderr != "done\n" || ex.TimedOut || ex.StdoutBytes != 21 {
				t.Fatalf("exec: %+v %s", ex, text(res))
			}
			if !strings.Contains(text(res), "exit_code 4") || !strings.Contains(text(res), "line 3") {
				t.Fatalf("exec text: %q", text(res))
			}
			// The server sends every notification before the result, but the SDK's client
			// dispatches notifications apart from responses: the last ones may be recorded just
			// after the call returns. (Wire order is checked by test/mcpclients' TypeScript client.)
			eventually(t, 2*time.Second, "all output to arrive as progress", func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				var all strings.Builder
				for _, p := range c.progress {
					all.WriteString(p.Message)
				}
				return strings.Contains(all.String(), "done\n")
			})
			c.mu.Lock()
			progress, at := c.progress, c.progAt
			c.progress, c.progAt = nil, nil
			c.mu.Unlock()
			var streamed strings.Builder
			last := 0.0
			for _, p := range progress {
				if p.ProgressToken != "tok-"+v {
					t.Fatalf("progress token %v", p.ProgressToken)
				}
				if p.Progress <= last {
					t.Fatalf("progress does not increase: %v after %v", p.Progress, last)
				}
				last = p.Progress
				streamed.WriteString(p.Message)
			}
			for _, l := range []string{"line 1\n", "line 2\n", "line 3\n", "done\n"} {
				if !strings.Contains(streamed.String(), l) {
					t.Fatalf("progress lacks %q: %q", l, streamed.String())
				}
			}
			if len(at) == 0 || at[0].Sub(start) > returned.Sub(start)-500*time.Millisecond {
				t.Fatalf("the first line was not streamed while the command ran (first at %v, result at %v)", at[0].Sub(start), returned.Sub(start))
			}

			// Without a progress token nothing is streamed.
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"echo", "quiet"}}, &ex)
			if ex.Stdout != "quiet\n" || len(c.progress) != 0 {
				t.Fatalf("exec without token: %+v, %d notifications", ex, len(c.progress))
			}
			// stdin, env, cwd, timeout.
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"sh", "-c", "cat; echo \" $X\"; pwd"}, "stdin": "in", "env": obj{"X": "y"}, "cwd": "/tmp"}, &ex)
			if ex.Stdout != "in y\n/tmp\n" {
				t.Fatalf("stdin/env/cwd: %q", ex.Stdout)
			}
			// The default user is the unprivileged agent; user root is root inside.
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"id", "-un"}}, &ex)
			if ex.Stdout != "agent\n" {
				t.Fatalf("default user: %q", ex.Stdout)
			}
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"id", "-un"}, "user": "root"}, &ex)
			if ex.Stdout != "root\n" {
				t.Fatalf("user root: %q", ex.Stdout)
			}
			c.fails("exec", obj{"sandbox_id": id, "command": []string{"id"}, "user": "nobody"}, "INVALID_ARGUMENT")
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"sleep", "30"}, "timeout_seconds": 0.5}, &ex)
			if !ex.TimedOut || ex.Signal != "SIGKILL" || ex.ExitCode != 137 {
				t.Fatalf("timeout: %+v", ex)
			}

			// Text file in and out.
			var fw mcpserver.FileWriteOut
			c.ok("file_write", obj{"sandbox_id": id, "path": "run.sh", "content": "#!/bin/sh\necho héllo\n", "mode": "0755"}, &fw)
			if fw.Path != "/workspace/run.sh" || fw.Size != int64(len("#!/bin/sh\necho héllo\n")) || fw.Mode != "0755" {
				t.Fatalf("file_write: %+v", fw)
			}
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"./run.sh"}}, &ex)
			if ex.Stdout != "héllo\n" {
				t.Fatalf("run written script: %+v", ex)
			}
			var fr mcpserver.FileReadOut
			c.ok("file_read", obj{"sandbox_id": id, "path": "/workspace/run.sh"}, &fr)
			if fr.Encoding != "utf-8" || fr.Content == nil || *fr.Content != "#!/bin/sh\necho héllo\n" || !fr.EOF || fr.Size != fw.Size {
				t.Fatalf("file_read text: %+v", fr)
			}
			// An empty file.
			c.ok("file_write", obj{"sandbox_id": id, "path": "empty", "content": ""}, &fw)
			c.ok("file_read", obj{"sandbox_id": id, "path": "empty"}, &fr)
			if fw.Size != 0 || fr.Size != 0 || fr.Bytes != 0 || fr.Content == nil || *fr.Content != "" || !fr.EOF {
				t.Fatalf("empty file: %+v %+v", fw, fr)
			}

			// Binary file in and out, whole and by range.
			bin := make([]byte, 256)
			for i := range bin {
				bin[i] = byte(i)
			}
			c.ok("file_write", obj{"sandbox_id": id, "path": "/workspace/bin.dat", "content_base64": base64.StdEncoding.EncodeToString(bin)}, &fw)
			c.ok("file_read", obj{"sandbox_id": id, "path": "bin.dat"}, &fr)
			got, _ := base64.StdEncoding.DecodeString(deref(fr.ContentBase64))
			if fr.Encoding != "base64" || !bytes.Equal(got, bin) || fr.Size != 256 {
				t.Fatalf("file_read binary: %+v", fr)
			}
			c.ok("file_read", obj{"sandbox_id": id, "path": "bin.dat", "offset": 250, "length": 4}, &fr)
			got, _ = base64.StdEncoding.DecodeString(deref(fr.ContentBase64))
			if !bytes.Equal(got, bin[250:254]) || fr.Bytes != 4 || fr.EOF || fr.NextOffset != 254 {
				t.Fatalf("file_read range: %+v", fr)
			}

			// A 2.5 MiB file: too big for one read; paged reads give it back whole. The page
			// boundary splits a 2-byte rune, which moves to the next page.
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"sh", "-c", "head -c 1048575 /dev/zero | tr '\\0' a > big; printf 'é' >> big; head -c 1572864 /dev/zero | tr '\\0' b >> big"}}, &ex)
			msg := c.fails("file_read", obj{"sandbox_id": id, "path": "big"}, "FILE_TOO_LARGE")
			if !strings.Contains(msg, "offset") || !strings.Contains(msg, "length") {
				t.Fatalf("FILE_TOO_LARGE should say how to page: %q", msg)
			}
			var whole strings.Builder
			for off := int64(0); ; {
				c.ok("file_read", obj{"sandbox_id": id, "path": "big", "offset": off, "length": mcpserver.MaxReadBytes}, &fr)
				if fr.Encoding != "utf-8" {
					t.Fatalf("page at %d is not text: %s", off, fr.Encoding)
				}
				whole.WriteString(*fr.Content)
				if fr.EOF {
					break
				}
				off = fr.NextOffset
			}
			if want := strings.Repeat("a", 1048575) + "é" + strings.Repeat("b", 1572864); whole.String() != want {
				t.Fatalf("paged read: %d bytes, want %d", whole.Len(), len(want))
			}

			var dl mcpserver.FileListOut
			c.ok("file_list", obj{"sandbox_id": id}, &dl)
			var names []string
			for _, e := range dl.Entries {
				names = append(names, e.Name)
			}
			if dl.Path != "/workspace" || !slices.Equal(names, []string{"big", "bin.dat", "empty", "run.sh"}) || dl.Total != 4 {
				t.Fatalf("file_list: %+v", dl)
			}
			c.ok("file_list", obj{"sandbox_id": id, "path": "/"}, &dl)
			if !slices.ContainsFunc(dl.Entries, func(e mcpserver.FileEntry) bool { return e.Name == "workspace" && e.Type == "dir" }) {
				t.Fatalf("file_list /: %+v", dl)
			}

			var ext mcpserver.SandboxInfo
			c.ok("sandbox_extend", obj{"sandbox_id": id, "ttl_seconds": 600}, &ext)
			// 600 s past the old expiry, and expires_in_seconds counts from now (not from the
			// create, which a loaded machine or the race detector may make tens of seconds ago).
			left := int64(time.Until(ext.ExpiresAt).Seconds())
			if ext.ExpiresAt.Sub(sb.ExpiresAt.Add(600*time.Second)).Abs() > time.Second || ext.ExpiresInSeconds < left-2 || ext.ExpiresInSeconds > left+1 {
				t.Fatalf("extend: %+v", ext)
			}
			var got1 mcpserver.SandboxInfo
			c.ok("sandbox_get", obj{"sandbox_id": id}, &got1)
			if got1.State != "running" || got1.Labels["t"] != "loop" || !got1.ExpiresAt.Equal(ext.ExpiresAt) {
				t.Fatalf("get: %+v", got1)
			}
			var l mcpserver.SandboxList
			c.ok("sandbox_list", obj{}, &l)
			if !slices.ContainsFunc(l.Sandboxes, func(s mcpserver.SandboxInfo) bool { return s.SandboxID == id }) {
				t.Fatalf("list lacks %s: %+v", id, l)
			}
			var h mcpserver.HealthOut
			c.ok("health", nil, &h)
			if h.Status != "ok" || len(h.Runtimes) == 0 || h.Runtimes[0].Isolation != "process" || h.Capacity.Live < 1 || h.Capacity.Free != h.Capacity.MaxSandboxes-h.Capacity.Live || h.ControlPlane != "test" {
				t.Fatalf("health: %+v", h)
			}

			var d mcpserver.SandboxInfo
			c.ok("sandbox_destroy", obj{"sandbox_id": id}, &d)
			if d.State != "destroyed" {
				t.Fatalf("destroy: %+v", d)
			}
			c.ok("sandbox_destroy", obj{"sandbox_id": id}, &d) // idempotent
			c.ok("sandbox_get", obj{"sandbox_id": id}, &got1)
			if got1.State != "destroyed" || got1.Reason != "destroy requested" {
				t.Fatalf("get after destroy: %+v", got1)
			}
			c.fails("exec", obj{"sandbox_id": id, "command": []string{"true"}}, "SANDBOX_NOT_RUNNING")
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestBadCalls: malformed and impossible calls get the right code and a message naming what to
// change, and the session keeps serving (the fake runtime: tool logic).
func TestBadCalls(t *testing.T) {
	svc := fakeService(t)
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	var sb mcpserver.SandboxInfo
	c.ok("sandbox_create", nil, &sb)
	id := sb.SandboxID
	cases := []struct {
		tool string
		args any
		code string
		says []string // the message must contain these
	}{
		{"exec", obj{"sandbox_id": id}, "INVALID_ARGUMENT", []string{`missing required argument "command"`, "array of strings"}},
		{"sandbox_get", obj{}, "INVALID_ARGUMENT", []string{`"sandbox_id"`, "a string"}},
		{"sandbox_get", nil, "INVALID_ARGUMENT", []string{`"sandbox_id"`}},
		{"exec", obj{"sandbox_id": id, "command": "ls -la"}, "INVALID_ARGUMENT", []string{`"command" must be an array of strings`, "not a string"}},
		{"exec", obj{"sandbox_id": id, "command": []any{"echo", 5}}, "INVALID_ARGUMENT", []string{`"command[1]" must be a string`}},
		{"exec", obj{"sandbox_id": id, "command": []string{}}, "INVALID_ARGUMENT", []string{`"command" must not be empty`}},
		{"exec", obj{"sandbox_id": id, "command": []string{""}}, "INVALID_ARGUMENT", []string{"non-empty argv"}},
		{"exec", obj{"sandbox_id": id, "command": []string{"true"}, "timeout_seconds": "10"}, "INVALID_ARGUMENT", []string{`"timeout_seconds" must be a number`}},
		{"exec", obj{"sandbox_id": id, "command": []string{"true"}, "timeout_seconds": 100000}, "INVALID_ARGUMENT", []string{"timeout_seconds"}},
		{"exec", obj{"sandbox_id": id, "command": []string{"true"}, "env": obj{"A": 1}}, "INVALID_ARGUMENT", []string{`"env.A" must be a string`}},
		{"exec", obj{"sandbox_id": id, "command": []string{"true"}, "max_output_bytes": 1 << 30}, "OUTPUT_LIMIT_EXCEEDED", nil},
		{"exec", obj{"sandbox_id": id, "cmd": []string{"true"}}, "INVALID_ARGUMENT", []string{`unknown argument "cmd"`, "command (required)"}},
		{"exec", obj{"sandbox_id": 42, "command": []string{"true"}}, "INVALID_ARGUMENT", []string{`"sandbox_id" must be a string`}},
		{"exec", obj{"sandbox_id": "sb-0123456789ab", "command": []string{"true"}}, "SANDBOX_NOT_FOUND", nil},
		{"sandbox_get", obj{"sandbox_id": "sb-0123456789ab"}, "SANDBOX_NOT_FOUND", nil},
		{"sandbox_destroy", obj{"sandbox_id": "sb-0123456789ab"}, "SANDBOX_NOT_FOUND", nil},
		{"sandbox_get", obj{"sandbox_id": "../etc"}, "INVALID_ARGUMENT", []string{"malformed"}},
		{"sandbox_extend", obj{"sandbox_id": id, "ttl_seconds": "60"}, "INVALID_ARGUMENT", []string{`"ttl_seconds" must be an integer`}},
		{"sandbox_extend", obj{"sandbox_id": id, "ttl_seconds": 1.5}, "INVALID_ARGUMENT", []string{"integer"}},
		{"sandbox_extend", obj{"sandbox_id": id, "ttl_seconds": -5}, "INVALID_ARGUMENT", []string{"ttl_seconds"}},
		{"sandbox_create", obj{"memory_mb": -1}, "INVALID_ARGUMENT", []string{"memory_mb"}},
		{"sandbox_create", obj{"requirements": obj{"isolation": "vm"}}, "RUNTIME_UNAVAILABLE", []string{"no vm runtime", "runc"}},
		{"sandbox_create", obj{"requirements": obj{"network": "host"}}, "INVALID_ARGUMENT", []string{"requirements.network", "none", "egress"}},
		{"sandbox_create", obj{"requirements": obj{"isolation": "strong"}}, "INVALID_ARGUMENT", []string{`"requirements.isolation" must be one of`}},
		{"sandbox_create", obj{"runtime": "nope"}, "RUNTIME_UNAVAILABLE", []string{"runc"}},
		{"file_write", obj{"sandbox_id": id, "path": "x"}, "INVALID_ARGUMENT", []string{"content"}},
		{"file_write", obj{"sandbox_id": id, "path": "x", "content": "a", "content_base64": "YQ=="}, "INVALID_ARGUMENT", []string{"not both"}},
		{"file_write", obj{"sandbox_id": id, "path": "x", "content_base64": "%%%"}, "INVALID_ARGUMENT", []string{"base64"}},
		{"file_write", obj{"sandbox_id": id, "path": "x", "content": "a", "mode": "rwx"}, "INVALID_ARGUMENT", []string{"mode"}},
		{"file_write", obj{"sandbox_id": id, "path": "x", "content": "a", "mode": 644}, "INVALID_ARGUMENT", []string{`"mode" must be a string`}},
		{"file_write", obj{"sandbox_id": id, "path": "x", "content": strings.Repeat("x", mcpserver.MaxWriteBytes+1)}, "FILE_TOO_LARGE", []string{"10 MiB", "parts", "REST"}},
		{"file_write", obj{"sandbox_id": id, "path": "/no/such/dir/x", "content": "a"}, "FILE_NOT_FOUND", []string{"mkdir"}},
		{"file_read", obj{"sandbox_id": id, "path": "/nope"}, "FILE_NOT_FOUND", nil},
		{"file_read", obj{"sandbox_id": id, "path": "x", "length": mcpserver.MaxReadBytes + 1}, "INVALID_ARGUMENT", []string{"length"}},
		{"file_read", obj{"sandbox_id": id, "path": "x", "offset": -1}, "INVALID_ARGUMENT", []string{"offset"}},
		{"file_list", obj{"sandbox_id": id, "path": "/nope"}, "FILE_NOT_FOUND", nil},
		{"health", obj{"verbose": true}, "INVALID_ARGUMENT", []string{`unknown argument "verbose"`}},
	}
	for _, tc := range cases {
		msg := c.fails(tc.tool, tc.args, tc.code)
		for _, s := range tc.says {
			if !strings.Contains(msg, s) {
				t.Errorf("%s %v: message %q lacks %q", tc.tool, tc.args, msg, s)
			}
		}
	}
	// A non-zero exit is a result, not an error.
	var ex mcpserver.ExecOut
	c.ok("exec", obj{"sandbox_id": id, "command": []string{"sh", "-c", "echo bad >&2; exit 2"}}, &ex)
	if ex.ExitCode != 2 || ex.Stderr != "bad\n" {
		t.Fatalf("non-zero exit: %+v", ex)
	}
	c.ok("exec", obj{"sandbox_id": id, "command": []string{"no-such-command"}}, &ex)
	if ex.ExitCode != 127 {
		t.Fatalf("missing command: %+v", ex)
	}
	// An unknown tool is a protocol error; the session still serves afterwards.
	if _, err := c.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "no_such_tool"}); err == nil {
		t.Fatal("unknown tool: no error")
	}
	c.ok("exec", obj{"sandbox_id": id, "command": []string{"echo", "still here"}}, &ex)
	if ex.Stdout != "still here\n" {
		t.Fatalf("after bad calls: %+v", ex)
	}
}

// panicky is a backend whose Capacity panics.
type panicky struct{ mcpserver.Backend }

func (panicky) Capacity(context.Context) (sandbox.Capacity, error) { panic("boom") }

// TestPanicRecovered: a panic in a handler is reported as an error and the session goes on.
func TestPanicRecovered(t *testing.T) {
	t.Parallel()
	srv := mcpserver.New(panicky{}, mcpserver.Options{})
	defer srv.Close()
	for _, v := range protocolVersions {
		c := connect(t, srv, v)
		msg := c.fails("health", nil, "INTERNAL")
		if !strings.Contains(msg, "recovered") {
			t.Fatalf("panic message: %q", msg)
		}
		if _, err := c.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: mcpserver.URICapacity}); err == nil || !strings.Contains(err.Error(), "internal error") {
			t.Fatalf("panicking resource: %v", err)
		}
		var l mcpserver.SandboxList
		c.ok("sandbox_list", nil, &l) // the session goes on
		c.fails("health", nil, "INTERNAL")
	}
}

// TestExecCancelKills: cancelling an exec call kills the command in the (real runc) sandbox.
func TestExecCancelKills(t *testing.T) {
	svc := service(t, sandbox.Config{})
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	c0 := connect(t, srv, protocolVersions[0])
	var sb mcpserver.SandboxInfo
	c0.ok("sandbox_create", nil, &sb)
	id := sb.SandboxID
	for i, v := range protocolVersions {
		t.Run(v, func(t *testing.T) {
			c := connect(t, srv, v)
			pidFile := fmt.Sprintf("/tmp/pid%d", i)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: obj{"sandbox_id": id,
					"command": []string{"sh", "-c", "echo $$ > " + pidFile + "; exec sleep 300"}}})
				done <- err
			}()
			var fr mcpserver.FileReadOut
			eventually(t, 10*time.Second, "the command to start", func() bool {
				res := c.call("file_read", obj{"sandbox_id": id, "path": pidFile})
				decode(t, res, &fr)
				return !res.IsError && strings.TrimSpace(deref(fr.Content)) != ""
			})
			pid := strings.TrimSpace(*fr.Content)
			var ex mcpserver.ExecOut
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"kill", "-0", pid}}, &ex)
			if ex.ExitCode != 0 {
				t.Fatalf("command not running: %+v", ex)
			}
			cancel()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("cancelled call returned no error")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("cancelled call did not return")
			}
			eventually(t, 10*time.Second, "the cancelled command to be killed", func() bool {
				c.ok("exec", obj{"sandbox_id": id, "command": []string{"kill", "-0", pid}}, &ex)
				return ex.ExitCode != 0
			})
		})
	}
}

// TestResourcesAndSubscriptions: the resources read as documented, and a subscriber to a
// sandbox is notified promptly when its state changes, whoever changed it.
func TestResourcesAndSubscriptions(t *testing.T) {
	svc := fakeService(t)
	for _, v := range protocolVersions {
		t.Run(v, func(t *testing.T) {
			srv := mcpserver.New(svc, mcpserver.Options{})
			defer srv.Close()
			ctx := context.Background()
			c := connect(t, srv, v)
			res, err := c.cs.ListResources(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var uris []string
			for _, r := range res.Resources {
				uris = append(uris, r.URI)
			}
			slices.Sort(uris)
			if !slices.Equal(uris, []string{mcpserver.URICapacity, mcpserver.URISandboxes}) {
				t.Fatalf("resources: %v", uris)
			}
			tpls, err := c.cs.ListResourceTemplates(ctx, nil)
			if err != nil || len(tpls.ResourceTemplates) != 1 || tpls.ResourceTemplates[0].URITemplate != mcpserver.URISandboxTemplate {
				t.Fatalf("templates: %+v %v", tpls, err)
			}

			var a, b mcpserver.SandboxInfo
			c.ok("sandbox_create", nil, &a)
			c.ok("sandbox_create", nil, &b)
			read := func(uri string, out any) {
				t.Helper()
				r, err := c.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
				if err != nil {
					t.Fatalf("read %s: %v", uri, err)
				}
				if len(r.Contents) != 1 || r.Contents[0].MIMEType != "application/json" || r.Contents[0].URI != uri {
					t.Fatalf("read %s: %+v", uri, r.Contents)
				}
				if err := json.Unmarshal([]byte(r.Contents[0].Text), out); err != nil {
					t.Fatalf("read %s: %v", uri, err)
				}
			}
			var l mcpserver.SandboxList
			read(mcpserver.URISandboxes, &l)
			if l.Count != 2 || l.Sandboxes[0].SandboxID != a.SandboxID || l.Sandboxes[1].SandboxID != b.SandboxID {
				t.Fatalf("sandboxes resource: %+v", l)
			}
			var one mcpserver.SandboxInfo
			read(mcpserver.SandboxURI(a.SandboxID), &one)
			if one.SandboxID != a.SandboxID || one.State != "running" {
				t.Fatalf("sandbox resource: %+v", one)
			}
			var capa mcpserver.CapacityInfo
			read(mcpserver.URICapacity, &capa)
			if capa.Live < 2 || capa.MaxSandboxes != 200 {
				t.Fatalf("capacity resource: %+v", capa)
			}
			if _, err := c.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.SandboxURI("sb-0123456789ab")}); err == nil {
				t.Fatal("reading an unknown sandbox: no error")
			}

			// Subscribe to a; destroy it through the tool: notified. Subscribe to b; destroy
			// it behind the MCP server's back: notified too (the service's event bus).
			for _, u := range []string{mcpserver.SandboxURI(a.SandboxID), mcpserver.SandboxURI(b.SandboxID)} {
				if err := c.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: u}); err != nil {
					t.Fatalf("subscribe %s: %v", u, err)
				}
			}
			time.Sleep(150 * time.Millisecond)
			if u := c.updates(); len(u) != 0 {
				t.Fatalf("notified before any change: %v", u)
			}
			c.ok("sandbox_destroy", obj{"sandbox_id": a.SandboxID}, nil)
			eventually(t, time.Second, "a notification for a", func() bool { return slices.Contains(c.updates(), mcpserver.SandboxURI(a.SandboxID)) })
			if slices.Contains(c.updates(), mcpserver.SandboxURI(b.SandboxID)) {
				t.Fatalf("b notified although unchanged: %v", c.updates())
			}
			if _, err := svc.Destroy(ctx, b.SandboxID); err != nil {
				t.Fatal(err)
			}
			eventually(t, time.Second, "a notification for b", func() bool { return slices.Contains(c.updates(), mcpserver.SandboxURI(b.SandboxID)) })

			// Unsubscribed: no more notifications.
			if err := c.cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: mcpserver.SandboxURI(a.SandboxID)}); err != nil {
				t.Fatal(err)
			}
			// Any URI may be subscribed to (only agentbox:// ones change); a malformed sandbox
			// URI is refused.
			if err := c.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://watched-resource"}); err != nil {
				t.Fatalf("subscribe to another URI: %v", err)
			}
			// (Under 2026-07-28 a subscription is a background listen whose refusal the SDK's
			// client does not return.)
			if err := c.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "agentbox://sandboxes/nope"}); err == nil && v < "2026" {
				t.Fatal("subscribe to a malformed sandbox URI: no error")
			}
		})
	}
}

// TestPromptsAndCompletion: both prompts are listed with their arguments and render with them;
// sandbox ids complete.
func TestPromptsAndCompletion(t *testing.T) {
	svc := fakeService(t)
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[1])
	ctx := context.Background()
	ps, err := c.cs.ListPrompts(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	args := map[string][]string{}
	for _, p := range ps.Prompts {
		for _, a := range p.Arguments {
			args[p.Name] = append(args[p.Name], a.Name)
		}
	}
	if !slices.Equal(args[mcpserver.PromptTestRepo], []string{"repo", "command"}) || !slices.Equal(args[mcpserver.PromptReproduceBug], []string{"description", "repo"}) || len(ps.Prompts) != 2 {
		t.Fatalf("prompts: %v", args)
	}
	g, err := c.cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: mcpserver.PromptTestRepo, Arguments: map[string]string{"repo": "/src/proj", "command": "go test ./..."}})
	if err != nil {
		t.Fatal(err)
	}
	body := g.Messages[0].Content.(*mcp.TextContent).Text
	for _, s := range []string{"/src/proj", "go test ./...", "sandbox_create", "sandbox_destroy", "NO network", "file_write"} {
		if !strings.Contains(body, s) {
			t.Errorf("test prompt lacks %q:\n%s", s, body)
		}
	}
	g, err = c.cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: mcpserver.PromptReproduceBug, Arguments: map[string]string{"description": "segfault on empty input"}})
	if err != nil || !strings.Contains(g.Messages[0].Content.(*mcp.TextContent).Text, "segfault on empty input") {
		t.Fatalf("bug prompt: %v %v", g, err)
	}
	if _, err := c.cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: mcpserver.PromptTestRepo}); err == nil || !strings.Contains(err.Error(), `"repo"`) {
		t.Fatalf("prompt without its required argument: %v", err)
	}

	var a mcpserver.SandboxInfo
	c.ok("sandbox_create", nil, &a)
	other, err := svc.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	complete := func(ref *mcp.CompleteReference, name, value string) []string {
		t.Helper()
		r, err := c.cs.Complete(ctx, &mcp.CompleteParams{Ref: ref, Argument: mcp.CompleteParamsArgument{Name: name, Value: value}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Completion.Values
	}
	tpl := &mcp.CompleteReference{Type: "ref/resource", URI: mcpserver.URISandboxTemplate}
	if got := complete(tpl, "id", "sb-"); len(got) != 2 || got[0] != a.SandboxID || got[1] != other.ID {
		t.Fatalf("complete sb-: %v (want this server's %s first, then %s)", got, a.SandboxID, other.ID)
	}
	if got := complete(tpl, "id", a.SandboxID[:6]); !slices.Contains(got, a.SandboxID) {
		t.Fatalf("complete %s: %v", a.SandboxID[:6], got)
	}
	if got := complete(tpl, "id", "sb-zzz"); len(got) != 0 {
		t.Fatalf("complete sb-zzz: %v", got)
	}
	if got := complete(&mcp.CompleteReference{Type: "ref/prompt", Name: mcpserver.PromptTestRepo}, "command", "go"); !slices.Equal(got, []string{"go test ./..."}) {
		t.Fatalf("complete command: %v", got)
	}
	if got := complete(&mcp.CompleteReference{Type: "ref/prompt", Name: "unknown"}, "x", "y"); got == nil || len(got) != 0 {
		t.Fatalf("complete unknown prompt: %#v", got)
	}
}

// TestHeldList: sandbox_list, the sandboxes resource and health read one list — the sandboxes
// this server created that it still holds; a finished one is reported once (with why) and then
// drops out; past the live bound creation is refused and the list is not shortened.
func TestHeldList(t *testing.T) {
	svc := fakeServiceWith(t, sandbox.Config{MaxSandboxes: 3})
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	ctx := context.Background()
	ids := func(l mcpserver.SandboxList) []string {
		var out []string
		for _, s := range l.Sandboxes {
			out = append(out, s.SandboxID+":"+s.State)
		}
		return out
	}
	var a, b mcpserver.SandboxInfo
	c.ok("sandbox_create", nil, &a)
	c.ok("sandbox_create", nil, &b)
	if _, err := svc.Create(ctx, sandbox.CreateRequest{}); err != nil { // not this server's
		t.Fatal(err)
	}
	msg := c.fails("sandbox_create", nil, "CAPACITY_UNAVAILABLE")
	if !strings.Contains(msg, "destroy") {
		t.Fatalf("capacity message: %q", msg)
	}
	var l mcpserver.SandboxList
	c.ok("sandbox_list", nil, &l)
	if got := ids(l); !slices.Equal(got, []string{a.SandboxID + ":running", b.SandboxID + ":running"}) || l.Count != 2 {
		t.Fatalf("list at the bound: %v", got)
	}
	var h mcpserver.HealthOut
	c.ok("health", nil, &h)
	if h.Count != 2 || h.Capacity.Free != 0 || h.Capacity.Live != 3 {
		t.Fatalf("health at the bound: %+v", h)
	}

	// b is destroyed behind the server's back: the next list reports it once, with why.
	if _, err := svc.Destroy(ctx, b.SandboxID); err != nil {
		t.Fatal(err)
	}
	txt := c.ok("sandbox_list", nil, &l)
	if got := ids(l); !slices.Equal(got, []string{a.SandboxID + ":running", b.SandboxID + ":destroyed"}) || l.Sandboxes[1].Reason != "destroy requested" {
		t.Fatalf("list after destroy: %v %+v", got, l.Sandboxes)
	}
	if !strings.Contains(txt, "reported this once") {
		t.Fatalf("list text should say finished ones drop out: %q", txt)
	}
	c.ok("sandbox_list", nil, &l)
	if got := ids(l); !slices.Equal(got, []string{a.SandboxID + ":running"}) {
		t.Fatalf("list after reporting: %v", got)
	}

	// An expired sandbox: reported once by whichever reader sees it first (here health).
	var d mcpserver.SandboxInfo
	c.ok("sandbox_create", obj{"ttl_seconds": 1}, &d)
	time.Sleep(1100 * time.Millisecond)
	if err := svc.Converge(ctx); err != nil {
		t.Fatalf("converge: %v", err)
	}
	c.ok("health", nil, &h)
	if len(h.Sandboxes) != 2 || h.Sandboxes[1].SandboxID != d.SandboxID || h.Sandboxes[1].State != "destroyed" || h.Sandboxes[1].Reason != "ttl expired" {
		t.Fatalf("health after expiry: %+v", h.Sandboxes)
	}
	r, err := c.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.URISandboxes})
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal([]byte(r.Contents[0].Text), &l)
	if got := ids(l); !slices.Equal(got, []string{a.SandboxID + ":running"}) {
		t.Fatalf("resource after expiry was reported: %v", got)
	}

	// Destroying through the tool reports the end at once: it never shows up in a list.
	c.ok("sandbox_destroy", obj{"sandbox_id": a.SandboxID}, nil)
	c.ok("sandbox_list", nil, &l)
	if l.Count != 0 || l.Sandboxes == nil {
		t.Fatalf("list after destroying everything: %+v", l)
	}
}

// TestAdopt: a server that owns its control plane lists, after a restart, the sandboxes that
// survived it.
func TestAdopt(t *testing.T) {
	svc := fakeService(t)
	ctx := context.Background()
	sb, err := svc.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	var l mcpserver.SandboxList
	c.ok("sandbox_list", nil, &l)
	if l.Count != 0 {
		t.Fatalf("before Adopt the list holds %+v", l.Sandboxes)
	}
	if err := srv.Adopt(ctx); err != nil {
		t.Fatal(err)
	}
	c.ok("sandbox_list", nil, &l)
	if l.Count != 1 || l.Sandboxes[0].SandboxID != sb.ID {
		t.Fatalf("after Adopt: %+v", l.Sandboxes)
	}
}

// TestExecToolLogic: the exec and file tools' own logic, on the fake runtime (no root, every
// mode): output streamed as progress only with a progress token, stdin and env passed, a
// timeout reported as timed_out with SIGKILL, a non-zero exit a result, text and binary files
// in and out by range, listing, and a sandbox's end refusing exec. (TestLoop runs the same path
// end to end on runc.)
func TestExecToolLogic(t *testing.T) {
	svc := fakeService(t)
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	for _, v := range protocolVersions {
		t.Run(v, func(t *testing.T) {
			c := connect(t, srv, v)
			var sb mcpserver.SandboxInfo
			c.ok("sandbox_create", nil, &sb)
			id := sb.SandboxID

			res := c.callCtx(context.Background(), "exec", obj{"sandbox_id": id, "command": []string{"sh", "-c",
				"echo one; sleep 0.3; echo two >&2; exit 3"}}, "tok")
			var ex mcpserver.ExecOut
			decode(t, res, &ex)
			if res.IsError || ex.ExitCode != 3 || ex.Stdout != "one\n" || ex.Stderr != "two\n" || ex.StdoutBytes != 4 || !strings.Contains(text(res), "exit_code 3") {
				t.Fatalf("exec: %+v %q", ex, text(res))
			}
			eventually(t, 2*time.Second, "the output as progress", func() bool {
				var all strings.Builder
				for _, m := range c.progressMessages() {
					all.WriteString(m)
				}
				return strings.Contains(all.String(), "one\n") && strings.Contains(all.String(), "two\n")
			})
			n := len(c.progressMessages())
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"sh", "-c", `cat; printf ' %s' "$X"`}, "stdin": "in", "env": obj{"X": "y"}}, &ex)
			if ex.Stdout != "in y" {
				t.Fatalf("stdin/env: %+v", ex)
			}
			if got := len(c.progressMessages()); got != n {
				t.Fatalf("exec without a progress token streamed %d notifications", got-n)
			}
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"sleep", "30"}, "timeout_seconds": 0.5}, &ex)
			if !ex.TimedOut || ex.Signal != "SIGKILL" || ex.ExitCode != 137 {
				t.Fatalf("timeout: %+v", ex)
			}

			var fw mcpserver.FileWriteOut
			c.ok("file_write", obj{"sandbox_id": id, "path": "a.txt", "content": "héllo\n", "mode": "0600"}, &fw)
			if fw.Size != int64(len("héllo\n")) || fw.Mode != "0600" {
				t.Fatalf("file_write: %+v", fw)
			}
			var fr mcpserver.FileReadOut
			c.ok("file_read", obj{"sandbox_id": id, "path": "a.txt"}, &fr)
			if fr.Encoding != "utf-8" || deref(fr.Content) != "héllo\n" || !fr.EOF {
				t.Fatalf("file_read: %+v", fr)
			}
			bin := []byte{0, 1, 2, 0xff, 0xfe, 5}
			c.ok("file_write", obj{"sandbox_id": id, "path": "b.dat", "content_base64": base64.StdEncoding.EncodeToString(bin)}, &fw)
			c.ok("file_read", obj{"sandbox_id": id, "path": "b.dat", "offset": 2, "length": 3}, &fr)
			got, _ := base64.StdEncoding.DecodeString(deref(fr.ContentBase64))
			if fr.Encoding != "base64" || !bytes.Equal(got, bin[2:5]) || fr.EOF || fr.NextOffset != 5 {
				t.Fatalf("file_read range: %+v", fr)
			}
			var dl mcpserver.FileListOut
			c.ok("file_list", obj{"sandbox_id": id, "path": "."}, &dl)
			var names []string
			for _, e := range dl.Entries {
				names = append(names, e.Name)
			}
			if !slices.Equal(names, []string{"a.txt", "b.dat"}) || dl.Total != 2 {
				t.Fatalf("file_list: %+v", dl)
			}

			c.ok("sandbox_destroy", obj{"sandbox_id": id}, nil)
			c.fails("exec", obj{"sandbox_id": id, "command": []string{"true"}}, "SANDBOX_NOT_RUNNING")
		})
	}
}
