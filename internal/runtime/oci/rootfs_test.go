package oci

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeHost builds a host root with merged /usr links, one real top-level dir and /etc bits.
func fakeHost(t *testing.T) string {
	t.Helper()
	h := t.TempDir()
	for _, d := range []string{"usr/bin", "usr/lib", "lib64", "etc/ssl/certs", "etc/ld.so.conf.d", "etc/alternatives"} {
		if err := os.MkdirAll(filepath.Join(h, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{"bin": "usr/bin", "lib": "usr/lib"} {
		if err := os.Symlink(target, filepath.Join(h, name)); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{"etc/ld.so.cache": "cache", "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n", "etc/ld.so.conf.d/libc.conf": "/usr/local/lib\n"}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(h, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/alternatives/x.conf", filepath.Join(h, "etc/ld.so.conf.d/x.conf")); err != nil {
		t.Fatal(err)
	}
	return h
}

func TestProbeHostLayout(t *testing.T) {
	t.Parallel()
	l := probeHostLayout(fakeHost(t))
	if len(l.Links) != 2 || l.Links["bin"] != "usr/bin" || l.Links["lib"] != "usr/lib" {
		t.Errorf("links %v", l.Links)
	}
	var binds []string
	for _, b := range l.Binds {
		binds = append(binds, b.Source+"→"+b.Destination)
	}
	if got := strings.Join(binds, " "); got != "/usr→/usr /lib64→/lib64 /etc/ssl/certs→/etc/ssl/certs /etc/alternatives→/etc/alternatives" {
		t.Errorf("binds %s", got)
	}
}

func TestEnsureRootfsConcurrent(t *testing.T) {
	t.Parallel()
	host := fakeHost(t)
	layout := probeHostLayout(host)
	dir := filepath.Join(t.TempDir(), "rootfs")
	const n = 8
	paths := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); paths[i], errs[i] = ensureRootfs(dir, host, layout) }()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || paths[i] != filepath.Join(dir, "host") {
			t.Fatalf("creator %d: %q %v", i, paths[i], errs[i])
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("temporary trees left: %v", ents)
	}
	r := paths[0]
	for _, d := range []string{"usr", "proc", "sys", "dev", "tmp", "workspace", "home/agent", "run", ".agentbox/run", "etc/ssl/certs", "etc/alternatives", "lib64"} {
		if fi, err := os.Lstat(filepath.Join(r, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s: not a directory (%v)", d, err)
		}
	}
	for name, want := range map[string]string{"bin": "usr/bin", "lib": "usr/lib", "etc/mtab": "/proc/self/mounts", "etc/ld.so.conf.d/x.conf": "/etc/alternatives/x.conf"} {
		if got, err := os.Readlink(filepath.Join(r, name)); err != nil || got != want {
			t.Errorf("%s → %q (%v), want %q", name, got, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(r, "sbin")); err == nil {
		t.Error("sbin must not exist: the host has none")
	}
	if fi, err := os.Stat(filepath.Join(r, ".agentbox/agentbox")); err != nil || fi.Size() != 0 || !fi.Mode().IsRegular() {
		t.Errorf("agent mount point: %v %v", fi, err)
	}
	passwd, _ := os.ReadFile(filepath.Join(r, "etc/passwd"))
	if !strings.Contains(string(passwd), "agent:x:1000:1000:agent:/home/agent:/bin/sh\n") || !strings.HasPrefix(string(passwd), "root:x:0:0:") {
		t.Errorf("passwd:\n%s", passwd)
	}
	for p, want := range map[string]string{"etc/ld.so.cache": "cache", "etc/ld.so.conf.d/libc.conf": "/usr/local/lib\n"} {
		if b, _ := os.ReadFile(filepath.Join(r, p)); string(b) != want {
			t.Errorf("%s = %q", p, b)
		}
	}
	if fi, _ := os.Stat(filepath.Join(r, "tmp")); fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("tmp mode %v", fi.Mode())
	}
	// Idempotent: a second call uses the tree as is.
	if p, err := ensureRootfs(dir, host, layout); err != nil || p != r {
		t.Fatalf("second call: %q %v", p, err)
	}
}

// TestEnsureRootfsEtcAgentbox: the rootfs has /etc/agentbox (the CA bundle's mount point), and
// a rootfs made before it existed gets it on the next ensureRootfs.
func TestEnsureRootfsEtcAgentbox(t *testing.T) {
	t.Parallel()
	host := fakeHost(t)
	dir := filepath.Join(t.TempDir(), "rootfs")
	p, err := ensureRootfs(dir, host, probeHostLayout(host))
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(p, "etc/agentbox")
	if fi, err := os.Stat(ca); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
		t.Fatalf("%s: %v %v", ca, fi, err)
	}
	if err := os.Remove(ca); err != nil {
		t.Fatal(err)
	}
	if _, err := ensureRootfs(dir, host, probeHostLayout(host)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(ca); err != nil || !fi.IsDir() {
		t.Fatalf("an older rootfs did not get %s: %v", ca, err)
	}
}
