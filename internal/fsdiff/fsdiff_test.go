//go:build linux

package fsdiff

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// write makes a file (and its directories) under dir.
func write(t *testing.T, dir, rel string, data []byte, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(p, uint32(mode)); err != nil { // umask, and setuid as the octal bit
		t.Fatal(err)
	}
}

// whiteout makes an overlay whiteout (a 0:0 character device) at rel; it needs CAP_MKNOD.
func whiteout(t *testing.T, dir, rel string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(p, unix.S_IFCHR|0o000, 0); err != nil {
		t.Fatalf("mknod whiteout (the tests run as root, as the runtimes do): %v", err)
	}
}

func makeOpaque(t *testing.T, dir, rel string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatalf("setxattr trusted.overlay.opaque (needs root): %v", err)
	}
}

type got struct{ change, typ, mode, target string }

func index(cs []Change) map[string]got {
	m := map[string]got{}
	for _, c := range cs {
		m[c.Path] = got{c.Change, c.Type, c.Mode, c.Target}
	}
	return m
}

func paths(cs []Change) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Path)
	}
	return out
}

// side makes a side: an upper layer for "/" and a plain /workspace.
func side(t *testing.T) (upper, ws string, trees []Tree) {
	root := t.TempDir()
	upper, ws = filepath.Join(root, "upper"), filepath.Join(root, "ws")
	for _, d := range []string{upper, ws} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return upper, ws, []Tree{{Path: "/", Dir: upper, Layer: true}, {Path: "/workspace", Dir: ws}}
}

