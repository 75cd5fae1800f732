package blobs_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/blobs"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostfiles"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// clock is an injectable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time)     { c.mu.Lock(); c.t = t; c.mu.Unlock() }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// machines serves each named machine from its own httptest server (a real hostfiles handler
// on loopback), reached the way the registry's client is: host ignored, transport fixed.
type machines map[string]*httptest.Server

type toServer struct {
	addr string
	rt   http.RoundTripper
}

func (t toServer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Host = t.addr
	return t.rt.RoundTrip(r)
}

func (m machines) Client(_ context.Context, ref string) (*http.Client, store.Machine, error) {
	srv, ok := m[ref]
	if !ok {
		return nil, store.Machine{}, errcode.New(errcode.MachineNotFound, "no machine %q", ref)
	}
	return &http.Client{Transport: toServer{addr: srv.Listener.Addr().String(), rt: srv.Client().Transport}}, store.Machine{ID: "m-" + ref, Name: ref}, nil
}

func machineServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

type env struct {
	svc   *blobs.Service
	st    store.Store
	dir   string
	clock *clock
	t0    time.Time
}

func newEnv(t *testing.T, cfg blobs.Config) *env {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	c := &clock{t: t0}
	cfg.Store, cfg.Now = st, c.Now
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(t.TempDir(), "blobs")
	}
	cfg.BaseURL = func() string { return "http://agentbox.test" }
	if cfg.Machines == nil {
		cfg.Machines = machines{
			"alpha": machineServer(t, hostfiles.NewHandler(hostfiles.Options{})),
			"beta":  machineServer(t, hostfiles.NewHandler(hostfiles.Options{})),
		}
	}
	svc, err := blobs.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{svc: svc, st: st, dir: cfg.Dir, clock: c, t0: t0}
}

func randBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func wantCode(t *testing.T, err error, code errcode.Code) *errcode.Error {
	t.Helper()
	if !errcode.Is(err, code) {
		t.Fatalf("err = %v, want %s", err, code)
	}
	e, _ := errcode.As(err)
	return e
}

func writeFile(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "src.bin")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// download fetches a link the way GET /v1/blobs/{id} does: verify, then open.
func download(t *testing.T, e *env, link string) ([]byte, error) {
	t.Helper()
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimPrefix(u.Path, "/v1/blobs/")
	if err := e.svc.VerifyLink(id, u.Query().Get("expires"), u.Query().Get("sig")); err != nil {
		return nil, err
	}
	rc, _, err := e.svc.Open(context.Background(), id, nil)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// TestPullPush50MiBBetweenMachines pulls a 50 MiB binary file from one machine and pushes it
// to another, byte-exact, and downloads it through its link.
func TestPullPush50MiBBetweenMachines(t *testing.T) {
	t.Parallel()
	e := newEnv(t, blobs.Config{})
	data := randBytes(t, 50<<20)
	src := writeFile(t, data)
	ctx := context.Background()
	res, err := e.svc.Pull(ctx, "key:a", "alpha", src)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if res.Size != int64(len(data)) || res.SHA256 != hex.EncodeToString(sum[:]) || res.Name != "src.bin" ||
		res.MachineID != "m-alpha" || res.Path != src || res.Source != store.BlobFromPull ||
		!res.ExpiresAt.Equal(e.t0.Add(24*time.Hour)) || !res.LinkExpiresAt.Equal(e.t0.Add(time.Hour)) ||
		!strings.HasPrefix(res.URL, "http://agentbox.test/v1/blobs/"+res.BlobID+"?expires=") {
		t.Fatalf("pull result = %+v", res)
	}
	dest := filepath.Join(t.TempDir(), "dest.bin")
	pr, err := e.svc.Push(ctx, "key:a", res.BlobID, "beta", dest)
	if err != nil {
		t.Fatal(err)
	}
	if pr.Size != res.Size || pr.Mode != "0600" || pr.Replaced || pr.MachineID != "m-beta" || pr.DestPath != dest {
		t.Fatalf("push result = %+v", pr)
	}
	got, err := os.ReadFile(dest)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("pushed file: %d bytes, %v; want the %d pulled, identical", len(got), err, len(data))
	}
	got, err = download(t, e, res.URL)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("download: %d bytes, %v", len(got), err)
	}
}

func TestMachineErrorsLeaveNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, blobs.Config{})
	ctx := context.Background()
	_, err := e.svc.Pull(ctx, "key:a", "alpha", filepath.Join(t.TempDir(), "missing"))
	wantCode(t, err, errcode.FileNotFound)
	_, err = e.svc.Pull(ctx, "key:a", "alpha", "relative")
	wantCode(t, err, errcode.InvalidArgument)
	_, err = e.svc.Pull(ctx, "key:a", "gamma", "/etc/hostname")
	wantCode(t, err, errcode.MachineNotFound)
	_, err = e.svc.Pull(ctx, "key:a", "alpha", "")
	wantCode(t, err, errcode.InvalidArgument)
	up, err := e.svc.Upload(ctx, "key:a", "x", 3, strings.NewReader("abc"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Push(ctx, "key:a", up.BlobID, "beta", filepath.Join(t.TempDir(), "no", "such", "dir"))
	wantCode(t, err, errcode.FileNotFound)
	_, err = e.svc.Push(ctx, "key:a", "blob-000000000000000000000000", "beta", "/tmp/x")
	wantCode(t, err, errcode.BlobNotFound)
	_, err = e.svc.Push(ctx, "key:a", "../etc/passwd", "beta", "/tmp/x")
	wantCode(t, err, errcode.InvalidArgument)
	assertFiles(t, e, up.BlobID)
}

// assertFiles checks the blob directory holds exactly the ids' files (and the link key).
func assertFiles(t *testing.T, e *env, ids ...string) {
	t.Helper()
	ents, err := os.ReadDir(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, en := range ents {
		if en.Name() != "url-key" {
			got = append(got, en.Name())
		}
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("blob dir holds %v, want %v", got, ids)
	}
}

func TestOwnerIsolation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, blobs.Config{})
	ctx := context.Background()
	up, err := e.svc.Upload(ctx, "key:a", "f", 4, strings.NewReader("data"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Get(ctx, "key:b", up.BlobID)
	wantCode(t, err, errcode.BlobNotFound)
	_, err = e.svc.Push(ctx, "key:b", up.BlobID, "beta", filepath.Join(t.TempDir(), "x"))
	wantCode(t, err, errcode.BlobNotFound)
	wantCode(t, e.svc.Delete(ctx, "key:b", up.BlobID), errcode.BlobNotFound)
	if err := e.svc.Delete(ctx, "key:a", up.BlobID); err != nil {
		t.Fatal(err)
	}
	wantCode(t, e.svc.Delete(ctx, "key:a", up.BlobID), errcode.BlobNotFound)
	assertFiles(t, e)
}

func TestUploadLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, blobs.Config{MaxFileBytes: 1 << 20})
	ctx := context.Background()
	// Declared over the limit: refused before a byte is read or a transfer counted.
	_, err := e.svc.Upload(ctx, "key:a", "big", 1<<20+1, strings.NewReader("never read"))
	wantCode(t, err, errcode.FileTooLarge)
	// Unknown length, over the limit: cut, nothing kept, settled to 0.
	_, err = e.svc.Upload(ctx, "key:a", "big", -1, bytes.NewReader(make([]byte, 1<<20+10)))
	wantCode(t, err, errcode.FileTooLarge)
	// Declared longer than the body.
	_, err = e.svc.Upload(ctx, "key:a", "short", 100, strings.NewReader("abc"))
	wantCode(t, err, errcode.InvalidArgument)
	assertFiles(t, e)
	led, err := e.st.BlobTransfers(ctx, "key:a", e.t0.Add(-time.Hour), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(led) != 2 || led[0].Bytes != 0 || led[1].Bytes != 0 {
		t.Fatalf("ledger = %+v, want the two admitted uploads settled to 0 bytes", led)
	}
	// Exactly the limit, unknown length: kept.
	r, err := e.svc.Upload(ctx, "key:a", "dir/ok.bin", -1, bytes.NewReader(make([]byte, 1<<20)))
	if err != nil || r.Size != 1<<20 || r.Name != "ok.bin" {
		t.Fatalf("upload at the limit = %+v, %v", r, err)
	}
}

// TestTransfersPerHour: every kind of transfer counts; the refusal says when the oldest in the
// hour leaves it.
func TestTransfersPerHour(t *testing.T) {
	t.Parallel()
	e := newEnv(t, blobs.Config{TransfersPerHour: 3})
	ctx := context.Background()
	src := writeFile(t, []byte("hello"))
	r1, err := e.svc.Pull(ctx, "key:a", "alpha", src)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Add(10 * time.Minute)
	if _, err := e.svc.Push(ctx, "key:a", r1.BlobID, "beta", filepath.Join(t.TempDir(), "x")); err != nil {
		t.Fatal(err)
	}
	e.clock.Add(10 * time.Minute)
	if _, err := e.svc.Upload(ctx, "key:a", "u", 1, strings.NewReader("u")); err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Push(ctx, "key:a", r1.BlobID, "beta", filepath.Join(t.TempDir(), "y"))
	er := wantCode(t, err, errcode.RateLimited)
	if er.Details["limit"] != "transfers_per_hour" || er.Details["retry_at"] != e.t0.Add(time.Hour).Format(time.RFC3339) {
		t.Fatalf("details = %v, want limit transfers_per_hour, retry_at %s", er.Details, e.t0.Add(time.Hour).Format(time.RFC3339))
	}
	// Another key has its own quota.
	if _, err := e.svc.Upload(ctx, "key:b", "u", 1, strings.NewReader("u")); err != nil {
		t.Fatalf("another key: %v", err)
	}
	// A refused call counts for nothing: at retry_at the first leaves the hour and one fits.
	e.clock.Set(e.t0.Add(time.Hour))
	if _, err := e.svc.Pull(ctx, "key:a", "alpha", src); err != nil {
		t.Fatalf("at retry_at: %v", err)
	}
	_, err = e.svc.Pull(ctx, "key:a", "alpha", src)
	er = wantCode(t, err, errcode.RateLimited)
	if er.Details["retry_at"] != e.t0.Add(70*time.Minute).Format(time.RFC3339) {
		t.Fatalf("second retry_at = %v, want %s", er.Details["retry_at"], e.t0.Add(70*time.Minute).Format(time.RFC3339))
	}
}

// TestBytesPerDay: a pull reserves the per-file maximum before moving and settles to the true
// size; an upload admits its length; a push admits no bytes; the refusal says when enough of
// the rolling 24 h frees up.
func TestBytesPerDay(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	e := newEnv(t, blobs.Config{MaxFileBytes: 4 * mib, BytesPerDay: 10 * mib})
	ctx := context.Background()
	src := writeFile(t, make([]byte, 1024))
	r, err := e.svc.Pull(ctx, "key:a", "alpha", src) // t0: reserves 4 MiB, settles to 1 KiB
	if err != nil {
		t.Fatal(err)
	}
	led, _ := e.st.BlobTransfers(ctx, "key:a", e.t0.Add(-time.Hour), 10)
	if len(led) != 1 || led[0].Bytes != 1024 || led[0].Kind != "pull" {
		t.Fatalf("ledger after the pull = %+v, want it settled to 1024 bytes", led)
	}
	e.clock.Add(time.Minute)
	if _, err := e.svc.Upload(ctx, "key:a", "u", 4*mib, bytes.NewReader(make([]byte, 4*mib))); err != nil { // t0+1m
		t.Fatal(err)
	}
	e.clock.Add(time.Minute)
	if _, err := e.svc.Upload(ctx, "key:a", "u", 3*mib, bytes.NewReader(make([]byte, 3*mib))); err != nil { // t0+2m
		t.Fatal(err)
	}
	// 7 MiB + 1 KiB admitted: a pull of a 1 KiB file needs its 4 MiB reservation, so it waits
	// until the t0+1m upload leaves the window (7 MiB + 1 KiB - 1 KiB - 4 MiB + 4 MiB ≤ 10).
	e.clock.Add(time.Minute)
	_, err = e.svc.Pull(ctx, "key:a", "alpha", src)
	er := wantCode(t, err, errcode.RateLimited)
	want := e.t0.Add(time.Minute + 24*time.Hour).Format(time.RFC3339)
	if er.Details["limit"] != "bytes_per_day" || er.Details["retry_at"] != want || er.Details["bytes_last_24h"] != int64(7*mib+1024) {
		t.Fatalf("details = %v, want limit bytes_per_day, retry_at %s", er.Details, want)
	}
	// An upload of 2 MiB fits (7 MiB + 1 KiB + 2 MiB ≤ 10 MiB); a push admits no bytes.
	if _, err := e.svc.Upload(ctx, "key:a", "u", 2*mib, bytes.NewReader(make([]byte, 2*mib))); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Upload(ctx, "key:a", "u", mib, bytes.NewReader(make([]byte, mib))); !errcode.Is(err, errcode.RateLimited) {
		t.Fatalf("an upload past 10 MiB = %v, want RATE_LIMITED", err)
	}
	if _, err := e.svc.Push(ctx, "key:a", r.BlobID, "beta", filepath.Join(t.TempDir(), "p")); err != nil {
		t.Fatalf("a push while bytes are used up: %v", err)
	}
	// One second before the t0+1m upload leaves the 24 h window: still refused; at it, fits
	// (it leaves when it is 24 h old).
	e.clock.Set(e.t0.Add(time.Minute + 24*time.Hour - time.Second))
	if _, err := e.svc.Pull(ctx, "key:a", "alpha", src); !errcode.Is(err, errcode.RateLimited) {
		t.Fatalf("just before retry_at = %v, want RATE_LIMITED", err)
	}
	e.clock.Set(e.t0.Add(time.Minute + 24*time.Hour))
	if _, err := e.svc.Pull(ctx, "key:a", "alpha", src); err != nil {
		t.Fatalf("at retry_at: %v", err)
	}
}

func TestConfigRefused(t *testing.T) {
	t.Parallel()
	st, err := sqlite.Open(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := blobs.New(blobs.Config{Store: st, Dir: t.TempDir(), MaxFileBytes: 2 << 30, BytesPerDay: 1 << 30}); err == nil {
		t.Fatal("a per-file limit above the daily bytes was accepted")
	}
	if _, err := blobs.New(blobs.Config{Store: st, Dir: t.TempDir(), TTL: -time.Hour}); err == nil {
		t.Fatal("a negative TTL was accepted")
	}
}

// TestExpiry: a blob lives TTL; at expiry it is gone for every call and the sweeper deletes
// its record and bytes.
func TestExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, blobs.Config{TTL: 2 * time.Hour})
	ctx := context.Background()
	up, err := e.svc.Upload(ctx, "key:a", "f", 4, strings.NewReader("data"))
	if err != nil {
		t.Fatal(err)
	}
	keep, err := e.svc.Upload(ctx, "key:a", "g", 4, strings.NewReader("keep"))
	if err != nil {
		t.Fatal(err)
	}
	if !up.ExpiresAt.Equal(e.t0.Add(2 * time.Hour)) {
		t.Fatalf("expires_at = %v, want created + 2h", up.ExpiresAt)
	}
	e.clock.Set(e.t0.Add(2*time.Hour - time.Second))
	if _, err := e.svc.Get(ctx, "key:a", up.BlobID); err != nil {
		t.Fatalf("a second before expiry: %v", err)
	}
	if n, err := e.svc.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("sweep before expiry = %d, %v", n, err)
	}
	// keep is re-created later: move it forward by deleting and uploading anew.
	if err := e.svc.Delete(ctx, "key:a", keep.BlobID); err != nil {
		t.Fatal(err)
	}
	keep, err = e.svc.Upload(ctx, "key:a", "g", 4, strings.NewReader("keep"))
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Set(e.t0.Add(2 * time.Hour))
	_, err = e.svc.Get(ctx, "key:a", up.BlobID)
	wantCode(t, err, errcode.BlobNotFound)
	_, err = e.svc.Push(ctx, "key:a", up.BlobID, "beta", filepath.Join(t.TempDir(), "x"))
	wantCode(t, err, errcode.BlobNotFound)
	if n, err := e.svc.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep at expiry = %d, %v; want 1", n, err)
	}
	if _, err := e.st.GetBlob(ctx, up.BlobID); !errcode.Is(err, errcode.BlobNotFound) {
		t.Fatalf("record after sweep: %v", err)
	}
	assertFiles(t, e, keep.BlobID)
}

