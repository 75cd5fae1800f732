package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/blobs"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestServeRelay: serve refuses bad relay limits at start; with a real `agentbox join` agent,
// `agentbox machine pull -o` and `machine push FILE|--blob` move a binary file byte-exact; after
// a SIGKILL and restart the blob is still served, and a partial file the killed server left is
// swept.
func TestServeRelay(t *testing.T) {
	bin := testenv.Binary(t)
	state := filepath.Join(t.TempDir(), "state")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--relay-max-file-mb", "0"}, "--relay-max-file-mb 0 must be at least 1"},
		{[]string{"--relay-transfers-per-hour", "0"}, "--relay-transfers-per-hour 0 must be at least 1"},
		{[]string{"--relay-mb-per-day", "10", "--relay-max-file-mb", "20"}, "--relay-mb-per-day 10 must be at least --relay-max-file-mb (20)"},
		{[]string{"--relay-call-timeout", "11m"}, "--relay-call-timeout 11m0s must be between 1s and 10m"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", state}, tc.args...)...)
		cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+testToken)
		out, err := cmd.CombinedOutput()
		cancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("serve %v: %v\n%s\nwant exit 2 with %q", tc.args, err, out, tc.want)
		}
	}

	testenv.RequireRoot(t)
	stateDir := testenv.ShortTempDir(t, "abrelay")
	srv := testenv.StartServer(t, stateDir, testToken)
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
	secret, errOut, code := cli("machine", "token", "create")
	if code != 0 {
		t.Fatalf("machine token create: %d %s", code, errOut)
	}
	join := exec.Command(bin, "join", srv.URL, "--token", strings.TrimSpace(secret), "--name", "relaybox", "--state-dir", t.TempDir())
	var joinLog testenv.SyncBuffer
	join.Stdout, join.Stderr = &joinLog, &joinLog
	if err := join.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = join.Process.Kill(); _ = join.Wait() })

	data := make([]byte, 5<<20+3)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	src := filepath.Join(work, "model.bin")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// The agent may still be connecting: MACHINE_NOT_FOUND or MACHINE_OFFLINE until it is.
	var res blobs.Result
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, errOut, code := cli("machine", "pull", "--json", "-o", filepath.Join(work, "pulled.bin"), "relaybox", src)
		if code == 0 {
			if err := json.Unmarshal([]byte(out), &res); err != nil {
				t.Fatalf("pull --json: %v %s", err, out)
			}
			break
		}
		if time.Now().After(deadline) || !(strings.Contains(errOut, "MACHINE_OFFLINE") || strings.Contains(errOut, "MACHINE_NOT_FOUND")) {
			t.Fatalf("machine pull: %d %s\njoin:\n%s", code, errOut, joinLog.String())
		}
	}
	if got, _ := os.ReadFile(filepath.Join(work, "pulled.bin")); !bytes.Equal(got, data) || res.Size != int64(len(data)) {
		t.Fatalf("pulled %d bytes (reply %+v)", len(got), res)
	}
	// Push a local file (uploaded, then pushed) and the blob.
	dest := filepath.Join(work, "pushed.bin")
	if out, errOut, code := cli("machine", "push", "relaybox", src, dest); code != 0 || !strings.Contains(out, "wrote new file relaybox:"+dest) {
		t.Fatalf("machine push FILE: %d %s %s", code, out, errOut)
	}
	if err := os.Chmod(dest, 0o4750); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := cli("machine", "push", "--blob", res.BlobID, "relaybox", dest); code != 0 || !strings.Contains(out, "replaced relaybox:"+dest) || !strings.Contains(out, "mode 0750") {
		t.Fatalf("machine push --blob: %d %s %s", code, out, errOut)
	}
	if got, _ := os.ReadFile(dest); !bytes.Equal(got, data) {
		t.Fatal("pushed file differs")
	}
	if fi, _ := os.Stat(dest); fi.Mode() != 0o750 {
		t.Fatalf("replaced file mode %v, want 0750 (setuid dropped)", fi.Mode())
	}
	if _, errOut, code := cli("machine", "pull", "relaybox", "relative.bin"); code != 1 || !strings.Contains(errOut, "INVALID_ARGUMENT") {
		t.Fatalf("relative pull: %d %s", code, errOut)
	}

	// SIGKILL, a leftover partial file, restart: the blob is still there, the leftover swept.
	srv.Kill()
	part := filepath.Join(stateDir, "blobs", "blob-0123456789abcdef01234567.part")
	if err := os.WriteFile(part, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv = testenv.StartServer(t, stateDir, testToken)
	resp, err := http.Get(strings.Replace(res.URL, res.URL[:strings.Index(res.URL, "/v1/")], srv.URL, 1))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, data) {
		t.Fatalf("link after restart: %d, %d bytes", resp.StatusCode, len(got))
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(part); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed server's partial blob file was not swept after the restart")
		}
	}
}
