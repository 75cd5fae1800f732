package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/imagefake"
	"github.com/agentbox/agentbox/internal/wire"
)

// imageServer is the REST server over the fake runtime and the fake image cache.
type imageServer struct {
	svc   *sandbox.Service
	rt    *fake.Runtime
	cache *imagefake.Cache
	url   string
	c     *client.Client
}

func newImageServer(t *testing.T, opts api.Options) *imageServer {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	cache := imagefake.New(t.TempDir())
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{Images: cache}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cache.InUse = st.ImagesInUse
	opts.Token = testToken
	h := api.New(svc, opts)
	hs := httptest.NewUnstartedServer(h)
	hs.Config.ErrorLog = testenv.ServerErrorLog(t) // its check runs after the cleanup below
	hs.Start()
	t.Cleanup(func() {
		h.Close()
		hs.Close()
		svc.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return &imageServer{svc: svc, rt: rt, cache: cache, url: hs.URL, c: client.New(hs.URL, testToken)}
}

func (s *imageServer) post(t *testing.T, path, accept, ctype string, body []byte) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.url+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", ctype)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestImagesREST: pull (one reply, and NDJSON progress frames then the result), list with
// in_use, inspect, create with an image (the record shows image and image_digest), commit,
// push, remove (CONFLICT in use), prune; errors are typed.
func TestImagesREST(t *testing.T) {
	s := newImageServer(t, api.Options{})
	ctx := t.Context()
	s.cache.AddRemote("python:3.12-slim", image.Config{Env: []string{"A=1"}})

	img, err := s.c.PullImage(ctx, "python:3.12-slim", nil)
	if err != nil || img.Digest == "" {
		t.Fatalf("pull: %+v %v", img, err)
	}
	// Streamed: progress frames, then exactly one result frame, last.
	resp := s.post(t, "/v1/images/pull", api.NDJSON, "application/json", []byte(`{"ref":"python:3.12-slim"}`))
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != api.NDJSON {
		t.Fatalf("stream: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	var frames []map[string]json.RawMessage
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var f map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			t.Fatalf("frame %q: %v", sc.Text(), err)
		}
		frames = append(frames, f)
	}
	if len(frames) < 2 || frames[0]["progress"] == nil || frames[len(frames)-1]["result"] == nil {
		t.Fatalf("frames %v: want progress first and the result last", frames)
	}
	for _, f := range frames[:len(frames)-1] {
		if f["result"] != nil || f["error"] != nil {
			t.Fatalf("a result or error before the end: %v", frames)
		}
	}
	// Through the client, with progress.
	var mu sync.Mutex
	var got []wire.ImageProgress
	img, err = s.c.PullImage(ctx, "python:3.12-slim", func(p wire.ImageProgress) { mu.Lock(); got = append(got, p); mu.Unlock() })
	if err != nil || len(got) == 0 {
		t.Fatalf("client pull with progress: %+v %v (%d reports)", img, err, len(got))
	}

	// Bad input, typed, before any stream.
	if _, err := s.c.PullImage(ctx, "Not A Ref", func(wire.ImageProgress) {}); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("bad ref: %v", err)
	}
	if _, err := s.c.PullImage(ctx, "nosuch:1", func(wire.ImageProgress) {}); errcode.Of(err) != errcode.ImageNotFound {
		t.Fatalf("absent image, streamed: %v", err)
	}
	if _, err := s.c.PullImage(ctx, "nosuch:1", nil); errcode.Of(err) != errcode.ImageNotFound {
		t.Fatalf("absent image: %v", err)
	}
	if r := s.post(t, "/v1/images/pull", "", "application/json", []byte(`{"ref":"nosuch:1"}`)); r.StatusCode != http.StatusNotFound {
		t.Fatalf("absent image: HTTP %s, want 404", r.Status)
	}

	sb, err := s.c.Create(ctx, wire.CreateRequest{Image: "python:3.12-slim"})
	if err != nil || sb.ImageDigest != img.Digest || sb.Image != "python:3.12-slim" {
		t.Fatalf("create: %+v %v", sb, err)
	}
	var raw map[string]any
	r := s.get(t, "/v1/sandboxes/"+sb.ID)
	if err := json.NewDecoder(r.Body).Decode(&raw); err != nil || raw["image_digest"] != img.Digest || raw["image"] != "python:3.12-slim" {
		t.Fatalf("record JSON %v %v", raw, err)
	}

	list, err := s.c.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inUse := 0
	for _, im := range list {
		if im.Digest == img.Digest {
			inUse = im.InUse
		}
	}
	if inUse != 1 {
		t.Fatalf("list: %+v (want %s in use by 1)", list, img.Digest)
	}
	if got, err := s.c.InspectImage(ctx, "python:3.12-slim"); err != nil || got.Digest != img.Digest || got.InUse != 1 {
		t.Fatalf("inspect: %+v %v", got, err)
	}
	if _, err := s.c.InspectImage(ctx, "sha256:"+strings.Repeat("0", 64)); errcode.Of(err) != errcode.ImageNotFound {
		t.Fatalf("inspect absent: %v", err)
	}
	if _, err := s.c.RemoveImage(ctx, "python:3.12-slim", false); errcode.Of(err) != errcode.Conflict {
		t.Fatalf("remove in use: %v", err)
	}

	layer, err := s.rt.WritableLayer(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer.Dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	committed, err := s.c.Commit(ctx, sb.ID, "tmpl:v1")
	if err != nil || committed.Parent != img.Digest {
		t.Fatalf("commit: %+v %v", committed, err)
	}
	host, err := s.c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Commit(ctx, host.ID, "x:1"); errcode.Of(err) != errcode.UnsupportedOp {
		t.Fatalf("commit host: %v", err)
	}
	if _, err := s.c.Commit(ctx, sb.ID, "BAD NAME"); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("commit bad name: %v", err)
	}
	var pushed []wire.ImageProgress
	if err := s.c.PushImage(ctx, "tmpl:v1", "localhost:5000/tmpl:v1", func(p wire.ImageProgress) { pushed = append(pushed, p) }); err != nil || len(pushed) == 0 {
		t.Fatalf("push: %v (%d reports)", err, len(pushed))
	}
	if err := s.c.PushImage(ctx, "tmpl:v1", "", nil); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("push without ref: %v", err)
	}
	if p := s.cache.Pushes(); len(p) != 1 || p[0] != "tmpl:v1 → localhost:5000/tmpl:v1" {
		t.Fatalf("pushes %v", p)
	}

	if _, err := s.c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if removed, err := s.c.RemoveImage(ctx, "python:3.12-slim", false); err != nil || len(removed) == 0 {
		t.Fatalf("remove: %v %v", removed, err)
	}
	if _, err := s.c.PruneImages(ctx, true); err != nil {
		t.Fatalf("prune: %v", err)
	}
	if r := s.del(t, "/v1/images?ref=x:1&force=maybe"); r.StatusCode != http.StatusBadRequest {
		t.Fatalf("force=maybe: %s", r.Status)
	}
}

