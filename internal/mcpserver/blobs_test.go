package mcpserver_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/blobs"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostfiles"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// oneMachine reaches a hostfiles handler on loopback as the machine "lab".
type oneMachine struct{ srv *httptest.Server }

type toAddr struct{ addr string }

func (a toAddr) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Host = a.addr
	return http.DefaultTransport.RoundTrip(r)
}

func (m oneMachine) Client(_ context.Context, ref string) (*http.Client, store.Machine, error) {
	if ref != "lab" {
		return nil, store.Machine{}, errcode.New(errcode.MachineNotFound, "no machine %q", ref)
	}
	return &http.Client{Transport: toAddr{m.srv.Listener.Addr().String()}}, store.Machine{ID: "m-lab", Name: "lab"}, nil
}

// TestRelayTools: remote_pull then remote_push through MCP, the reply's documented fields, and
// the refusals (missing arguments against the schema, a relative path, an unknown machine and
// blob, a server without a relay).
func TestRelayTools(t *testing.T) {
	base := "http://agentbox.test"
	sbs, _, _ := runService(t, &base)
	bare := mcpserver.New(sbs, mcpserver.Options{})
	t.Cleanup(bare.Close)
	c0 := connect(t, bare, protocolVersions[0])
	if msg := c0.fails("remote_pull", obj{"machine": "lab", "path": "/x"}, "UNSUPPORTED_OPERATION"); !strings.Contains(msg, "no file relay") {
		t.Errorf("remote_pull without a relay: %q", msg)
	}

	hf := httptest.NewServer(hostfiles.NewHandler(hostfiles.Options{}))
	t.Cleanup(hf.Close)
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	bs, err := blobs.New(blobs.Config{Store: st, Dir: filepath.Join(t.TempDir(), "blobs"), Machines: oneMachine{hf}, BaseURL: func() string { return base }})
	if err != nil {
		t.Fatal(err)
	}
	srv := mcpserver.New(sbs, mcpserver.Options{Relay: bs})
	t.Cleanup(srv.Close)
	c := connect(t, srv, protocolVersions[0])

	dir := t.TempDir()
	src := filepath.Join(dir, "data.bin")
	data := bytes.Repeat([]byte{0, 1, 2, 255}, 4096)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var pulled blobs.Result
	c.ok("remote_pull", obj{"machine": "lab", "path": src}, &pulled)
	if pulled.Size != int64(len(data)) || !strings.HasPrefix(pulled.URL, base+"/v1/blobs/"+pulled.BlobID+"?expires=") || pulled.ExpiresAt.IsZero() {
		t.Fatalf("remote_pull = %+v", pulled)
	}
	dest := filepath.Join(dir, "copy.bin")
	var pushed blobs.PushResult
	c.ok("remote_push", obj{"machine": "lab", "blob_id": pulled.BlobID, "dest_path": dest}, &pushed)
	if got, _ := os.ReadFile(dest); !bytes.Equal(got, data) || pushed.Mode != "0600" || pushed.DestPath != dest {
		t.Fatalf("remote_push = %+v; file %d bytes", pushed, len(got))
	}
	for _, tc := range []struct {
		tool string
		args obj
		code string
		want string
	}{
		{"remote_pull", obj{"machine": "lab"}, "INVALID_ARGUMENT", `"path"`},
		{"remote_pull", obj{"machine": "lab", "path": "rel"}, "INVALID_ARGUMENT", "not absolute"},
		{"remote_pull", obj{"machine": "nope", "path": "/x"}, "MACHINE_NOT_FOUND", "nope"},
		{"remote_push", obj{"machine": "lab", "blob_id": "blob-000000000000000000000000", "dest_path": dest}, "BLOB_NOT_FOUND", ""},
		{"remote_push", obj{"machine": "lab", "blob_id": pulled.BlobID, "dest_path": filepath.Join(dir, "no", "f")}, "FILE_NOT_FOUND", "does not exist"},
	} {
		if msg := c.fails(tc.tool, tc.args, tc.code); !strings.Contains(msg, tc.want) {
			t.Errorf("%s %v: %q, want it to say %q", tc.tool, tc.args, msg, tc.want)
		}
	}
}
