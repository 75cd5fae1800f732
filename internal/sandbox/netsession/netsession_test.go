package netsession_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/netsession"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// env is a sandbox service over real SQLite and the fake runtime (named "runc"; its commands
// share the host's loopback), and the network feature over it.
type env struct {
	svc *sandbox.Service
	net *netsession.Service
}

func newEnv(t *testing.T, cfg sandbox.Config) *env {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		svc.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return &env{svc: svc, net: netsession.New(svc.Core(), st)}
}

func (e *env) create(t *testing.T, req sandbox.CreateRequest) sandbox.Sandbox {
	t.Helper()
	sb, err := e.svc.Create(t.Context(), req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return sb
}

func previewURL(id string, port int) string {
	return fmt.Sprintf("http://%d-%s.localhost:8080/", port, id)
}

func wantCode(t *testing.T, err error, code errcode.Code, substr string) {
	t.Helper()
	if errcode.Of(err) != code {
		t.Fatalf("err = %v, want %s", err, code)
	}
	if substr != "" && !strings.Contains(errcode.Message(err), substr) {
		t.Fatalf("message %q does not say %q", errcode.Message(err), substr)
	}
}

// TestRecordPages: a sandbox without records has empty pages (never null) whose cursor stays
// where it was; bad cursors and limits are refused before the store is read; an unknown
// sandbox is SANDBOX_NOT_FOUND.
func TestRecordPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	conns, err := e.net.Connections(t.Context(), sb.ID, 7, 0)
	if err != nil || conns.Connections == nil || len(conns.Connections) != 0 || conns.Next != 7 || conns.SandboxID != sb.ID {
		t.Errorf("Connections = %+v, %v", conns, err)
	}
	calls, err := e.net.SecretCalls(t.Context(), sb.ID, 0, sandbox.MaxNetList)
	if err != nil || calls.Calls == nil || len(calls.Calls) != 0 || calls.Next != 0 {
		t.Errorf("SecretCalls = %+v, %v", calls, err)
	}
	for _, tc := range []struct {
		after int64
		limit int
		says  string
	}{{-1, 0, "after must be"}, {0, -1, "limit must be"}, {0, sandbox.MaxNetList + 1, "limit must be"}} {
		_, err := e.net.Connections(t.Context(), sb.ID, tc.after, tc.limit)
		wantCode(t, err, errcode.InvalidArgument, tc.says)
		_, err = e.net.SecretCalls(t.Context(), sb.ID, tc.after, tc.limit)
		wantCode(t, err, errcode.InvalidArgument, tc.says)
	}
	_, err = e.net.Connections(t.Context(), "sb-0123456789ab", 0, 0)
	wantCode(t, err, errcode.SandboxNotFound, "")
	_, err = e.net.Exposures(t.Context(), "not-an-id")
	wantCode(t, err, errcode.InvalidArgument, "")
}

func TestExposures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sandbox.Config{PreviewURL: previewURL})
	sb := e.create(t, sandbox.CreateRequest{}) // preview URLs need no network
	// A server in the "sandbox" (the fake's commands share the host's loopback).
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port

	for _, p := range []int{0, -1, 65536} {
		_, err := e.net.Expose(t.Context(), sb.ID, p, false)
		wantCode(t, err, errcode.InvalidArgument, "port must be between 1 and 65535")
	}
	ex, err := e.net.Expose(t.Context(), sb.ID, port, false)
	if err != nil {
		t.Fatal(err)
	}
	if ex.URL != fmt.Sprintf("http://%d-%s.localhost:8080/", port, sb.ID) || len(ex.AccessToken) != 43 || ex.Public {
		t.Errorf("Expose = %+v", ex)
	}
	if b, _ := json.Marshal(ex); strings.Contains(string(b), "token_hash") || strings.Contains(string(b), ex.TokenHash) {
		t.Errorf("the reply carries the token's hash: %s", b)
	}
	list, err := e.net.Exposures(t.Context(), sb.ID)
	if err != nil || len(list) != 1 || list[0].AccessToken != "" || list[0].TokenHash != "" || list[0].URL != ex.URL {
		t.Errorf("Exposures = %+v, %v", list, err)
	}
	if err := e.net.AuthorizePreview(t.Context(), sb.ID, port, ex.AccessToken, false); err != nil {
		t.Errorf("with the access token: %v", err)
	}
	if err := e.net.AuthorizePreview(t.Context(), sb.ID, port, "", true); err != nil {
		t.Errorf("with the bearer token: %v", err)
	}
	wantCode(t, e.net.AuthorizePreview(t.Context(), sb.ID, port, "", false), errcode.AuthFailed, "private")
	wrong := ex.AccessToken[:42] + "A"
	if wrong == ex.AccessToken {
		wrong = ex.AccessToken[:42] + "B"
	}
	wantCode(t, e.net.AuthorizePreview(t.Context(), sb.ID, port, wrong, false), errcode.AuthFailed, "")
	wantCode(t, e.net.AuthorizePreview(t.Context(), sb.ID, port+1, "", true), errcode.SandboxNotFound, "not exposed")

	// Exposing again replaces the token.
	ex2, err := e.net.Expose(t.Context(), sb.ID, port, false)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, e.net.AuthorizePreview(t.Context(), sb.ID, port, ex.AccessToken, false), errcode.AuthFailed, "")
	if err := e.net.AuthorizePreview(t.Context(), sb.ID, port, ex2.AccessToken, false); err != nil {
		t.Errorf("with the new token: %v", err)
	}
	if pub, err := e.net.Expose(t.Context(), sb.ID, port, true); err != nil || pub.AccessToken != "" || !pub.Public {
		t.Errorf("public Expose = %+v, %v", pub, err)
	}
	if err := e.net.AuthorizePreview(t.Context(), sb.ID, port, "", false); err != nil {
		t.Errorf("public: %v", err)
	}

	// DialPort reaches the server through the agent.
	c, err := e.net.DialPort(t.Context(), sb.ID, port)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Errorf("echo through DialPort = %q, %v", buf, err)
	}
	c.Close()

	wantCode(t, e.net.Unexpose(t.Context(), sb.ID, port+1), errcode.SandboxNotFound, fmt.Sprintf("port %d of %s is not exposed", port+1, sb.ID))
	if err := e.net.Unexpose(t.Context(), sb.ID, port); err != nil {
		t.Fatal(err)
	}
	wantCode(t, e.net.AuthorizePreview(t.Context(), sb.ID, port, "", true), errcode.SandboxNotFound, "")

	// Destroy removes them; a finished sandbox's ports cannot be exposed.
	if _, err := e.net.Expose(t.Context(), sb.ID, port, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	wantCode(t, e.net.AuthorizePreview(t.Context(), sb.ID, port, "", true), errcode.SandboxNotFound, "")
	_, err = e.net.Expose(t.Context(), sb.ID, port, false)
	wantCode(t, err, errcode.SandboxNotRunning, "")
	_, err = e.net.DialPort(t.Context(), sb.ID, port)
	wantCode(t, err, errcode.SandboxNotRunning, "")

	noURL := newEnv(t, sandbox.Config{})
	other := noURL.create(t, sandbox.CreateRequest{})
	_, err = noURL.net.Expose(t.Context(), other.ID, port, false)
	wantCode(t, err, errcode.UnsupportedOp, "preview URLs are served by agentbox serve")
}
