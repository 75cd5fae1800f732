package main

import (
	"bytes"
	"context"
	"flag"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv/imagefake"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestImageFlags: serve's and mcp's image flags parse into the config; credentials are
// host=user:password, from flags and from a file that only its owner can read.
func TestImageFlags(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg := config.Default()
	registerImageFlags(fs, &cfg)
	err := fs.Parse([]string{"--image-cache-mb", "512", "--registry-auth", "ghcr.io=me:tok:with:colons", "--registry-auth", "localhost:5000=u:p",
		"--insecure-registry", "reg.lab:5000", "--insecure-registry", "10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ImageCacheMB != 512 || !slices.Equal(cfg.InsecureRegistries, []string{"reg.lab:5000", "10.0.0.1"}) || len(cfg.RegistryAuth) != 2 {
		t.Fatalf("config %+v", cfg)
	}
	if b, err := imageCacheBytes(cfg); err != nil || b != 512<<20 {
		t.Fatalf("budget %d %v", b, err)
	}
	auth, err := registryAuth(cfg)
	want := []image.RegistryAuth{{Host: "ghcr.io", Username: "me", Password: "tok:with:colons"}, {Host: "localhost:5000", Username: "u", Password: "p"}}
	if err != nil || !slices.Equal(auth, want) {
		t.Fatalf("auth %+v %v", auth, err)
	}
	for _, bad := range []string{"ghcr.io", "ghcr.io=user", "=u:p", "ghcr.io=:p", "a/b=u:p"} {
		if _, err := parseRegistryAuth("--registry-auth", bad); err == nil || !strings.Contains(err.Error(), "host=user:password") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	cfg.ImageCacheMB = -1
	if _, err := imageCacheBytes(cfg); err == nil || !strings.Contains(err.Error(), "--image-cache-mb") {
		t.Fatalf("negative budget: %v", err)
	}
	cfg.ImageCacheMB, cfg.StateDir = 0, t.TempDir()
	if b, err := imageCacheBytes(cfg); err != nil || b <= 0 || b > MaxImageCacheMB<<20 {
		t.Fatalf("default budget %d %v", b, err)
	}

	// The file: comments and blank lines skipped, a bad line named, a readable file refused.
	file := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(file, []byte("# creds\n\nquay.io=bot:secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err = registryAuth(config.Config{RegistryAuthFile: file})
	if err != nil || len(auth) != 1 || auth[0] != (image.RegistryAuth{Host: "quay.io", Username: "bot", Password: "secret"}) {
		t.Fatalf("file auth %+v %v", auth, err)
	}
	os.WriteFile(file, []byte("quay.io=bot:secret\nnonsense\n"), 0o600)
	if _, err := registryAuth(config.Config{RegistryAuthFile: file}); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("bad line: %v", err)
	}
	os.Chmod(file, 0o644)
	if _, err := registryAuth(config.Config{RegistryAuthFile: file}); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable file: %v", err)
	}
}

// TestProgressViewPlain: off a terminal, one line per layer and phase, never one per report.
func TestProgressViewPlain(t *testing.T) {
	var buf bytes.Buffer
	v := newProgressViewTo(&buf, false, false)
	for _, l := range []string{"sha256:aaaaaaaaaaaaaaaaaaaaaaaa", "sha256:bbbbbbbbbbbbbbbbbbbbbbb"} {
		for i := range 100 {
			v.report(wire.ImageProgress{Ref: "x", Layer: l, Phase: "downloading", Done: int64(i), Total: 100})
		}
		v.report(wire.ImageProgress{Ref: "x", Layer: l, Phase: "unpacking", Done: 100, Total: 100})
		v.report(wire.ImageProgress{Ref: "x", Layer: l, Phase: "done", Done: 100, Total: 100})
	}
	v.report(wire.ImageProgress{Ref: "x", Phase: "done"})
	v.finish(true)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 7 || !strings.Contains(lines[0], "downloading") || !strings.HasPrefix(lines[6], "x: done") {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	quiet := newProgressViewTo(&buf, true, false)
	buf.Reset()
	quiet.report(wire.ImageProgress{Layer: "l", Phase: "downloading"})
	quiet.finish(true)
	if buf.Len() != 0 {
		t.Fatalf("quiet printed %q", buf.String())
	}
}

// TestProgressViewBars: on a "terminal", a bar per layer; finish returns (bars completed or
// aborted) and something was drawn.
func TestProgressViewBars(t *testing.T) {
	for _, ok := range []bool{true, false} {
		var buf syncBuffer
		v := newProgressViewTo(&buf, false, true)
		for i := range 50 {
			v.report(wire.ImageProgress{Ref: "x", Layer: "sha256:aaaa", Phase: "downloading", Done: int64(i) << 20, Total: 50 << 20})
			v.report(wire.ImageProgress{Ref: "x", Layer: "sha256:bbbb", Phase: "downloading", Done: int64(i) << 10, Total: 0})
		}
		v.report(wire.ImageProgress{Ref: "x", Layer: "sha256:aaaa", Phase: "done", Done: 50 << 20, Total: 50 << 20})
		done := make(chan struct{})
		go func() { v.finish(ok); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("finish hung")
		}
		if len(v.bars) != 2 || !strings.Contains(buf.String(), "sha256:aaaa") {
			t.Fatalf("ok=%v: %d bars, output %q", ok, len(v.bars), buf.String())
		}
	}
}

// TestImageCommands: the image commands and sandbox commit against a real REST server over the
// fake runtime and the fake cache: exit codes, and bad input refused.
func TestImageCommands(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(context.Background())
	cache := imagefake.New(t.TempDir())
	cache.AddRemote("python:3.12-slim", image.Config{})
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{Images: cache}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	cache.InUse = st.ImagesInUse
	h := api.New(svc, api.Options{Token: "tok"})
	hs := httptest.NewServer(h)
	defer hs.Close()
	defer h.Close()
	srv := []string{"--server", hs.URL, "--token", "tok"}
	cmd := func(args ...string) int { return run(append(args, srv...)) }

	if rc := cmd("image", "pull", "--quiet", "python:3.12-slim"); rc != 0 {
		t.Fatalf("pull: %d", rc)
	}
	if rc := cmd("image", "pull", "--quiet", "nosuch:1"); rc != 1 {
		t.Fatalf("pull of an absent image: %d", rc)
	}
	if rc := cmd("image", "ls"); rc != 0 {
		t.Fatalf("ls: %d", rc)
	}
	if rc := cmd("image", "inspect", "python:3.12-slim"); rc != 0 {
		t.Fatalf("inspect: %d", rc)
	}
	if rc := cmd("image", "bogus"); rc != 2 {
		t.Fatalf("unknown subcommand: %d", rc)
	}
	if rc := cmd("image", "push", "only-one"); rc != 2 {
		t.Fatalf("push with one argument: %d", rc)
	}
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{Image: "python:3.12-slim"})
	if err != nil {
		t.Fatal(err)
	}
	if rc := cmd("sandbox", "commit", sb.ID, "Bad Name"); rc != 1 {
		t.Fatalf("commit with a bad name: %d", rc)
	}
	if rc := cmd("sandbox", "commit", sb.ID); rc != 2 {
		t.Fatalf("commit without a name: %d", rc)
	}
	if rc := cmd("sandbox", "commit", sb.ID, "tmpl:v1"); rc != 0 {
		t.Fatalf("commit: %d", rc)
	}
	if rc := cmd("image", "push", "tmpl:v1", "localhost:5000/tmpl:v1"); rc != 0 {
		t.Fatalf("push: %d", rc)
	}
	tar := filepath.Join(t.TempDir(), "img.tar")
	os.WriteFile(tar, make([]byte, 1024), 0o644)
	if rc := cmd("image", "import", tar); rc != 0 {
		t.Fatalf("import: %d", rc)
	}
	if rc := cmd("image", "rm", "python:3.12-slim"); rc != 1 {
		t.Fatalf("rm of an image in use: %d", rc)
	}
	if rc := cmd("image", "prune"); rc != 0 {
		t.Fatalf("prune: %d", rc)
	}
	if len(cache.Commits()) != 1 || len(cache.Pushes()) != 1 {
		t.Fatalf("commits %v pushes %v", cache.Commits(), cache.Pushes())
	}
}

// syncBuffer is a bytes.Buffer safe for mpb's render goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