// TestLinkExpiry: a link works LinkTTL, then LINK_EXPIRED; a tampered one AUTH_FAILED; a link
// never outlives its blob.
func TestLinkExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, blobs.Config{TTL: 90 * time.Minute})
	ctx := context.Background()
	up, err := e.svc.Upload(ctx, "key:a", "f", 4, strings.NewReader("data"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := download(t, e, up.URL); err != nil || string(got) != "data" {
		t.Fatalf("fresh link: %q, %v", got, err)
	}
	tampered := strings.Replace(up.URL, up.BlobID, "blob-000000000000000000000000", 1)
	_, err = download(t, e, tampered)
	wantCode(t, err, errcode.AuthFailed)
	longer := strings.Replace(up.URL, "expires=", "expires=9", 1)
	_, err = download(t, e, longer)
	wantCode(t, err, errcode.AuthFailed)
	e.clock.Set(e.t0.Add(time.Hour + time.Second))
	_, err = download(t, e, up.URL)
	wantCode(t, err, errcode.LinkExpired)
	// A fresh link at t0+1h lasts only until the blob's expiry (t0+90m).
	r, err := e.svc.Get(ctx, "key:a", up.BlobID)
	if err != nil {
		t.Fatal(err)
	}
	if !r.LinkExpiresAt.Equal(e.t0.Add(90 * time.Minute)) {
		t.Fatalf("link_expires_at = %v, want the blob's expiry", r.LinkExpiresAt)
	}
	if got, err := download(t, e, r.URL); err != nil || string(got) != "data" {
		t.Fatalf("fresh link: %q, %v", got, err)
	}
}

// TestSweepAfterCrash: a pending record and its partial file left by a killed server, a file
// whose record is gone, and a partial file of a ready blob are swept by the next process; a
// ready blob is kept.
func TestSweepAfterCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t, blobs.Config{})
	ctx := context.Background()
	ready, err := e.svc.Upload(ctx, "key:a", "f", 4, strings.NewReader("data"))
	if err != nil {
		t.Fatal(err)
	}
	pendingID, orphanID := "blob-aaaaaaaaaaaaaaaaaaaaaaaa", "blob-bbbbbbbbbbbbbbbbbbbbbbbb"
	if err := e.st.CreateBlob(ctx, store.Blob{ID: pendingID, Owner: "key:a", State: store.BlobPending, CreatedAt: e.t0, ExpiresAt: e.t0.Add(24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{pendingID + ".part", orphanID, ready.BlobID + ".part", "unrelated"} {
		if err := os.WriteFile(filepath.Join(e.dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// This process (started at t0) sees a pending record created at t0 as its own, in flight.
	if _, err := e.svc.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.GetBlob(ctx, pendingID); err != nil {
		t.Fatalf("an in-flight pending blob was swept: %v", err)
	}
	// A restart: a new process on the same store and dir.
	e.clock.Add(time.Second)
	svc2, err := blobs.New(blobs.Config{Store: e.st, Dir: e.dir, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	svc2.Start(ctx)
	defer svc2.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := e.st.GetBlob(ctx, pendingID)
		if errcode.Is(err, errcode.BlobNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted relay did not sweep the previous process's pending blob")
		}
		time.Sleep(20 * time.Millisecond)
	}
	svc2.Close()
	ents, _ := os.ReadDir(e.dir)
	var got []string
	for _, en := range ents {
		got = append(got, en.Name())
	}
	if strings.Join(got, ",") != strings.Join([]string{ready.BlobID, "unrelated", "url-key"}, ",") {
		t.Fatalf("after the restart's sweep the dir holds %v", got)
	}
	if b, err := svc2.Get(ctx, "key:a", ready.BlobID); err != nil || b.Size != 4 {
		t.Fatalf("the ready blob after restart: %+v, %v", b, err)
	}
}

// TestCallDeadline: a machine that stalls mid-file makes the pull fail at CallTimeout saying
// so, with nothing stored.
func TestCallDeadline(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	stall := machineServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(hostfiles.HeaderSize, "1000")
		w.Header().Set("Content-Length", "1000")
		_, _ = w.Write(make([]byte, 10))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer close(release)
	e := newEnv(t, blobs.Config{CallTimeout: 300 * time.Millisecond, Machines: machines{"slow": stall}})
	began := time.Now()
	_, err := e.svc.Pull(context.Background(), "key:a", "slow", "/big")
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("pull took %v with a 300ms deadline", took)
	}
	er := wantCode(t, err, errcode.CommandTimeout)
	if !strings.Contains(er.Message, "did not finish within 300ms") || er.Details["bytes_moved"] != int64(10) {
		t.Fatalf("timeout error = %v %v", er.Message, er.Details)
	}
	assertFiles(t, e)
}
