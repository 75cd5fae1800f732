//go:build linux

package hostfiles_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostfiles"
)

func newClient(t *testing.T) (*hostfiles.Client, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(hostfiles.NewHandler(hostfiles.Options{}))
	t.Cleanup(srv.Close)
	return hostfiles.NewClient(srv.Client()).WithBase(srv.URL), srv
}

func randBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func wantCode(t *testing.T, err error, code errcode.Code) {
	t.Helper()
	if !errcode.Is(err, code) {
		t.Fatalf("err = %v, want %s", err, code)
	}
}

func readAll(t *testing.T, c *hostfiles.Client, p string, max int64) ([]byte, error) {
	t.Helper()
	rc, size, err := c.Read(context.Background(), p, max)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err == nil && int64(len(b)) != size {
		t.Fatalf("read %d bytes, announced %d", len(b), size)
	}
	return b, err
}

func TestReadRegularAndSymlink(t *testing.T) {
	t.Parallel()
	c, _ := newClient(t)
	dir := t.TempDir()
	data := randBytes(t, 3<<20+17)
	p := filepath.Join(dir, "f.bin")
	if err := os.WriteFile(p, data, 0o640); err != nil {
		t.Fatal(err)
	}
	got, err := readAll(t, c, p, hostfiles.DefaultMaxBytes)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read = %d bytes, %v; want the %d written", len(got), err, len(data))
	}
	// A symlink to a regular file is followed.
	link := filepath.Join(dir, "link")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(t, c, link, hostfiles.DefaultMaxBytes); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read through symlink = %d bytes, %v", len(got), err)
	}
	// Empty file.
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(t, c, empty, 10); err != nil || len(got) != 0 {
		t.Fatalf("read empty = %d bytes, %v", len(got), err)
	}
}

func TestReadRefusals(t *testing.T) {
	t.Parallel()
	c, _ := newClient(t)
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 1001), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	dirLink := filepath.Join(dir, "dirlink")
	if err := os.Symlink(dir, dirLink); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		max  int64
		code errcode.Code
		msg  string
	}{
		{big, 1000, errcode.FileTooLarge, "per-file limit is 1000"},
		{dir, 1000, errcode.InvalidArgument, "a directory"},
		{dirLink, 1000, errcode.InvalidArgument, "a directory"},
		{fifo, 1000, errcode.InvalidArgument, "a FIFO"},
		{"/dev/null", 1000, errcode.InvalidArgument, "a device"},
		{"relative/file", 1000, errcode.InvalidArgument, "not absolute"},
		{"", 1000, errcode.InvalidArgument, "required"},
		{filepath.Join(dir, "missing"), 1000, errcode.FileNotFound, "no such file"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _, err := c.Read(ctx, tc.path, tc.max)
		cancel()
		wantCode(t, err, tc.code)
		if !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Read(%q) = %v, want it to say %q", tc.path, err, tc.msg)
		}
	}
}

// TestReadCapEnforcedByClient: a machine that sends more than the cap asked for is refused.
func TestReadCapEnforcedByClient(t *testing.T) {
	t.Parallel()
	liar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(hostfiles.HeaderSize, "2000")
		w.Header().Set("Content-Length", "2000")
		_, _ = w.Write(make([]byte, 2000))
	}))
	defer liar.Close()
	c := hostfiles.NewClient(liar.Client()).WithBase(liar.URL)
	_, _, err := c.Read(context.Background(), "/x", 1000)
	wantCode(t, err, errcode.FileTooLarge)
	// Announcing one size and sending less: the reader fails, never a silent short file.
	short := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(hostfiles.HeaderSize, "100")
		w.Header().Set("Content-Length", "100")
		_, _ = w.Write(make([]byte, 40))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	defer short.Close()
	c = hostfiles.NewClient(short.Client()).WithBase(short.URL)
	rc, _, err := c.Read(context.Background(), "/x", 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, err := io.ReadAll(rc); err == nil {
		t.Fatalf("short body read as %d bytes without error", len(b))
	}
}

