package mcpserver_test

import (
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// snapshotBackends runs f against an MCP server over the control plane in process, on the fake
// control plane (no snapshot directory).
func snapshotBackends(t *testing.T, f func(t *testing.T, c *client, svc *sandbox.Service)) {
	snapshotBackendsWith(t, func(*testing.T) sandbox.Config { return sandbox.Config{} }, f)
}

// snapshotBackendsWith is snapshotBackends with the config cfg returns.
func snapshotBackendsWith(t *testing.T, cfg func(*testing.T) sandbox.Config, f func(t *testing.T, c *client, svc *sandbox.Service)) {
	t.Run("in-process", func(t *testing.T) {
		svc := fakeServiceWith(t, cfg(t))
		srv := mcpserver.New(svc, mcpserver.Options{})
		t.Cleanup(srv.Close)
		f(t, connect(t, srv, protocolVersions[1]), svc.Service)
	})
}

// TestSnapshotToolsValidation: every numeric argument of the snapshot tools is checked against
// its published range and refused (never clamped) with INVALID_ARGUMENT naming it and the
// range; contradictory arguments are refused before the service is asked.
func TestSnapshotToolsValidation(t *testing.T) {
	snapshotBackends(t, func(t *testing.T, c *client, _ *sandbox.Service) {
		var sb mcpserver.SandboxInfo
		c.ok("sandbox_create", nil, &sb)
		id := sb.SandboxID
		for _, tc := range []struct {
			tool string
			args obj
			want []string // in the message
		}{
			{"sandbox_fork", obj{"sandbox_id": id, "count": 0}, []string{"count", "1"}},
			{"sandbox_fork", obj{"sandbox_id": id, "count": 21}, []string{"count", "20"}},
			{"sandbox_fork", obj{"sandbox_id": id, "count": 2.5}, []string{"count"}},
			{"sandbox_fork", obj{"sandbox_id": id, "ttl_seconds": 0}, []string{"ttl_seconds", "1"}},
			{"sandbox_fork", obj{"sandbox_id": id, "snapshot_id": "snap-x", "memory": true}, []string{"snapshot_id", "memory"}},
			{"sandbox_fork", obj{"count": 2}, []string{"sandbox_id"}},
			{"snapshot_list", obj{"limit": 0}, []string{"limit", "1"}},
			{"snapshot_list", obj{"limit": 1001}, []string{"limit", "1000"}},
			{"snapshot_delete", obj{}, []string{"snapshot_id"}},
			{"snapshot_delete", obj{"snapshot_id": "../../etc"}, []string{"snapshot_id", "snap-"}},
			{"sandbox_snapshot", obj{"sandbox_id": id, "memory": "yes"}, []string{"memory"}},
			{"sandbox_snapshot", obj{"sandbox_id": id, "bogus": 1}, []string{"bogus"}},
			{"sandbox_sleep", obj{}, []string{"sandbox_id"}},
			{"sandbox_wake", obj{}, []string{"sandbox_id"}},
			{"sandbox_diff", obj{"sandbox_id": id, "limit": 10001}, []string{"limit", "10000"}},
			{"sandbox_diff", obj{"sandbox_id": id, "limit": 0}, []string{"limit"}},
			{"sandbox_diff", obj{"sandbox_id": id, "max_diff_bytes": 0}, []string{"max_diff_bytes"}},
			{"sandbox_diff", obj{"sandbox_id": id, "max_diff_bytes": 1<<20 + 1}, []string{"max_diff_bytes", "1048576"}},
			{"sandbox_diff", obj{"sandbox_id": id, "other_sandbox_id": id, "snapshot_id": "snap-x"}, []string{"other_sandbox_id", "snapshot_id"}},
		} {
			msg := c.fails(tc.tool, tc.args, "INVALID_ARGUMENT")
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%s(%v): message %q does not name %q", tc.tool, tc.args, msg, w)
				}
			}
		}
	})
}