// TestCreateWithPullProgress: a create that pulls its image streams the pull's progress as NDJSON
// frames when asked (the Go client's CreateWithProgress), then the sandbox; without
// progress it is one 201 reply.
func TestCreateWithPullProgress(t *testing.T) {
	s := newImageServer(t, api.Options{})
	s.cache.AddRemote("node:22", image.Config{})
	s.cache.AddRemote("node:23", image.Config{})
	var mu sync.Mutex
	var got []wire.ImageProgress
	ctx := t.Context()
	sb, err := s.c.CreateWithProgress(ctx, wire.CreateRequest{Image: "node:22"}, func(p wire.ImageProgress) { mu.Lock(); got = append(got, p); mu.Unlock() })
	if err != nil || sb.ImageDigest == "" || sb.State != wire.StateRunning {
		t.Fatalf("create: %+v %v", sb, err)
	}
	mu.Lock()
	n := len(got)
	mu.Unlock()
	if n == 0 {
		t.Fatal("no progress reported for a create that pulled")
	}
	if _, err := s.c.Create(ctx, wire.CreateRequest{Image: "nosuch:1"}); errcode.Of(err) != errcode.ImageNotFound {
		t.Fatalf("streamed create of an absent image: %v", err)
	}
	r := s.post(t, "/v1/sandboxes", "", "application/json", []byte(`{"image":"node:23"}`))
	if r.StatusCode != http.StatusCreated {
		t.Fatalf("create without progress: %s", r.Status)
	}
	if r := s.post(t, "/v1/sandboxes", api.NDJSON, "application/json", []byte(`{"image":"Bad Ref"}`)); r.StatusCode != http.StatusBadRequest {
		t.Fatalf("streamed create of a bad reference: %s, want 400 before any stream", r.Status)
	}
}