// TestDiffAgainstImage: everything in the writable trees is added, whiteouts are deleted, the
// nested tree wins over the layer's mount point, and the order is by path component.
func TestDiffAgainstImage(t *testing.T) {
	upper, ws, trees := side(t)
	write(t, upper, "etc/app.conf", []byte("a=1\n"), 0o644)
	whiteout(t, upper, "usr/bin/gone")
	makeOpaque(t, upper, "opt/fresh")
	write(t, upper, "opt/fresh/x", []byte("x"), 0o600)
	if err := os.Mkdir(filepath.Join(upper, "workspace"), 0o755); err != nil { // the mount point
		t.Fatal(err)
	}
	write(t, upper, "workspace/shadowed", []byte("never listed"), 0o644)
	write(t, upper, "proc/mountpoint", []byte("excluded"), 0o644)
	trees[0].Exclude = []string{"/proc"}
	write(t, ws, "a/b/c.txt", []byte("hello\n"), 0o644)
	write(t, ws, "a-b", []byte("x"), 0o644)
	write(t, ws, "suid", []byte("#!/bin/sh\n"), 0o4755)
	if err := os.Symlink("/etc/passwd", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	res, err := Diff(context.Background(), nil, trees, Options{Unified: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/etc", "/etc/app.conf", "/opt", "/opt/fresh", "/opt/fresh/x", "/usr", "/usr/bin", "/usr/bin/gone",
		"/workspace/a", "/workspace/a/b", "/workspace/a/b/c.txt", "/workspace/a-b", "/workspace/link", "/workspace/suid"}
	if p := paths(res.Changes); !slices.Equal(p, want) {
		t.Fatalf("paths\n got %q\nwant %q", p, want)
	}
	m := index(res.Changes)
	checks := map[string]got{
		"/etc/app.conf":   {Added, TypeFile, "0644", ""},
		"/usr/bin/gone":   {Deleted, TypeUnknown, "", ""},
		"/workspace/suid": {Added, TypeFile, "4755", ""},
		"/workspace/link": {Added, TypeSymlink, "0777", "/etc/passwd"},
		"/workspace/a/b":  {Added, TypeDir, "0755", ""},
	}
	for p, w := range checks {
		if m[p] != w {
			t.Errorf("%s: got %+v, want %+v", p, m[p], w)
		}
	}
	if !strings.Contains(res.Diff, "+++ b/workspace/a/b/c.txt\n") || !strings.Contains(res.Diff, "+hello\n") ||
		!strings.Contains(res.Diff, "--- /dev/null\n") {
		t.Errorf("unified diff lacks the added text file:\n%s", res.Diff)
	}
}

// TestDiffKnownChanges compares a side with a changed copy of itself: text, binary (same size,
// so by content), mode, setuid, deletion (plain and by whiteout), symlink retarget, nested
// directories, an opaque directory hiding the old layer's files, and a file replaced by a
// directory.
func TestDiffKnownChanges(t *testing.T) {
	oup, ows, old := side(t)
	nup, nws, new := side(t)
	mtime := time.Unix(1_700_000_000, 0)
	both := func(rel string, data []byte, mode os.FileMode, layer bool) {
		for _, d := range [][2]string{{oup, ows}, {nup, nws}} {
			dir := d[1]
			if layer {
				dir = d[0]
			}
			write(t, dir, rel, data, mode)
			if err := os.Chtimes(filepath.Join(dir, rel), mtime, mtime); err != nil {
				t.Fatal(err)
			}
		}
	}
	both("same.txt", []byte("unchanged\n"), 0o644, false)
	both("text.txt", []byte("one\ntwo\nthree\n"), 0o644, false)
	both("bin.dat", []byte{0, 1, 2, 3, 4, 5}, 0o644, false)
	both("mode.sh", []byte("echo\n"), 0o644, false)
	both("tool", []byte("ELF"), 0o755, false)
	both("doomed", []byte("bye\n"), 0o644, false)
	both("etc/layered", []byte("in the old layer\n"), 0o644, true)
	both("var/cache/a", []byte("a"), 0o644, true)
	both("var/cache/b", []byte("b"), 0o644, true)
	both("swap", []byte("file"), 0o644, false)
	for _, d := range []string{ows, nws} {
		if err := os.Symlink("target-1", filepath.Join(d, "ln")); err != nil {
			t.Fatal(err)
		}
	}
	// The changes, on the new side.
	write(t, nws, "text.txt", []byte("one\n2\nthree\n"), 0o644)
	write(t, nws, "bin.dat", []byte{0, 1, 2, 9, 4, 5}, 0o644) // same size: only content tells
	if err := os.Chtimes(filepath.Join(nws, "bin.dat"), mtime, mtime); err != nil {
		t.Fatal(err)
	}
	must(t, os.Chmod(filepath.Join(nws, "mode.sh"), 0o755))
	must(t, unix.Chmod(filepath.Join(nws, "tool"), 0o4755))
	must(t, os.Remove(filepath.Join(nws, "doomed")))
	must(t, os.Remove(filepath.Join(nup, "etc/layered")))
	whiteout(t, nup, "etc/layered")
	must(t, os.RemoveAll(filepath.Join(nup, "var/cache")))
	makeOpaque(t, nup, "var/cache")
	write(t, nup, "var/cache/c", []byte("c"), 0o644)
	must(t, os.Remove(filepath.Join(nws, "ln")))
	must(t, os.Symlink("target-2", filepath.Join(nws, "ln")))
	write(t, nws, "deep/er/est/file", []byte("new\n"), 0o644)
	must(t, os.Remove(filepath.Join(nws, "swap")))
	write(t, nws, "swap/inner", []byte("x"), 0o644)

	res, err := Diff(context.Background(), old, new, Options{Unified: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]got{
		"/etc/layered":                {Deleted, TypeFile, "0644", ""},
		"/var/cache":                  {Modified, TypeDir, "0755", ""}, // now opaque
		"/var/cache/a":                {Deleted, TypeFile, "0644", ""},
		"/var/cache/b":                {Deleted, TypeFile, "0644", ""},
		"/var/cache/c":                {Added, TypeFile, "0644", ""},
		"/workspace/bin.dat":          {Modified, TypeFile, "0644", ""},
		"/workspace/deep":             {Added, TypeDir, "0755", ""},
		"/workspace/deep/er":          {Added, TypeDir, "0755", ""},
		"/workspace/deep/er/est":      {Added, TypeDir, "0755", ""},
		"/workspace/deep/er/est/file": {Added, TypeFile, "0644", ""},
		"/workspace/doomed":           {Deleted, TypeFile, "0644", ""},
		"/workspace/ln":               {Modified, TypeSymlink, "0777", "target-2"},
		"/workspace/mode.sh":          {Modified, TypeFile, "0755", ""},
		"/workspace/swap":             {Modified, TypeDir, "0755", ""},
		"/workspace/swap/inner":       {Added, TypeFile, "0644", ""},
		"/workspace/text.txt":         {Modified, TypeFile, "0644", ""},
		"/workspace/tool":             {Modified, TypeFile, "4755", ""},
	}
	gotm := index(res.Changes)
	for p, w := range want {
		if gotm[p] != w {
			t.Errorf("%s: got %+v, want %+v", p, gotm[p], w)
		}
	}
	for p := range gotm {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected change %s %+v", p, gotm[p])
		}
	}
	if !slices.IsSortedFunc(paths(res.Changes), PathCompare) {
		t.Errorf("not in path order: %q", paths(res.Changes))
	}
	for _, s := range []string{"--- a/workspace/text.txt\n+++ b/workspace/text.txt\n", "-two\n", "+2\n",
		"--- a/workspace/doomed\n+++ /dev/null\n", "-bye\n"} {
		if !strings.Contains(res.Diff, s) {
			t.Errorf("unified diff lacks %q:\n%s", s, res.Diff)
		}
	}
	if !slices.Contains(res.Skipped, "/workspace/bin.dat") {
		t.Errorf("binary file not listed as skipped: %q", res.Skipped)
	}
	if res.ContentFallback || res.DiffTruncated {
		t.Errorf("fallback %v, truncated %v; want neither", res.ContentFallback, res.DiffTruncated)
	}

	// Owners compare relative to each side's id base: the same in-sandbox owner in two
	// ranges is no change, a different one is.
	base := uint32(100000)
	write(t, nws, "owned", []byte("o"), 0o644)
	write(t, ows, "owned", []byte("o"), 0o644)
	must(t, os.Lchown(filepath.Join(ows, "owned"), 1000, 1000))
	must(t, os.Lchown(filepath.Join(nws, "owned"), int(base)+1000, int(base)+1000))
	shifted := slices.Clone(new)
	for i := range shifted {
		shifted[i].UIDBase, shifted[i].GIDBase = base, base
	}
	res, err = Diff(context.Background(), old, shifted, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := index(res.Changes)["/workspace/owned"]; ok {
		t.Errorf("same relative owner reported as a change")
	}
	res, err = Diff(context.Background(), old, new, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if g := index(res.Changes)["/workspace/owned"]; g.change != Modified {
		t.Errorf("different owner: got %+v, want modified", g)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestDiffPaging: pages of 3 (the last one full) joined are the whole listing, in order, and the last page has
// no cursor.
func TestDiffPaging(t *testing.T) {
	_, ws, trees := side(t)
	for _, p := range []string{"a/1", "a/2", "a/b/3", "a-b", "b", "c/d/e/f", "z"} {
		write(t, ws, p, []byte(p), 0o644)
	}
	all, err := Diff(context.Background(), nil, trees, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if all.NextCursor != "" || len(all.Changes) != 12 {
		t.Fatalf("whole listing: %d changes, cursor %q: %q", len(all.Changes), all.NextCursor, paths(all.Changes))
	}
	var joined []string
	cursor, pages := "", 0
	for {
		res, err := Diff(context.Background(), nil, trees, Options{Cursor: cursor, Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		joined = append(joined, paths(res.Changes)...)
		if res.NextCursor == "" {
			break
		}
		if pages > 10 {
			t.Fatal("paging does not end")
		}
		cursor = res.NextCursor
	}
	if !slices.Equal(joined, paths(all.Changes)) || pages != 4 {
		t.Errorf("pages (%d) joined\n got %q\nwant %q", pages, joined, paths(all.Changes))
	}
}

// TestDiffBounds: the entry bound refuses with a LimitError, the content bound falls back to
// metadata and says so, the unified diff is cut at MaxDiffBytes and large files are skipped.
func TestDiffBounds(t *testing.T) {
	_, ows, old := side(t)
	_, nws, new := side(t)
	for i := range 50 {
		write(t, nws, filepath.Join("many", string(rune('a'+i%26))+strings.Repeat("x", i)), []byte("l\n"), 0o644)
	}
	_, err := Diff(context.Background(), old, new, Options{Limits: Limits{MaxEntries: 20}})
	var le *LimitError
	if !errors.As(err, &le) || le.Max != 20 {
		t.Fatalf("entry bound: err %v, want a LimitError of 20", err)
	}

	big := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	mtime := time.Unix(1_700_000_000, 0)
	for _, d := range []string{ows, nws} {
		write(t, d, "big", big, 0o644)
		must(t, os.Chtimes(filepath.Join(d, "big"), mtime, mtime))
	}
	changed := bytes.Clone(big)
	changed[len(changed)-1] = 'X'
	write(t, nws, "big", changed, 0o644)
	must(t, os.Chtimes(filepath.Join(nws, "big"), mtime, mtime))
	res, err := Diff(context.Background(), old, new, Options{Limits: Limits{MaxCompareBytes: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.ContentFallback {
		t.Errorf("content bound not reported")
	}
	if _, ok := index(res.Changes)["/workspace/big"]; ok {
		t.Errorf("with the content bound hit, equal size and mtime must compare equal (metadata)")
	}
	res, err = Diff(context.Background(), old, new, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.ContentFallback || index(res.Changes)["/workspace/big"].change != Modified {
		t.Errorf("a last-byte change under the bound: fallback %v, change %+v", res.ContentFallback, index(res.Changes)["/workspace/big"])
	}

	write(t, nws, "huge.txt", bytes.Repeat([]byte("line\n"), MaxTextFileBytes/5+1), 0o644)
	res, err = Diff(context.Background(), old, new, Options{Unified: true, MaxDiffBytes: 300})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Skipped, "/workspace/huge.txt") {
		t.Errorf("a file over %d bytes not skipped: %q", MaxTextFileBytes, res.Skipped)
	}
	if !res.DiffTruncated || len(res.Diff) > 300 || len(res.Diff) == 0 || !strings.HasSuffix(res.Diff, "\n") {
		t.Errorf("diff of %d bytes, truncated %v; want ≤300 bytes cut at a line", len(res.Diff), res.DiffTruncated)
	}
}

// TestNoSymlinkFollowed plants symlinks that leave the tree (to a file and to a directory
// outside): the walk lists them as symlinks and never reads through them, and the content
// reader refuses a path through one.
func TestNoSymlinkFollowed(t *testing.T) {
	outside := t.TempDir()
	write(t, outside, "secret", []byte("TOP SECRET\n"), 0o644)
	write(t, outside, "dir/inner", []byte("TOP SECRET\n"), 0o644)
	_, ws, trees := side(t)
	must(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(ws, "file-link")))
	must(t, os.Symlink(filepath.Join(outside, "dir"), filepath.Join(ws, "dir-link")))
	must(t, os.Symlink("../../..", filepath.Join(ws, "up")))
	res, err := Diff(context.Background(), nil, trees, Options{Unified: true})
	if err != nil {
		t.Fatal(err)
	}
	if p := paths(res.Changes); !slices.Equal(p, []string{"/workspace/dir-link", "/workspace/file-link", "/workspace/up"}) {
		t.Errorf("walk went through a symlink: %q", p)
	}
	if strings.Contains(res.Diff, "SECRET") {
		t.Errorf("unified diff read through a symlink:\n%s", res.Diff)
	}
	for _, rel := range []string{"file-link", "dir-link/inner", "up/etc/passwd"} {
		if f, err := openBeneath(ws, rel); err == nil {
			f.Close()
			t.Errorf("openBeneath(%s) followed a symlink", rel)
		}
	}
	// A FIFO never blocks the walk or the reader.
	must(t, unix.Mkfifo(filepath.Join(ws, "fifo"), 0o644))
	if f, err := openBeneath(ws, "fifo"); err == nil {
		f.Close()
		t.Errorf("openBeneath opened a FIFO")
	}
}

// TestManifestChanges: what a command changed, by metadata (a touch with the same size is a
// change; an untouched file is not), deletions included, bounded.
func TestManifestChanges(t *testing.T) {
	upper, ws, trees := side(t)
	write(t, ws, "keep", []byte("k"), 0o644)
	write(t, ws, "touch", []byte("t"), 0o644)
	write(t, ws, "rm", []byte("r"), 0o644)
	write(t, upper, "etc/conf", []byte("c"), 0o644)
	ctx := context.Background()
	before, err := BuildManifest(ctx, trees, "", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour)
	must(t, os.Chtimes(filepath.Join(ws, "touch"), future, future))
	must(t, os.Remove(filepath.Join(ws, "rm")))
	write(t, ws, "new/f", []byte("n"), 0o644)
	must(t, os.Remove(filepath.Join(upper, "etc/conf")))
	whiteout(t, upper, "etc/conf")
	after, err := BuildManifest(ctx, trees, "", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cs, trunc := CompareManifests(before, after, 100)
	want := map[string]string{"/etc": Modified, "/etc/conf": Deleted, "/workspace/new": Added, "/workspace/new/f": Added,
		"/workspace/rm": Deleted, "/workspace/touch": Modified}
	g := map[string]string{}
	for _, c := range cs {
		g[c.Path] = c.Change
	}
	for p, w := range want {
		if g[p] != w {
			t.Errorf("%s: got %q, want %q", p, g[p], w)
		}
	}
	for p := range g {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected change %s %s", p, g[p])
		}
	}
	if trunc {
		t.Error("truncated at 100")
	}
	if cs, trunc = CompareManifests(before, after, 2); len(cs) != 2 || !trunc {
		t.Errorf("limit 2: %d changes, truncated %v", len(cs), trunc)
	}
}

// TestSplitLinesOneLineFile: a one-line file is one line in the unified diff (difflib's own
// SplitLines made it two, "@@ -1,2 +1,2 @@" with an empty context line).
func TestSplitLinesOneLineFile(t *testing.T) {
	for in, want := range map[string][]string{"": nil, "a\n": {"a\n"}, "a": {"a\n"}, "a\nb\n": {"a\n", "b\n"}, "a\nb": {"a\n", "b\n"}} {
		if got := splitLines(in); !slices.Equal(got, want) {
			t.Errorf("splitLines(%q) = %q, want %q", in, got, want)
		}
	}
	old, cur := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(old, "f"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cur, "f"), []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := Diff(context.Background(), []Tree{{Path: "/w", Dir: old}}, []Tree{{Path: "/w", Dir: cur}}, Options{Unified: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Diff, "@@ -1 +1 @@\n-one\n+two\n") {
		t.Errorf("unified diff of a one-line file:\n%s", res.Diff)
	}
}