// TestSnapshotToolsUnsupported: on a server that keeps no snapshots (no snapshot directory),
// every tool that needs one passes the service's UNSUPPORTED_OPERATION through, over both
// Backends, with the code in structured content and text.
func TestSnapshotToolsUnsupported(t *testing.T) {
	snapshotBackends(t, func(t *testing.T, c *client, _ *sandbox.Service) {
		var sb mcpserver.SandboxInfo
		c.ok("sandbox_create", nil, &sb)
		id := sb.SandboxID
		for _, tc := range []struct {
			tool string
			args obj
		}{
			{"sandbox_snapshot", obj{"sandbox_id": id, "memory": true}},
			{"snapshot_list", obj{"sandbox_id": id}},
			{"snapshot_delete", obj{"snapshot_id": "snap-0123456789ab"}},
			{"sandbox_fork", obj{"sandbox_id": id, "count": 2}},
			{"sandbox_sleep", obj{"sandbox_id": id}},
			{"sandbox_create", obj{"snapshot": "snap-0123456789ab"}},
		} {
			if msg := c.fails(tc.tool, tc.args, "UNSUPPORTED_OPERATION"); msg == "" {
				t.Errorf("%s: no message", tc.tool)
			}
		}
	})
}

// withSnapshots is the fake control plane's config with a snapshot directory.
func withSnapshots(t *testing.T) sandbox.Config { return sandbox.Config{SnapshotDir: t.TempDir()} }