// TestImagesImportBounded: an import within the bound adds the image; a body over it is
// FILE_TOO_LARGE (by Content-Length, and when streamed without one).
func TestImagesImportBounded(t *testing.T) {
	s := newImageServer(t, api.Options{MaxImportBytes: 1000})
	imgs, err := s.c.ImportImages(t.Context(), bytes.NewReader(make([]byte, 1000)), nil)
	if err != nil || len(imgs) != 1 || imgs[0].Ref != "imported:1000" {
		t.Fatalf("import: %+v %v", imgs, err)
	}
	if _, err := s.c.ImportImages(t.Context(), bytes.NewReader(make([]byte, 1001)), nil); errcode.Of(err) != errcode.FileTooLarge {
		t.Fatalf("import over the bound: %v", err)
	}
	// No Content-Length (a pipe): cut at the bound while streaming.
	pr, pw := ioPipe()
	go func() { pw.Write(make([]byte, 5000)); pw.Close() }()
	if _, err := s.c.ImportImages(t.Context(), pr, func(wire.ImageProgress) {}); errcode.Of(err) != errcode.FileTooLarge {
		t.Fatalf("streamed import over the bound: %v", err)
	}
	if list, _ := s.c.ListImages(t.Context()); len(list) != 1 {
		t.Fatalf("images after the refused imports: %+v", list)
	}
	// A large body streamed while the reply streams progress (full duplex).
	big := newImageServer(t, api.Options{MaxImportBytes: 64 << 20})
	pr, pw = ioPipe()
	go func() {
		chunk := make([]byte, 1<<20)
		for range 16 {
			if _, err := pw.Write(chunk); err != nil {
				break
			}
		}
		pw.Close()
	}()
	imgs, err = big.c.ImportImages(t.Context(), pr, func(wire.ImageProgress) {})
	if err != nil || len(imgs) != 1 || imgs[0].Ref != "imported:16777216" {
		t.Fatalf("streamed 16 MiB import: %+v %v", imgs, err)
	}
}

// TestImagesWithoutCache: a server without a cache answers UNSUPPORTED_OPERATION, typed.
func TestImagesWithoutCache(t *testing.T) {
	f := newFakeServer(t)
	if _, err := f.c.ListImages(t.Context()); errcode.Of(err) != errcode.UnsupportedOp {
		t.Fatalf("list: %v", err)
	}
	if _, err := f.c.PullImage(t.Context(), "python:3", func(wire.ImageProgress) {}); errcode.Of(err) != errcode.UnsupportedOp {
		t.Fatalf("pull: %v", err)
	}
	if _, err := f.c.Create(t.Context(), wire.CreateRequest{Image: "python:3"}); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("create: %v", err)
	}
}

func (s *imageServer) get(t *testing.T, path string) *http.Response {
	return s.req(t, http.MethodGet, path)
}

func (s *imageServer) del(t *testing.T, path string) *http.Response {
	return s.req(t, http.MethodDelete, path)
}

func (s *imageServer) req(t *testing.T, method, path string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, s.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func ioPipe() (*io.PipeReader, *io.PipeWriter) { return io.Pipe() }
