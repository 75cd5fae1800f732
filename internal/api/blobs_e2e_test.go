package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/blobs"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/agent"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// TestRelayBetweenJoinedMachines is the file relay end to end: two machine agents join the
// server with a join token and connect (WebSocket + yamux); a 50 MiB binary file is pulled from
// one over REST (through Registry.Client and the agent's /files/ handler), downloaded through its
// link byte-exact, and pushed to the other, where it lands byte-exact with mode 0600.
func TestRelayBetweenJoinedMachines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(context.Background())
	sbs, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sbs.Close()
	reg := machine.New(st, machine.Options{}) // the default heartbeat: a 50 MiB transfer under load must not look like a dead link
	var base string
	bs, err := blobs.New(blobs.Config{Store: st, Dir: filepath.Join(dir, "blobs"), Machines: reg, BaseURL: func() string { return base }})
	if err != nil {
		t.Fatal(err)
	}
	bs.Start(t.Context())
	defer bs.Close()
	h := api.New(sbs, api.Options{Token: relayToken, Machines: reg, Blobs: bs})
	srv := httptest.NewServer(h)
	base = srv.URL
	defer func() {
		srv.CloseClientConnections()
		reg.Close()
		h.Close()
		srv.Close()
	}()
	ctx := t.Context()
	noGPUs := func(context.Context) ([]gpu.GPU, error) { return nil, nil }
	for _, name := range []string{"lab", "gpubox"} {
		tok, err := reg.CreateToken(ctx, machine.TokenRequest{Uses: 1})
		if err != nil {
			t.Fatal(err)
		}
		cfg := agent.Config{ServerURL: srv.URL, StateDir: t.TempDir(), GPUs: noGPUs, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
		ast, err := agent.Enroll(ctx, cfg, tok.Secret, name)
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- agent.Run(actx, cfg, ast) }()
		defer func() { cancel(); <-done }()
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, name := range []string{"lab", "gpubox"} {
		for {
			if m, err := reg.Get(ctx, name); err == nil && m.Online {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("machine %s did not come online", name)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	data := make([]byte, 50<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "checkpoint.bin")
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	c := client.New(srv.URL, relayToken)
	pl, err := c.RemotePull(ctx, "lab", src)
	if err != nil {
		t.Fatal(err)
	}
	if pl.Size != int64(len(data)) || pl.SHA256 != hex.EncodeToString(sum[:]) || pl.Name != "checkpoint.bin" {
		t.Fatalf("pull = %+v", pl)
	}
	// The link downloads it with no token.
	code, body, _ := call(t, "GET", pl.URL, "", "")
	if code != 200 || body != string(data) {
		t.Fatalf("link download: %d, %d bytes", code, len(body))
	}
	dest := filepath.Join(t.TempDir(), "checkpoint.bin")
	pr, err := c.RemotePush(ctx, "gpubox", pl.BlobID, dest)
	if err != nil {
		t.Fatal(err)
	}
	if pr.Size != pl.Size || pr.Mode != "0600" || pr.Replaced || pr.Machine != "gpubox" {
		t.Fatalf("push = %+v", pr)
	}
	got, err := os.ReadFile(dest)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("pushed file: %d bytes, %v; want the 50 MiB pulled, identical", len(got), err)
	}
	// The owner's token downloads it too.
	rc, _, _, err := c.DownloadBlob(ctx, pl.BlobID)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, rc)
	rc.Close()
	if n != int64(len(data)) {
		t.Fatalf("token download: %d bytes", n)
	}
}