func write(t *testing.T, c *hostfiles.Client, dest string, data []byte) (hostfiles.WriteResult, error) {
	t.Helper()
	return c.Write(context.Background(), dest, int64(len(data)), hostfiles.DefaultMaxBytes, bytes.NewReader(data))
}

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode()
}

// noTemps fails if a temporary file was left in dir.
func noTemps(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".agentbox-push-") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func TestWriteNewFileIs0600(t *testing.T) {
	t.Parallel()
	c, _ := newClient(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "new.bin")
	data := randBytes(t, 1<<20)
	res, err := write(t, c, p, data)
	if err != nil {
		t.Fatal(err)
	}
	if res.Replaced || res.Mode != "0600" || res.Size != int64(len(data)) || res.Path != p {
		t.Fatalf("result = %+v", res)
	}
	if m := mode(t, p); m != 0o600 {
		t.Fatalf("new file mode = %v, want 0600", m)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, data) {
		t.Fatal("content differs")
	}
	noTemps(t, dir)
}

func TestWriteReplaceKeepsModeStripsSpecialBits(t *testing.T) {
	t.Parallel()
	c, _ := newClient(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		old  os.FileMode
		want os.FileMode
	}{
		{"plain", 0o754, 0o754},
		{"setuid", 0o755 | os.ModeSetuid, 0o755},
		{"setgid", 0o750 | os.ModeSetgid, 0o750},
		{"sticky", 0o644 | os.ModeSticky, 0o644},
		{"all", 0o777 | os.ModeSetuid | os.ModeSetgid | os.ModeSticky, 0o777},
	} {
		p := filepath.Join(dir, tc.name)
		if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, tc.old); err != nil {
			t.Fatal(err)
		}
		if m := mode(t, p); m != tc.old {
			t.Fatalf("%s: setup mode %v, want %v", tc.name, m, tc.old)
		}
		res, err := write(t, c, p, []byte("new content"))
		if err != nil {
			t.Fatal(err)
		}
		if m := mode(t, p); m != tc.want {
			t.Errorf("%s: replaced mode = %v, want %v", tc.name, m, tc.want)
		}
		if !res.Replaced {
			t.Errorf("%s: Replaced false", tc.name)
		}
		if got, _ := os.ReadFile(p); string(got) != "new content" {
			t.Errorf("%s: content %q", tc.name, got)
		}
	}
	noTemps(t, dir)
}

func TestWriteReplaceKeepsOwner(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (to give the old file another owner); run it as root")
	}
	c, _ := newClient(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "owned")
	if err := os.WriteFile(p, []byte("old"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 4321, 8765); err != nil {
		t.Fatal(err)
	}
	res, err := write(t, c, p, []byte("new"))
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 4321 || st.Gid != 8765 || res.Owner != "4321:8765" {
		t.Fatalf("owner = %d:%d (reply %q), want 4321:8765", st.Uid, st.Gid, res.Owner)
	}
	if m := mode(t, p); m != 0o640 {
		t.Fatalf("mode = %v, want 0640", m)
	}
}

func TestWriteSymlinkReplacedNotFollowed(t *testing.T) {
	t.Parallel()
	c, _ := newClient(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	res, err := write(t, c, link, []byte("pushed"))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(target); string(got) != "precious" {
		t.Fatalf("symlink target changed to %q", got)
	}
	if m := mode(t, link); m != 0o600 {
		t.Fatalf("dest mode = %v, want a regular 0600 file", m)
	}
	if got, _ := os.ReadFile(link); string(got) != "pushed" || !res.Replaced {
		t.Fatalf("dest = %q, replaced %v", got, res.Replaced)
	}
	// A dangling symlink is replaced too.
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	if _, err := write(t, c, dangling, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "nowhere")); err == nil {
		t.Fatal("the dangling link's target was created")
	}
}

