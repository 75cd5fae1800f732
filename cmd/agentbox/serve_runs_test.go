package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestServeRuns: serve refuses bad run flags at start; with good ones, the CLI's `agentbox run`
// drives a real run in a real runc sandbox end to end (summary, exit codes, --detach, --json,
// `runs get|events|logs|artifact`), and the artifact's signed URL downloads without the token.
func TestServeRuns(t *testing.T) {
	bin := testenv.Binary(t)
	state := filepath.Join(t.TempDir(), "state")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--run-workers", "-1"}, "--run-workers -1 must be between 1 and 1024"},
		{[]string{"--run-retention", "1m"}, "--run-retention 1m0s must be at least 1h0m0s"},
		{[]string{"--checkout-dir", "repos"}, `--checkout-dir "repos" must be an absolute path`},
		{[]string{"--artifact-mb", "-1"}, "--artifact-mb -1 must be between 1 and"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", state}, tc.args...)...)
		cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+testToken)
		out, err := cmd.CombinedOutput()
		cancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "INVALID_ARGUMENT") || !strings.Contains(string(out), tc.want) {
			t.Errorf("serve %v: %v\n%s\nwant exit 1 with %q", tc.args, err, out, tc.want)
		}
	}

	testenv.RequireRoot(t)
	srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abruns"), testToken, "--run-workers", "2", "--artifact-mb", "64", "--run-retention", "2h")
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "AGENTBOX_URL="+srv.URL, "AGENTBOX_TOKEN="+testToken)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return stdout.String(), stderr.String(), code
	}

	out, errOut, code := cli("run", "--validate", "test -s out/report.txt", "--artifact", "out/*.txt", "--env", "WHO=world",
		"--", "sh", "-c", `mkdir -p out && echo "hello $WHO" > out/report.txt && echo done`)
	if code != 0 || !strings.Contains(out, ": succeeded") || !strings.Contains(out, "validation[0]") || !strings.Contains(out, "artifact out/report.txt (12 bytes): "+srv.URL+"/v1/runs/") ||
		!strings.Contains(errOut, "queued") || !strings.Contains(errOut, "succeeded") {
		t.Fatalf("run: exit %d\nstdout:\n%s\nstderr:\n%s\nserver:\n%s", code, out, errOut, srv.Logs)
	}
	id := strings.Fields(strings.TrimPrefix(out, "run "))[0]
	id = strings.TrimSuffix(id, ":")

	// The signed URL, no token.
	var r runs.Run
	js, _, code := cli("runs", "get", "--json", id)
	if err := json.Unmarshal([]byte(js), &r); code != 0 || err != nil || r.ID != id || len(r.Artifacts) != 1 || r.CleanupFailed {
		t.Fatalf("runs get --json: %d %v %s", code, err, js)
	}
	resp, err := http.Get(r.Artifacts[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello world\n" {
		t.Fatalf("signed URL: %d %q", resp.StatusCode, body)
	}
	dst := filepath.Join(t.TempDir(), "r.txt")
	if _, e, code := cli("runs", "artifact", "-o", dst, id, "out/report.txt"); code != 0 {
		t.Fatalf("runs artifact: %d %s", code, e)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "hello world\n" {
		t.Fatalf("downloaded %q %v", b, err)
	}
	if o, _, code := cli("runs", "logs", id); code != 0 || o != "done\n" {
		t.Fatalf("runs logs: %d %q", code, o)
	}
	if o, _, code := cli("runs", "events", id); code != 0 || !strings.Contains(o, "queued") || !strings.Contains(o, "succeeded") {
		t.Fatalf("runs events: %d %s", code, o)
	}
	if o, _, code := cli("runs", "ls"); code != 0 || !strings.Contains(o, id) {
		t.Fatalf("runs ls: %d %s", code, o)
	}

	// A failing command is exit 1, with the failing phase's output in the summary.
	out, _, code = cli("run", "--", "sh", "-c", "echo broken >&2; exit 3")
	if code != 1 || !strings.Contains(out, ": failed") || !strings.Contains(out, "broken") {
		t.Fatalf("failing run: exit %d\n%s", code, out)
	}
	// --detach prints the id at once.
	out, _, code = cli("run", "--detach", "--", "sleep", "30")
	did := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(did, "run-") {
		t.Fatalf("--detach: %d %q", code, out)
	}
	if o, _, code := cli("runs", "cancel", did); code != 0 || !strings.Contains(o, did) {
		t.Fatalf("runs cancel: %d %s", code, o)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		js, _, _ := cli("runs", "get", "--json", did)
		var c runs.Run
		json.Unmarshal([]byte(js), &c)
		if c.State == runs.Canceled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("canceled run: %s", js)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A batch file: a refused spec is listed (exit 1 with --wait), the others run.
	bf := filepath.Join(t.TempDir(), "batch.json")
	os.WriteFile(bf, []byte(`{"runs": [{"command": ["true"]}, {"command": ["true"], "bogus": 1}, {"command": ["sh", "-c", "exit 0"]}], "max_parallel": 2}`), 0o644)
	out, errOut, code = cli("batch", "submit", "--wait", bf)
	if code != 1 || !strings.Contains(out, "settled true") || !strings.Contains(out, "refused [1]") || strings.Count(out, "  succeeded  ") != 2 {
		t.Fatalf("batch submit --wait: exit %d\n%s\n%s", code, out, errOut)
	}
	bid := strings.Fields(strings.TrimPrefix(out, "batch "))[0]
	if o, _, code := cli("batch", "ls"); code != 0 || !strings.Contains(o, bid) {
		t.Fatalf("batch ls: %d %s", code, o)
	}
	if o, _, code := cli("batch", "get", "--json", bid); code != 0 || !strings.Contains(o, `"batch_id": "`+bid+`"`) {
		t.Fatalf("batch get: %d %s", code, o)
	}
	os.WriteFile(bf, []byte(`{"runs": [], "max_paralel": 2}`), 0o644)
	if _, e, code := cli("batch", "submit", bf); code != 1 || !strings.Contains(e, `unknown field "max_paralel"`) {
		t.Fatalf("batch file with a typo: %d %s", code, e)
	}
	// Usage errors are 2 and start nothing.
	if _, e, code := cli("run", "pytest"); code != 2 || !strings.Contains(e, "the command goes after --") {
		t.Fatalf("run without --: %d %s", code, e)
	}
}
