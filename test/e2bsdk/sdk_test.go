// Package e2bsdk runs E2B's own SDKs — npm e2b and @e2b/code-interpreter, pinned by
// package-lock.json — against a real `agentbox serve` with real runc sandboxes. The scripts are
// written for E2B and run unchanged but for their environment (E2B_API_URL and E2B_SANDBOX_URL
// at the server, E2B_API_KEY an agentbox API key). `make test` installs the SDKs (npm ci in this
// directory) first; without them the test fails, never skips.
package e2bsdk

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

const installHint = "run make test (it installs E2B's SDKs: npm ci in test/e2bsdk)"

// requireSDKs returns node, failing when the SDKs are not installed or older than the lock.
func requireSDKs(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed: %s", installHint)
	}
	for _, f := range []string{"node_modules/e2b/package.json", "node_modules/@e2b/code-interpreter/package.json"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("test/e2bsdk/%s is missing: %s", f, installHint)
		}
	}
	lock, err1 := os.Stat("package-lock.json")
	installed, err2 := os.Stat("node_modules/.package-lock.json")
	if err1 != nil || err2 != nil || installed.ModTime().Before(lock.ModTime()) {
		t.Fatalf("test/e2bsdk/node_modules is older than package-lock.json: %s", installHint)
	}
	return node
}

// node runs script with env and returns its output, failing the test (with the output and the
// server's log) when it exits non-zero or prints fewer than want "ok" lines.
func node(t *testing.T, bin string, s *testenv.Server, env []string, want int, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, script)
	cmd.Env = append(os.Environ(), append([]string{"E2B_API_URL=" + s.URL, "E2B_SANDBOX_URL=" + s.URL}, env...)...)
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	oks := strings.Count("\n"+string(out), "\nok ")
	if err != nil || oks < want {
		t.Fatalf("node %s: %v after %s, %d of %d steps ok\n%s\nserver log:\n%s", script, err, time.Since(start).Round(time.Millisecond), oks, want, out, s.Logs)
	}
	t.Logf("node %s: ok in %s\n%s", script, time.Since(start).Round(time.Millisecond), out)
	return string(out)
}