func TestWriteRefusals(t *testing.T) {
	t.Parallel()
	c, _ := newClient(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dest string
		code errcode.Code
		msg  string
	}{
		{filepath.Join(dir, "missing", "f"), errcode.FileNotFound, "does not exist"},
		{filepath.Join(file, "f"), errcode.InvalidArgument, "not a directory"},
		{dir, errcode.InvalidArgument, "a directory"},
		{"/dev/null", errcode.InvalidArgument, "a device"},
		{"rel/f", errcode.InvalidArgument, "not absolute"},
		{"/", errcode.InvalidArgument, "root"},
	} {
		_, err := write(t, c, tc.dest, []byte("data"))
		wantCode(t, err, tc.code)
		if !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Write(%q) = %v, want it to say %q", tc.dest, err, tc.msg)
		}
	}
	// Over the cap the request names.
	_, err := c.Write(context.Background(), filepath.Join(dir, "capped"), 11, 10, bytes.NewReader(make([]byte, 11)))
	wantCode(t, err, errcode.FileTooLarge)
	if _, err := os.Stat(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing parent was created")
	}
	noTemps(t, dir)
}

// TestWriteBodyLengthChecked: a body shorter or longer than the declared size replaces nothing.
func TestWriteBodyLengthChecked(t *testing.T) {
	t.Parallel()
	_, srv := newClient(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "dest")
	if err := os.WriteFile(p, []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		size int
		body int
	}{{"short", 1000, 500}, {"long", 500, 1000}} {
		u := srv.URL + hostfiles.WritePath + "?" + url.Values{"path": {p}, "size": {strint(tc.size)}}.Encode()
		// Chunked (no Content-Length), so only the declared size tells the length.
		req, _ := http.NewRequest(http.MethodPut, u, io.NopCloser(bytes.NewReader(make([]byte, tc.body))))
		req.ContentLength = -1
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "nothing was replaced") {
			t.Errorf("%s: HTTP %d %s", tc.name, resp.StatusCode, b)
		}
		if got, _ := os.ReadFile(p); string(got) != "original" {
			t.Errorf("%s: dest replaced with %d bytes", tc.name, len(got))
		}
	}
	noTemps(t, dir)
}

func strint(n int) string { return strconv.Itoa(n) }

// TestWriteFreeSpaceRefused: a 1 MiB tmpfs refuses a 2 MiB push before a byte is written.
func TestWriteFreeSpaceRefused(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts a tmpfs and needs root; run it as root")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount: %v: %s", err, out)
		}
	})
	c, _ := newClient(t)
	p := filepath.Join(mnt, "f")
	if err := os.WriteFile(p, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := write(t, c, p, make([]byte, 2<<20))
	wantCode(t, err, errcode.FileTooLarge)
	e, _ := errcode.As(err)
	if free, ok := e.Details["free_bytes"].(int64); !ok || free <= 0 || free > 1<<20 {
		t.Fatalf("details = %v, want free_bytes within the 1 MiB filesystem", e.Details)
	}
	if got, _ := os.ReadFile(p); string(got) != "keep" {
		t.Fatalf("dest changed to %d bytes", len(got))
	}
	noTemps(t, mnt)
	// What fits is written.
	if _, err := write(t, c, p, make([]byte, 256<<10)); err != nil {
		t.Fatalf("a 256 KiB push to a 1 MiB filesystem: %v", err)
	}
}

// TestRoundTrip50MiB reads a 50 MiB binary file and writes it elsewhere, byte-exact.
func TestRoundTrip50MiB(t *testing.T) {
	t.Parallel()
	c, _ := newClient(t)
	dir := t.TempDir()
	data := randBytes(t, 50<<20)
	src := filepath.Join(dir, "src.bin")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	rc, size, err := c.Read(context.Background(), src, hostfiles.DefaultMaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	dst := filepath.Join(dir, "dst.bin")
	if _, err := c.Write(context.Background(), dst, size, hostfiles.DefaultMaxBytes, rc); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("round trip: %d bytes, %v; want %d identical", len(got), err, len(data))
	}
}