// TestSnapshotForkDiffTools drives the real control plane on the fake runtime through the MCP
// tools, over both Backends: exec with changes and checkpoint, sandbox_snapshot, snapshot_list
// (paged), sandbox_fork of 2 (held by this client, independent files), sandbox_diff against the
// snapshot, a sibling and the image, snapshot_delete and SNAPSHOT_NOT_FOUND after it.
func TestSnapshotForkDiffTools(t *testing.T) {
	snapshotBackendsWith(t, withSnapshots, func(t *testing.T, c *client, _ *sandbox.Service) {
		var sb mcpserver.SandboxInfo
		c.ok("sandbox_create", obj{"labels": obj{"src": "yes"}}, &sb)
		id := sb.SandboxID
		sh := func(id, script string) mcpserver.ExecOut {
			t.Helper()
			var out mcpserver.ExecOut
			c.ok("exec", obj{"sandbox_id": id, "command": []string{"sh", "-c", script}}, &out)
			if out.ExitCode != 0 {
				t.Fatalf("%q: %+v", script, out)
			}
			return out
		}
		var ex mcpserver.ExecOut
		text := c.ok("exec", obj{"sandbox_id": id, "command": []string{"sh", "-c", "echo one > a.txt"}, "changes": true, "checkpoint": true}, &ex)
		if len(ex.Changes) != 1 || ex.Changes[0].Path != "/workspace/a.txt" || ex.Changes[0].Change != "added" || ex.SnapshotID == "" || !strings.Contains(text, "A /workspace/a.txt") {
			t.Fatalf("exec changes/checkpoint: %+v %q", ex, text)
		}
		c.fails("exec", obj{"sandbox_id": id, "command": []string{"true"}, "background": true, "changes": true}, "INVALID_ARGUMENT")

		var snap mcpserver.SnapshotInfo
		c.ok("sandbox_snapshot", obj{"sandbox_id": id, "labels": obj{"at": "one"}}, &snap)
		if snap.Kind != "files" || snap.State != "ready" || snap.SandboxID != id || snap.Labels["at"] != "one" {
			t.Fatalf("snapshot: %+v", snap)
		}
		if msg := c.fails("sandbox_snapshot", obj{"sandbox_id": id, "memory": true}, "UNSUPPORTED_OPERATION"); !strings.Contains(msg, "memory") {
			t.Fatalf("memory on the fake: %q", msg)
		}
		var p1, p2 mcpserver.SnapshotListOut
		c.ok("snapshot_list", obj{"sandbox_id": id, "limit": 1}, &p1)
		c.ok("snapshot_list", obj{"sandbox_id": id, "limit": 1, "cursor": p1.NextCursor}, &p2)
		if p1.Count != 1 || p1.NextCursor == "" || p2.Count != 1 || p2.Snapshots[0].SnapshotID == p1.Snapshots[0].SnapshotID {
			t.Fatalf("pages: %+v %+v", p1, p2)
		}

		sh(id, "echo two > a.txt && echo new > c.txt")
		var fo mcpserver.ForkOut
		c.ok("sandbox_fork", obj{"sandbox_id": id, "count": 2, "snapshot_id": snap.SnapshotID, "ttl_seconds": 600}, &fo)
		if fo.Count != 2 || fo.SnapshotID != snap.SnapshotID || fo.Kind != "files" || fo.Sandboxes[0].FromSnapshot != snap.SnapshotID || fo.Sandboxes[0].State != "running" {
			t.Fatalf("fork: %+v", fo)
		}
		f1, f2 := fo.Sandboxes[0].SandboxID, fo.Sandboxes[1].SandboxID
		var held mcpserver.SandboxList
		c.ok("sandbox_list", nil, &held)
		if held.Count != 3 {
			t.Fatalf("sandbox_list after a fork of 2 holds %d, want 3: %+v", held.Count, held)
		}
		if out := sh(f1, "cat a.txt"); out.Stdout != "one\n" {
			t.Fatalf("fork's a.txt %q", out.Stdout)
		}
		sh(f1, "echo f1 > a.txt")
		if out := sh(f2, "cat a.txt"); out.Stdout != "one\n" {
			t.Fatalf("forks share files: %q", out.Stdout)
		}

		var d mcpserver.DiffOut
		text = c.ok("sandbox_diff", obj{"sandbox_id": id, "snapshot_id": snap.SnapshotID}, &d)
		got := map[string]string{}
		for _, ch := range d.Changes {
			got[ch.Path] = ch.Change
		}
		if d.Against != "snapshot:"+snap.SnapshotID || got["/workspace/a.txt"] != "modified" || got["/workspace/c.txt"] != "added" || d.Count != len(d.Changes) ||
			!strings.Contains(d.Diff, "+two") || !strings.Contains(text, "M /workspace/a.txt") {
			t.Fatalf("diff against the snapshot: %+v %q", d, text)
		}
		d = mcpserver.DiffOut{} // decoding leaves fields the reply omits as they were
		c.ok("sandbox_diff", obj{"sandbox_id": id, "snapshot_id": snap.SnapshotID, "limit": 1, "no_unified": true}, &d)
		if d.Count != 1 || d.NextCursor == "" || d.Diff != "" {
			t.Fatalf("diff page: %+v", d)
		}
		d = mcpserver.DiffOut{}
		c.ok("sandbox_diff", obj{"sandbox_id": f1, "other_sandbox_id": f2}, &d)
		if d.Against != "sandbox:"+f2 || d.Count != 1 || d.Changes[0].Path != "/workspace/a.txt" {
			t.Fatalf("diff of forks: %+v", d)
		}
		d = mcpserver.DiffOut{}
		c.ok("sandbox_diff", obj{"sandbox_id": f2}, &d)
		if !strings.HasPrefix(d.Against, "image:") {
			t.Fatalf("diff against the image: %+v", d)
		}

		var del mcpserver.SnapshotDeleteOut
		c.ok("snapshot_delete", obj{"snapshot_id": snap.SnapshotID}, &del)
		if !del.Deleted {
			t.Fatalf("delete: %+v", del)
		}
		c.fails("snapshot_delete", obj{"snapshot_id": snap.SnapshotID}, "SNAPSHOT_NOT_FOUND")
		c.fails("sandbox_fork", obj{"sandbox_id": id, "snapshot_id": snap.SnapshotID}, "SNAPSHOT_NOT_FOUND")
		c.fails("sandbox_diff", obj{"sandbox_id": id, "snapshot_id": snap.SnapshotID}, "SNAPSHOT_NOT_FOUND")
		// Create from the checkpoint the exec took.
		var from mcpserver.SandboxInfo
		c.ok("sandbox_create", obj{"snapshot": ex.SnapshotID, "auto_wake": true}, &from)
		if from.FromSnapshot != ex.SnapshotID || !from.AutoWake {
			t.Fatalf("create from a snapshot: %+v", from)
		}
		if out := sh(from.SandboxID, "cat a.txt"); out.Stdout != "one\n" {
			t.Fatalf("create from the checkpoint: a.txt %q", out.Stdout)
		}
	})
}

