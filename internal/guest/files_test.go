//go:build linux

package guest_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

func (a *agent) write(t *testing.T, path string, mode uint32, data []byte) guest.FileInfo {
	t.Helper()
	fi, err := a.c.WriteFile(ctxT(t, 30*time.Second), path, mode, bytes.NewReader(data))
	if err != nil {
		t.Fatalf("WriteFile(%s): %v", path, err)
	}
	return fi
}

func (a *agent) read(t *testing.T, path string, offset, length, limit int64) ([]byte, int64) {
	t.Helper()
	body, size, err := a.c.ReadFile(ctxT(t, 30*time.Second), path, offset, length, limit)
	if err != nil {
		t.Fatalf("ReadFile(%s, %d, %d): %v", path, offset, length, err)
	}
	defer body.Close()
	data, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	return data, size
}

func TestFileBinaryRoundTrip(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	data := make([]byte, 256*3)
	for i := range data {
		data[i] = byte(i)
	}
	fi := a.write(t, "bin.dat", 0o644, data)
	if fi.Path != filepath.Join(a.workdir, "bin.dat") || fi.Name != "bin.dat" || fi.Type != "file" || fi.Size != int64(len(data)) || fi.Mode != "0644" {
		t.Fatalf("info %+v", fi)
	}
	got, size := a.read(t, "bin.dat", 0, 0, 0)
	if !bytes.Equal(got, data) || size != int64(len(data)) {
		t.Fatalf("read back %d bytes (size %d), differ", len(got), size)
	}
	// Empty files work too.
	a.write(t, "empty", 0o644, nil)
	if got, size := a.read(t, "empty", 0, 0, 0); len(got) != 0 || size != 0 {
		t.Fatalf("empty: %q %d", got, size)
	}
}

