package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/blobs"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostfiles"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// relayMachines reaches each named machine's hostfiles handler on its own loopback server.
type relayMachines map[string]*httptest.Server

type hostRewrite struct{ addr string }

func (h hostRewrite) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Host = h.addr
	return http.DefaultTransport.RoundTrip(r)
}

func (m relayMachines) Client(_ context.Context, ref string) (*http.Client, store.Machine, error) {
	srv, ok := m[ref]
	if !ok {
		return nil, store.Machine{}, errcode.New(errcode.MachineNotFound, "no machine %q", ref)
	}
	return &http.Client{Transport: hostRewrite{srv.Listener.Addr().String()}}, store.Machine{ID: "m-" + ref, Name: ref}, nil
}

type relayClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *relayClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *relayClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

const relayToken = "relay-token-0123456789"

// TestRelayOverREST: upload, pull and push over REST; the link downloads without the token
// and expires; the token downloads too; delete; the relay routes without a relay.
func TestRelayOverREST(t *testing.T) {
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
	m := relayMachines{"alpha": httptest.NewServer(hostfiles.NewHandler(hostfiles.Options{}))}
	defer m["alpha"].Close()
	clk := &relayClock{t: time.Now()}
	var base string
	bs, err := blobs.New(blobs.Config{Store: st, Dir: filepath.Join(dir, "blobs"), Machines: m, Now: clk.now, BaseURL: func() string { return base }})
	if err != nil {
		t.Fatal(err)
	}
	h := api.New(sbs, api.Options{Token: relayToken, Blobs: bs})
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer h.Close()
	base = srv.URL
	c := client.New(srv.URL, relayToken)
	ctx := t.Context()

	data := make([]byte, 3<<20+5)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	up, err := c.UploadBlob(ctx, "weights.bin", int64(len(data)), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if up.Size != int64(len(data)) || up.Name != "weights.bin" || !strings.HasPrefix(up.URL, srv.URL+"/v1/blobs/"+up.BlobID+"?") {
		t.Fatalf("upload = %+v", up)
	}
	// The link is its own credential.
	code, body, hdr := call(t, "GET", up.URL, "", "")
	if code != 200 || body != string(data) || hdr.Get("X-Agentbox-SHA256") != up.SHA256 {
		t.Fatalf("GET link without token: %d, %d bytes", code, len(body))
	}
	// Without link or token: refused.
	code, body, _ = call(t, "GET", srv.URL+"/v1/blobs/"+up.BlobID, "", "")
	if got, _ := errCode(body); code != 401 || got != errcode.AuthFailed {
		t.Fatalf("GET without credentials: %d %s", code, body)
	}
	// A forged signature: refused even with another blob's expiry.
	code, body, _ = call(t, "GET", strings.Replace(up.URL, "sig=", "sig=00", 1), "", "")
	if got, _ := errCode(body); code != 401 || got != errcode.AuthFailed {
		t.Fatalf("forged link: %d %s", code, body)
	}
	// The token downloads it.
	rc, size, sum, err := c.DownloadBlob(ctx, up.BlobID)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if size != int64(len(data)) || !bytes.Equal(got, data) || sum != up.SHA256 {
		t.Fatalf("token download: %d bytes", len(got))
	}

	// Push it to the machine, pull it back.
	dest := filepath.Join(t.TempDir(), "weights.bin")
	pr, err := c.RemotePush(ctx, "alpha", up.BlobID, dest)
	if err != nil {
		t.Fatal(err)
	}
	if pr.Mode != "0600" || pr.Size != up.Size {
		t.Fatalf("push = %+v", pr)
	}
	if onDisk, _ := os.ReadFile(dest); !bytes.Equal(onDisk, data) {
		t.Fatal("pushed file differs")
	}
	pl, err := c.RemotePull(ctx, "alpha", dest)
	if err != nil {
		t.Fatal(err)
	}
	if pl.SHA256 != up.SHA256 || pl.MachineID != "m-alpha" {
		t.Fatalf("pull = %+v", pl)
	}
	_, err = c.RemotePull(ctx, "alpha", "relative/path")
	if !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("relative pull: %v", err)
	}
	_, err = c.RemotePull(ctx, "nope", "/x")
	if !errcode.Is(err, errcode.MachineNotFound) {
		t.Fatalf("unknown machine: %v", err)
	}

	// An hour later the link is gone (410 LINK_EXPIRED); the token still works.
	clk.add(time.Hour + time.Second)
	code, body, _ = call(t, "GET", up.URL, "", "")
	if got, _ := errCode(body); code != http.StatusGone || got != errcode.LinkExpired {
		t.Fatalf("expired link: %d %s", code, body)
	}

	// Delete.
	if err := c.DeleteBlob(ctx, up.BlobID); err != nil {
		t.Fatal(err)
	}
	code, body, _ = call(t, "DELETE", srv.URL+"/v1/blobs/"+up.BlobID, relayToken, "")
	if got, _ := errCode(body); code != 404 || got != errcode.BlobNotFound {
		t.Fatalf("second delete: %d %s", code, body)
	}

	// RATE_LIMITED carries limit and retry_at.
	var rl struct {
		Error struct {
			Code    string         `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	for range blobs.DefaultTransfersPerHour {
		if _, err := c.UploadBlob(ctx, "x", 1, strings.NewReader("x")); errcode.Is(err, errcode.RateLimited) {
			break
		}
	}
	code, body, _ = call(t, "POST", srv.URL+"/v1/blobs", relayToken, "x")
	if err := json.Unmarshal([]byte(body), &rl); err != nil || code != http.StatusTooManyRequests || rl.Error.Code != "RATE_LIMITED" ||
		rl.Error.Details["limit"] != "transfers_per_hour" || rl.Error.Details["retry_at"] == nil {
		t.Fatalf("over the limit: %d %s", code, body)
	}
}

// TestRelayWithoutService: a server without a relay answers its routes UNSUPPORTED_OPERATION.
func TestRelayWithoutService(t *testing.T) {
	t.Parallel()
	st, err := sqlite.Open(t.Context(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rt, _ := fake.New(fake.Config{Name: "runc"})
	defer rt.Shutdown(context.Background())
	sbs, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sbs.Close()
	h := api.New(sbs, api.Options{Token: relayToken})
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer h.Close()
	for _, r := range [][2]string{{"POST", "/v1/blobs"}, {"GET", "/v1/blobs/blob-x"}, {"DELETE", "/v1/blobs/blob-x"},
		{"POST", "/v1/machines/a/pull"}, {"POST", "/v1/machines/a/push"}} {
		code, body, _ := call(t, r[0], srv.URL+r[1], relayToken, "{}")
		if got, _ := errCode(body); got != errcode.UnsupportedOp {
			t.Errorf("%s %s: %d %s", r[0], r[1], code, body)
		}
	}
}