// TestSleepWakeTools: sandbox_sleep parks a sandbox (state sleeping, slept_at); exec on it is
// SANDBOX_NOT_RUNNING saying to wake it; sandbox_wake brings it back under the same id with its
// files; a sandbox created with auto_wake is woken by exec itself. Over both Backends.
func TestSleepWakeTools(t *testing.T) {
	snapshotBackendsWith(t, withSnapshots, func(t *testing.T, c *client, _ *sandbox.Service) {
		var sb mcpserver.SandboxInfo
		c.ok("sandbox_create", nil, &sb)
		id := sb.SandboxID
		var ex mcpserver.ExecOut
		c.ok("exec", obj{"sandbox_id": id, "command": []string{"sh", "-c", "echo kept > k.txt"}}, &ex)

		var slept mcpserver.SandboxInfo
		c.ok("sandbox_sleep", obj{"sandbox_id": id}, &slept)
		if slept.State != "sleeping" || slept.SleptAt.IsZero() {
			t.Fatalf("sleep: %+v", slept)
		}
		if msg := c.fails("exec", obj{"sandbox_id": id, "command": []string{"true"}}, "SANDBOX_NOT_RUNNING"); !strings.Contains(msg, "sandbox_wake") {
			t.Fatalf("exec on a sleeping sandbox: %q does not say to wake it", msg)
		}
		var again mcpserver.SandboxInfo
		c.ok("sandbox_sleep", obj{"sandbox_id": id}, &again) // as it is
		if again.State != "sleeping" {
			t.Fatalf("sleep of a sleeping sandbox: %+v", again)
		}
		var woke mcpserver.SandboxInfo // fresh: slept_at must be absent from the reply
		c.ok("sandbox_wake", obj{"sandbox_id": id}, &woke)
		if woke.SandboxID != id || woke.State != "running" || !woke.SleptAt.IsZero() {
			t.Fatalf("wake: %+v", woke)
		}
		c.ok("exec", obj{"sandbox_id": id, "command": []string{"cat", "k.txt"}}, &ex)
		if ex.Stdout != "kept\n" {
			t.Fatalf("files after wake: %q", ex.Stdout)
		}

		var aw mcpserver.SandboxInfo
		c.ok("sandbox_create", obj{"auto_wake": true, "ttl_while_sleeping": true}, &aw)
		if !aw.AutoWake || !aw.TTLWhileSleeping {
			t.Fatalf("create auto_wake: %+v", aw)
		}
		c.ok("sandbox_sleep", obj{"sandbox_id": aw.SandboxID}, &slept)
		c.ok("exec", obj{"sandbox_id": aw.SandboxID, "command": []string{"true"}}, &ex) // wakes it
		var got mcpserver.SandboxInfo
		c.ok("sandbox_get", obj{"sandbox_id": aw.SandboxID}, &got)
		if got.State != "running" {
			t.Fatalf("auto_wake: after exec the sandbox is %s", got.State)
		}
		c.ok("sandbox_destroy", obj{"sandbox_id": id}, &got)
		c.fails("sandbox_wake", obj{"sandbox_id": id}, "SANDBOX_NOT_RUNNING")
	})
}