func TestFileLargeRoundTrip(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	const n = 50 << 20
	src := rand.NewChaCha8([32]byte{1, 2, 3})
	h := sha256.New()
	fi, err := a.c.WriteFile(ctxT(t, 60*time.Second), filepath.Join(a.workdir, "big"), 0o600, io.TeeReader(io.LimitReader(src, n), h))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != n || fi.Mode != "0600" {
		t.Fatalf("info %+v", fi)
	}
	want := h.Sum(nil)
	body, size, err := a.c.ReadFile(ctxT(t, 60*time.Second), "big", 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	h2 := sha256.New()
	got, err := io.Copy(h2, body)
	if err != nil || got != n || size != n {
		t.Fatalf("read %d bytes (size %d): %v", got, size, err)
	}
	if !bytes.Equal(h2.Sum(nil), want) {
		t.Fatal("sha256 differs")
	}
}

func TestFileAtomicReplaceAndModes(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	a.write(t, "f.txt", 0o644, []byte("old content"))
	// A reader holding the old file keeps seeing it whole: the new file is renamed over it,
	// not rewritten in place.
	old, err := os.Open(filepath.Join(a.workdir, "f.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	fi := a.write(t, "f.txt", 0o600, []byte("new"))
	if fi.Mode != "0600" || fi.Size != 3 {
		t.Fatalf("info %+v", fi)
	}
	if got, _ := a.read(t, "f.txt", 0, 0, 0); string(got) != "new" {
		t.Fatalf("content %q", got)
	}
	if b, _ := io.ReadAll(old); string(b) != "old content" {
		t.Fatalf("old handle sees %q", b)
	}
	dl, err := a.c.List(ctxT(t, 10*time.Second), ".")
	if err != nil {
		t.Fatal(err)
	}
	if dl.Total != 1 || len(dl.Entries) != 1 || dl.Entries[0].Name != "f.txt" {
		t.Fatalf("temp files left behind: %+v", dl)
	}

	for _, mode := range []uint32{0o755, 0o640, 0o400, 0o4755, 0o1777} {
		fi := a.write(t, "m", mode, []byte("x"))
		st, err := a.c.Stat(ctxT(t, 10*time.Second), "m")
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%04o", mode)
		if fi.Mode != want || st.Mode != want {
			t.Fatalf("mode %s / %s, want %s", fi.Mode, st.Mode, want)
		}
	}
	// Writing through a symlink replaces its target, not the link.
	a.write(t, "target", 0o644, []byte("t1"))
	if err := os.Symlink("target", filepath.Join(a.workdir, "link")); err != nil {
		t.Fatal(err)
	}
	a.write(t, "link", 0o644, []byte("t2"))
	if got, _ := a.read(t, "target", 0, 0, 0); string(got) != "t2" {
		t.Fatalf("target %q", got)
	}
	if st, err := a.c.Stat(ctxT(t, 10*time.Second), "link"); err != nil || st.LinkTarget != "target" || st.Type != "file" {
		t.Fatalf("link %+v %v", st, err)
	}
}

func TestFileWriteErrors(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := ctxT(t, 10*time.Second)
	_, err := a.c.WriteFile(ctx, "no/such/dir/f", 0o644, strings.NewReader("x"))
	wantCode(t, err, errcode.FileNotFound, "mkdir")
	_, err = a.c.WriteFile(ctx, ".", 0o644, strings.NewReader("x"))
	wantCode(t, err, errcode.InvalidArgument, "is a directory")
	_, err = a.c.WriteFile(ctx, "a\x00b", 0o644, strings.NewReader("x"))
	wantCode(t, err, errcode.InvalidArgument, "NUL")
	a.write(t, "plain", 0o644, []byte("x"))
	_, err = a.c.WriteFile(ctx, "plain/child", 0o644, strings.NewReader("x"))
	wantCode(t, err, errcode.InvalidArgument, "not a directory")
	if dl, err := a.c.List(ctx, "."); err != nil || dl.Total != 1 {
		t.Fatalf("list after failures: %+v %v", dl, err)
	}
}

func TestFileRanges(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	a.write(t, "digits", 0o644, []byte("0123456789"))
	tests := []struct {
		offset, length, limit int64
		want                  string
	}{
		{0, 0, 0, "0123456789"},
		{2, 3, 0, "234"},
		{8, 0, 0, "89"},
		{8, 100, 0, "89"},
		{0, 100, 0, "0123456789"},
		{10, 0, 0, ""},
		{20, 5, 0, ""},
		{0, 4, 4, "0123"},
		{6, 0, 4, "6789"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d+%d/%d", tc.offset, tc.length, tc.limit), func(t *testing.T) {
			t.Parallel()
			got, size := a.read(t, "digits", tc.offset, tc.length, tc.limit)
			if string(got) != tc.want || size != 10 {
				t.Fatalf("got %q size %d, want %q", got, size, tc.want)
			}
		})
	}
}

func TestFileTooLarge(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	a.write(t, "k", 0o644, bytes.Repeat([]byte("k"), 1000))
	for _, tc := range []struct{ offset, length int64 }{{0, 0}, {0, 101}, {500, 0}} {
		_, _, err := a.c.ReadFile(ctxT(t, 10*time.Second), "k", tc.offset, tc.length, 100)
		wantCode(t, err, errcode.FileTooLarge, "offset and length")
		e, _ := errcode.As(err)
		if e.Details["size"] != float64(1000) || e.Details["limit"] != float64(100) {
			t.Fatalf("details %v", e.Details)
		}
	}
	if got, _ := a.read(t, "k", 900, 0, 100); len(got) != 100 {
		t.Fatalf("%d bytes", len(got))
	}
	// A huge sparse file is refused by default and streamed in ranges without reading it all.
	f, err := os.Create(filepath.Join(a.workdir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(10 << 30); err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteAt([]byte("end"), 10<<30-3)
	f.Close()
	_, _, err = a.c.ReadFile(ctxT(t, 10*time.Second), "sparse", 0, 0, 0)
	wantCode(t, err, errcode.FileTooLarge, "")
	if got, size := a.read(t, "sparse", 10<<30-5, 0, 0); string(got) != "\x00\x00end" || size != 10<<30 {
		t.Fatalf("tail %q size %d", got, size)
	}
}

func TestFileReadSpecial(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	fifo := filepath.Join(a.workdir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, _, err := a.c.ReadFile(ctxT(t, 5*time.Second), "fifo", 0, 0, 0)
	wantCode(t, err, errcode.InvalidArgument, "FIFO")
	if time.Since(start) > 3*time.Second {
		t.Fatal("FIFO read hung")
	}
	_, _, err = a.c.ReadFile(ctxT(t, 5*time.Second), "/dev/null", 0, 0, 0)
	wantCode(t, err, errcode.InvalidArgument, "character device")
	_, _, err = a.c.ReadFile(ctxT(t, 5*time.Second), ".", 0, 0, 0)
	wantCode(t, err, errcode.InvalidArgument, "directory")
	_, _, err = a.c.ReadFile(ctxT(t, 5*time.Second), "missing", 0, 0, 0)
	wantCode(t, err, errcode.FileNotFound, "does not exist")
	_, err = a.c.List(ctxT(t, 5*time.Second), "fifo")
	wantCode(t, err, errcode.InvalidArgument, "not a directory")
	st, err := a.c.Stat(ctxT(t, 5*time.Second), "fifo")
	if err != nil || st.Type != "other" {
		t.Fatalf("stat fifo %+v %v", st, err)
	}
}

func TestFileStatListMkdirRemove(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := ctxT(t, 30*time.Second)

	fi, err := a.c.Mkdir(ctx, guest.MkdirRequest{Path: "d", Mode: "0700"})
	if err != nil || fi.Type != "dir" || fi.Mode != "0700" || fi.Path != filepath.Join(a.workdir, "d") {
		t.Fatalf("mkdir %+v %v", fi, err)
	}
	_, err = a.c.Mkdir(ctx, guest.MkdirRequest{Path: "d"})
	wantCode(t, err, errcode.Conflict, "exists")
	_, err = a.c.Mkdir(ctx, guest.MkdirRequest{Path: "x/y/z"})
	wantCode(t, err, errcode.FileNotFound, "parents")
	fi, err = a.c.Mkdir(ctx, guest.MkdirRequest{Path: "x/y/z", Parents: true})
	if err != nil || fi.Mode != "0755" {
		t.Fatalf("mkdir -p %+v %v", fi, err)
	}
	if _, err := a.c.Mkdir(ctx, guest.MkdirRequest{Path: "x/y/z", Parents: true}); err != nil {
		t.Fatalf("mkdir -p of an existing directory: %v", err)
	}
	_, err = a.c.Mkdir(ctx, guest.MkdirRequest{Path: "bad", Mode: "rwx"})
	wantCode(t, err, errcode.InvalidArgument, "mode")

	a.write(t, "d/b.txt", 0o644, []byte("bb"))
	a.write(t, "d/a.txt", 0o600, []byte("a"))
	if err := os.Symlink("a.txt", filepath.Join(a.workdir, "d", "c-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("missing", filepath.Join(a.workdir, "d", "dangling")); err != nil {
		t.Fatal(err)
	}
	dl, err := a.c.List(ctx, "d")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range dl.Entries {
		got = append(got, fmt.Sprintf("%s:%s:%d:%s:%s", e.Name, e.Type, e.Size, e.Mode, e.LinkTarget))
	}
	want := []string{"a.txt:file:1:0600:", "b.txt:file:2:0644:", "c-link:symlink:5:0777:a.txt", "dangling:symlink:7:0777:missing"}
	if strings.Join(got, " ") != strings.Join(want, " ") || dl.Total != 4 || dl.Truncated || dl.Path != filepath.Join(a.workdir, "d") {
		t.Fatalf("list %v (total %d, truncated %v)", got, dl.Total, dl.Truncated)
	}

	st, err := a.c.Stat(ctx, "d/c-link")
	if err != nil || st.Type != "file" || st.Size != 1 || st.LinkTarget != "a.txt" {
		t.Fatalf("stat link %+v %v", st, err)
	}
	st, err = a.c.Stat(ctx, "d/dangling")
	if err != nil || st.Type != "symlink" || st.LinkTarget != "missing" {
		t.Fatalf("stat dangling %+v %v", st, err)
	}
	st, err = a.c.Stat(ctx, filepath.Join(a.workdir, "d", "..", "d", "b.txt"))
	if err != nil || st.Path != filepath.Join(a.workdir, "d", "b.txt") || st.ModTime.IsZero() || time.Since(st.ModTime) > time.Hour {
		t.Fatalf("stat %+v %v", st, err)
	}
	_, err = a.c.Stat(ctx, "d/nope")
	wantCode(t, err, errcode.FileNotFound, "does not exist")
	_, err = a.c.Stat(ctx, "d/\x00")
	wantCode(t, err, errcode.InvalidArgument, "NUL")
	_, err = a.c.Stat(ctx, "")
	wantCode(t, err, errcode.InvalidArgument, "path")

	// Remove: a symlink (not its target), a non-empty directory only with recursive.
	if err := a.c.Remove(ctx, "d/c-link", false); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Stat(ctx, "d/a.txt"); err != nil {
		t.Fatalf("symlink target removed: %v", err)
	}
	err = a.c.Remove(ctx, "d", false)
	wantCode(t, err, errcode.InvalidArgument, "recursive")
	if err := a.c.Remove(ctx, "d", true); err != nil {
		t.Fatal(err)
	}
	_, err = a.c.Stat(ctx, "d")
	wantCode(t, err, errcode.FileNotFound, "")
	err = a.c.Remove(ctx, "d", true)
	wantCode(t, err, errcode.FileNotFound, "")
	if err := a.c.Remove(ctx, "x/y/z", false); err != nil {
		t.Fatalf("remove empty dir: %v", err)
	}
	for _, p := range []string{"/", ".", a.workdir, filepath.Dir(a.workdir), a.workdir + "/x/.."} {
		err = a.c.Remove(ctx, p, true)
		wantCode(t, err, errcode.InvalidArgument, "refusing")
	}
	if _, err := os.Stat(a.workdir); err != nil {
		t.Fatal(err)
	}
	err = a.c.Remove(ctx, "a\x00", false)
	wantCode(t, err, errcode.InvalidArgument, "NUL")
}

func TestListTruncated(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	dir := filepath.Join(a.workdir, "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	n := guest.MaxListEntries + 25
	for i := range n {
		// Created in reverse so the listing order is the agent's doing.
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%06d", n-1-i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	dl, err := a.c.List(ctxT(t, 30*time.Second), "many")
	if err != nil {
		t.Fatal(err)
	}
	if !dl.Truncated || dl.Total != n || len(dl.Entries) != guest.MaxListEntries {
		t.Fatalf("truncated %v total %d entries %d", dl.Truncated, dl.Total, len(dl.Entries))
	}
	for i, e := range dl.Entries {
		if e.Name != fmt.Sprintf("f%06d", i) {
			t.Fatalf("entry %d is %s", i, e.Name)
		}
	}
}