func key(t *testing.T, c *client.Client, name, scope string) string {
	t.Helper()
	k, err := c.CreateKey(t.Context(), wire.KeyCreateRequest{Name: name, Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	return k.Secret
}

func TestE2BSDKs(t *testing.T) {
	testenv.RequireRoot(t)
	bin := requireSDKs(t)
	dir := testenv.ShortTempDir(t, "abe2b")
	t.Cleanup(func() {
		if leaks := testenv.LeaksAfter(10*time.Second, filepath.Base(dir)); len(leaks) > 0 {
			t.Errorf("host resources left behind:\n  %s", strings.Join(leaks, "\n  "))
		}
	})
	s := testenv.StartServer(t, dir, "e2b-test-token-0123456789")
	c := s.Client()
	operate := key(t, c, "e2b-operate", "operate")
	env := []string{"E2B_API_KEY=" + operate}

	t.Run("Flow", func(t *testing.T) {
		out := node(t, bin, s, env, 11, "basic.mjs")
		for _, step := range []string{"ok commands.run \"hi\\n\"", "ok files", "ok background", "ok pty", "ok getMetrics", "ok kill"} {
			if !strings.Contains(out, step) {
				t.Errorf("missing step %q", step)
			}
		}
	})
	t.Run("Stdin", func(t *testing.T) { node(t, bin, s, env, 4, "stdin.mjs") })
	// setTimeout shortens: the control loop ends the sandbox once its new end has passed, within
	// one tick of the loop (a second; the step then starts at once) — read from the recorded
	// events, not from how long a poll took.
	t.Run("SetTimeoutShortens", func(t *testing.T) {
		out := node(t, bin, s, env, 4, "timeout.mjs")
		set := time.Now()
		id := out[strings.LastIndex(out, "ok setTimeout ")+len("ok setTimeout "):]
		id = strings.TrimSpace(id[:strings.IndexByte(id, '\n')])
		sb, err := c.Get(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if l := time.Until(sb.ExpiresAt); sb.State == wire.StateRunning && (l > 2*time.Second || l < -time.Second) {
			t.Fatalf("after setTimeout(2 s) the sandbox ends in %s (at %s)", l, sb.ExpiresAt)
		}
		const tick = time.Second // the control loop's period
		bound := sb.ExpiresAt.Add(tick + time.Second)
		// Poll the state until the loop has moved it (a failure bound, not the measure).
		for deadline := set.Add(time.Minute); sb.State == wire.StateRunning; {
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s still running a minute after its end %s", id, sb.ExpiresAt)
			}
			time.Sleep(100 * time.Millisecond)
			if sb, err = c.Get(t.Context(), id); err != nil {
				t.Fatal(err)
			}
		}
		evs, err := c.Events(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		var ended *wire.Event
		for i := range evs {
			if evs[i].From == wire.StateRunning && evs[i].To != wire.StateRunning {
				ended = &evs[i]
				break
			}
		}
		if ended == nil || ended.At.After(bound) || ended.At.Before(sb.ExpiresAt) || ended.Reason != "ttl expired" {
			t.Fatalf("the sandbox's end (due %s, by %s) is not recorded in time: %+v", sb.ExpiresAt, bound, evs)
		}
		t.Logf("ended %s after its due time (%s → %s: %s)", ended.At.Sub(sb.ExpiresAt), ended.From, ended.To, ended.Reason)
	})
	// allowInternetAccess and network map onto agentbox's egress policy, read back from the
	// sandboxes' records (no network unless asked).
	t.Run("Network", func(t *testing.T) {
		before, err := c.List(t.Context(), []string{"creating", "running"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := node(t, bin, s, env, 4, "network.mjs")
		want := map[string]string{"default": `"none"`, "internet": `{"allow":["*"],"deny":[]}`, "allowOut": `{"allow":["pypi.org"],"deny":[]}`}
		for step, policy := range want {
			i := strings.Index(out, "ok "+step+" ")
			if i < 0 {
				t.Fatalf("no step %q in %s", step, out)
			}
			id := strings.Fields(out[i:])[2]
			evs, err := c.Events(t.Context(), id)
			if err != nil || len(evs) == 0 {
				t.Fatalf("%s: events of %s: %v", step, id, err)
			}
			sb, err := c.Get(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := json.Marshal(sb.Network); string(got) != policy {
				t.Errorf("%s: sandbox %s has network %s, want %s", step, id, got, policy)
			}
		}
		after, err := c.List(t.Context(), []string{"creating", "running"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(after) > len(before) {
			t.Errorf("the refused create left a sandbox: %d live before, %d after", len(before), len(after))
		}
	})
	t.Run("CodeInterpreter", func(t *testing.T) {
		out := node(t, bin, s, env, 7, "code.mjs")
		if !strings.Contains(out, "ok state 42") || !strings.Contains(out, "ok error ZeroDivisionError") {
			t.Errorf("code interpreter steps: %s", out)
		}
	})
	t.Run("PauseResume", func(t *testing.T) { node(t, bin, s, env, 4, "pause.mjs") })
	t.Run("READMEExamples", func(t *testing.T) {
		if out := node(t, bin, s, env, 0, "readme-e2b.mjs"); strings.TrimSpace(out) != "Hello from E2B!" {
			t.Errorf("e2b README example printed %q", out)
		}
		if out := node(t, bin, s, env, 0, "readme-code-interpreter.mjs"); strings.TrimSpace(out) != "2" {
			t.Errorf("code interpreter README example printed %q", out)
		}
	})
	t.Run("Errors", func(t *testing.T) {
		node(t, bin, s, append(env, "READ_KEY="+key(t, c, "e2b-read", "read"), "OTHER_KEY="+key(t, c, "e2b-other", "operate"),
			"BAD_KEY=abk_0000000000000000000000000000000000000000"), 5, "errors.mjs")
	})
	// Two SDK programs at once, each on sandboxes of its own.
	t.Run("Concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		for _, script := range []string{"basic.mjs", "code.mjs"} {
			wg.Go(func() { node(t, bin, s, env, 7, script) })
		}
		wg.Wait()
	})
	// E2B's host scheme: {port}-{id}.localhost names envd; the credential that created the
	// sandbox (here the server's token) authenticates, another principal's key finds nothing.
	t.Run("HostScheme", func(t *testing.T) {
		sb, err := c.Create(t.Context(), wire.CreateRequest{TTLSeconds: 120})
		if err != nil {
			t.Fatal(err)
		}
		port := s.URL[strings.LastIndex(s.URL, ":")+1:]
		do := func(method, path, body string, hdr map[string]string) (int, string) {
			req, _ := http.NewRequest(method, s.URL+path, strings.NewReader(body))
			req.Host = "49983-" + sb.ID + ".localhost:" + port
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := do("GET", "/health", "", map[string]string{"X-Access-Token": s.Token}); code != http.StatusNoContent {
			t.Errorf("envd /health by host: %d %s", code, body)
		}
		if code, body := do("GET", "/health", "", map[string]string{"X-Access-Token": operate}); code != http.StatusBadGateway {
			t.Errorf("envd /health by host with another principal's key: %d %s, want 502 (E2B's answer for a sandbox not there)", code, body)
		}
		if code, body := do("GET", "/health", "", nil); code != http.StatusUnauthorized {
			t.Errorf("envd /health by host without a key: %d %s, want 401", code, body)
		}
		code, body := do("POST", "/filesystem.Filesystem/Stat", `{"path":"/etc/passwd"}`, map[string]string{"X-Access-Token": s.Token, "Content-Type": "application/json"})
		if code != http.StatusOK || !strings.Contains(body, `"name":"passwd"`) {
			t.Errorf("Stat by host: %d %s", code, body)
		}
		code, body = do("POST", "/filesystem.Filesystem/Stat", `{"path":"/nonexistent"}`, map[string]string{"X-Access-Token": s.Token, "Content-Type": "application/json"})
		if code != http.StatusNotFound || !strings.Contains(body, `"code":"not_found"`) {
			t.Errorf("Stat of a missing file: %d %s, want 404 not_found", code, body)
		}
		if _, err := c.Destroy(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
	})
	// Every E2B call went through the gate: the audit log has the E2B surface's actions.
	t.Run("Audited", func(t *testing.T) {
		res, err := c.Query(t.Context(), "SELECT tool, count(*) AS n FROM audit_log WHERE tool LIKE '%/e2b/%' OR tool LIKE '%/v2/sandboxes%' GROUP BY tool", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Rows) < 5 {
			t.Errorf("the audit log has %d kinds of E2B calls: %v", len(res.Rows), res.Rows)
		}
	})
}
