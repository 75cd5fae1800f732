// Package imagelab is the image tests' kit: an OCI registry in process on loopback
// (go-containerregistry's pkg/registry, plain HTTP, optionally behind basic auth, counting
// blob downloads and able to corrupt a blob), and image builders in Go — a busybox-static
// root, layers from in-memory file lists, a multi-arch index, malicious layer tarballs,
// random images of a given size, `docker save` and OCI-layout tarballs.
package imagelab

import (
	"bytes"
	"context"
	"crypto/subtle"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is an OCI registry served on 127.0.0.1.
type Registry struct {
	// Host is "127.0.0.1:PORT": a reference to one of its images is Host+"/repo:tag".
	Host string
	URL  string
	// User and Password are its basic-auth credentials ("" when it needs none).
	User, Password string

	srv *httptest.Server

	mu       sync.Mutex
	blobGets map[string]int // digest → GETs of the blob
	requests int
	corrupt  map[string]bool
	hold     map[string]chan struct{}
}

// Option configures a Registry.
type Option func(*Registry)

// WithBasicAuth makes the registry refuse any request without these credentials (401 with
// a Basic challenge, as a private registry).
func WithBasicAuth(user, password string) Option {
	return func(r *Registry) { r.User, r.Password = user, password }
}

// NewRegistry starts a registry; Close stops it.
func NewRegistry(opts ...Option) (*Registry, error) {
	r := &Registry{blobGets: map[string]int{}, corrupt: map[string]bool{}, hold: map[string]chan struct{}{}}
	for _, o := range opts {
		o(r)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.serve(inner, w, req)
	}))
	r.srv.Listener.Close()
	r.srv.Listener = ln
	r.srv.Start()
	r.URL = r.srv.URL
	r.Host = ln.Addr().String()
	return r, nil
}

// Start starts a registry stopped when the test ends.
func Start(t testing.TB, opts ...Option) *Registry {
	t.Helper()
	r, err := NewRegistry(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// Close stops the registry.
func (r *Registry) Close() {
	r.mu.Lock()
	for d, ch := range r.hold {
		close(ch)
		delete(r.hold, d)
	}
	r.mu.Unlock()
	r.srv.CloseClientConnections()
	r.srv.Close()
}

func blobDigest(path string) (string, bool) {
	i := strings.LastIndex(path, "/blobs/")
	if i < 0 || !strings.HasPrefix(path, "/v2/") {
		return "", false
	}
	d := path[i+len("/blobs/"):]
	if !strings.HasPrefix(d, "sha256:") {
		return "", false
	}
	return d, true
}

func (r *Registry) serve(inner http.Handler, w http.ResponseWriter, req *http.Request) {
	if r.User != "" {
		u, p, ok := req.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(r.User)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(r.Password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="imagelab"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
	}
	d, isBlob := blobDigest(req.URL.Path)
	r.mu.Lock()
	r.requests++
	isGet := req.Method == http.MethodGet && isBlob
	if isGet {
		r.blobGets[d]++
	}
	corrupt := isGet && r.corrupt[d]
	hold := r.hold[d]
	r.mu.Unlock()
	if isGet && hold != nil {
		// Send the first half now and the rest once released: a pull "in flight".
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(body[:len(body)/2])
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		select {
		case <-hold:
		case <-req.Context().Done():
			return
		}
		w.Write(body[len(body)/2:])
		return
	}
	if !corrupt {
		inner.ServeHTTP(w, req)
		return
	}
	rec := httptest.NewRecorder()
	inner.ServeHTTP(rec, req)
	body := bytes.Clone(rec.Body.Bytes())
	if len(body) > 0 {
		body[len(body)/2] ^= 0xff
		body[len(body)-1] ^= 0xff
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(body)
}

// BlobGets is how many GETs of the blob digest the registry answered.
func (r *Registry) BlobGets(digest string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGets[digest]
}

// ResetCounts zeroes the counters.
func (r *Registry) ResetCounts() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.blobGets = map[string]int{}
	r.requests = 0
}

// Corrupt makes the registry serve the blob digest with two bytes flipped (same length).
func (r *Registry) Corrupt(digest string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.corrupt[digest] = true
}

// Hold makes GETs of blob digest send half the blob, then wait until the returned function
// is called (or the registry closes): a download in flight, to cancel or kill.
func (r *Registry) Hold(digest string) (release func()) {
	ch := make(chan struct{})
	r.mu.Lock()
	r.hold[digest] = ch
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			if r.hold[digest] == ch {
				delete(r.hold, digest)
			}
			r.mu.Unlock()
			close(ch)
		})
	}
}

// Ref is the reference of repoTag ("repo:tag" or "repo@sha256:…") in this registry.
func (r *Registry) Ref(repoTag string) string { return r.Host + "/" + repoTag }

func (r *Registry) remoteOpts(ctx context.Context) []remote.Option {
	o := []remote.Option{remote.WithContext(ctx)}
	if r.User != "" {
		o = append(o, remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Password}))
	}
	return o
}

// PushImage pushes img as repoTag and returns its digest.
func (r *Registry) PushImage(ctx context.Context, repoTag string, img v1.Image) (string, error) {
	ref, err := name.ParseReference(r.Ref(repoTag), name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, r.remoteOpts(ctx)...); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	d, err := img.Digest()
	return d.String(), err
}

// Push pushes img as repoTag and returns its digest, failing t on error.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	d, err := r.PushImage(context.Background(), repoTag, img)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// PushIndex pushes a multi-arch index as repoTag and returns its digest.
func (r *Registry) PushIndex(t testing.TB, repoTag string, idx v1.ImageIndex) string {
	t.Helper()
	ref, err := name.ParseReference(r.Ref(repoTag), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, r.remoteOpts(context.Background())...); err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}
