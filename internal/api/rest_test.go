package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestAuthAndHost checks the checks that come before any handler: the Host must be a loopback
// name, every path but /health needs the bearer token.
func TestAuthAndHost(t *testing.T) {
	srv := httptest.NewServer(api.New(nil, api.Options{Token: "s3cret"}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name, path, host, token string
		status                  int
		code                    errcode.Code
	}{
		{"health without token", "/health", "", "", 200, ""},
		{"no token", "/v1/sandboxes", "", "", 401, errcode.AuthFailed},
		{"wrong token", "/v1/sandboxes", "", "s3cre", 401, errcode.AuthFailed},
		{"foreign Host", "/health", "evil.example:80", "s3cret", 403, errcode.AuthFailed},
		{"unknown endpoint", "/v1/nope", "", "s3cret", 404, errcode.InvalidArgument},
	} {
		req, _ := http.NewRequest("GET", srv.URL+tc.path, nil)
		if tc.host != "" {
			req.Host = tc.host
		}
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var eb struct {
			Error struct{ Code errcode.Code } `json:"error"`
		}
		_ = json.Unmarshal(body, &eb)
		if resp.StatusCode != tc.status || eb.Error.Code != tc.code {
			t.Errorf("%s: %d %s, want %d %q", tc.name, resp.StatusCode, body, tc.status, tc.code)
		}
	}
}

// TestSandboxRoundTrip drives a real control plane (SQLite, runc, the agent) through the REST
// API and its Go client: create, a streamed exec, a file written and read back, destroy.
func TestSandboxRoundTrip(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abapi")
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rt, err := oci.New(ctx, oci.Config{Name: "runc", Binary: "runc", Root: filepath.Join(dir, "rt"),
		GuestBinary: testenv.GuestBinary(t), CgroupParent: "abapi-" + filepath.Base(dir), Subreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	srv := httptest.NewServer(api.New(svc, api.Options{Token: "s3cret"}))
	t.Cleanup(srv.Close)
	c := client.New(srv.URL, "s3cret")

	sb, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := svc.Destroy(context.Background(), sb.ID); err != nil && !errcode.Is(err, errcode.SandboxNotFound) {
			t.Errorf("cleanup: destroy %s: %v", sb.ID, err)
		}
	})
	var streamed strings.Builder
	res, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"sh", "-c", "echo out; echo err >&2"}},
		func(stream string, data []byte) { streamed.WriteString(stream + ":" + string(data)) })
	if err != nil || res.ExitCode != 0 || !strings.Contains(streamed.String(), "stdout:out") {
		t.Fatalf("exec: %+v %v, streamed %q", res, err, streamed.String())
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/workspace/f", 0o644, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	rc, _, err := c.ReadFile(ctx, sb.ID, "/workspace/f", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "hello" {
		t.Fatalf("read back %q", got)
	}
	if d, err := c.Destroy(ctx, sb.ID); err != nil || d.State != wire.StateDestroyed {
		t.Fatalf("destroy: %+v %v", d, err)
	}
	if _, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"true"}}, nil); err == nil {
		t.Fatal("exec in a destroyed sandbox succeeded")
	}
}
