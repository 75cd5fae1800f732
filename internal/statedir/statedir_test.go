package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAcquireIsExclusive(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Acquire = %v, want ErrLocked", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	l2.Release()
}

func TestCheckSearchable(t *testing.T) {
	t.Parallel()
	// Not t.TempDir(): its parent is 0700. The temp dir's own ancestors (/tmp) are searchable.
	top, err := os.MkdirTemp("", "abstatedir")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	open := filepath.Join(top, "open")
	closedDir := filepath.Join(top, "closed")
	for _, d := range []string{open, closedDir} {
		if err := os.Mkdir(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	for d, mode := range map[string]os.FileMode{top: 0o711, open: 0o711, closedDir: 0o750} {
		if err := os.Chmod(d, mode); err != nil { // whatever the umask
			t.Fatal(err)
		}
	}
	if err := CheckSearchable(filepath.Join(open, "state")); err != nil {
		t.Fatalf("under 0711 dirs: %v", err)
	}
	err = CheckSearchable(filepath.Join(closedDir, "state"))
	if err == nil {
		t.Fatal("under a 0750 dir: no error")
	}
	for _, want := range []string{"chmod o+x " + closedDir + "`", closedDir + " (0750)", "--state-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	// Through a symlink that lives in a searchable dir, the target's ancestors still count.
	link := filepath.Join(open, "link")
	if err := os.Symlink(closedDir, link); err != nil {
		t.Fatal(err)
	}
	if err := CheckSearchable(filepath.Join(link, "x")); err == nil || !strings.Contains(err.Error(), "chmod o+x "+closedDir) {
		t.Fatalf("through a symlink into a 0750 dir: %v", err)
	}
}

// TestIdentity: one name per directory, however it is written (relative, through a symlink,
// with a trailing slash), the shape a cgroup parent takes, and another for another directory.
func TestIdentity(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "state")
	other := filepath.Join(base, "other")
	for _, d := range []string{dir, other} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(dir, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	id, err := Identity(dir)
	if err != nil || len(id) != len("agentbox-")+8 || !strings.HasPrefix(id, "agentbox-") || strings.Trim(id[9:], "0123456789abcdef") != "" {
		t.Fatalf("Identity(%s) = %q, %v", dir, id, err)
	}
	t.Chdir(base)
	for _, same := range []string{dir + "/", filepath.Join(base, "link"), "state", "./link/"} {
		if got, err := Identity(same); err != nil || got != id {
			t.Errorf("Identity(%s) = %q %v, want %q", same, got, err, id)
		}
	}
	if got, _ := Identity(other); got == id {
		t.Errorf("two directories, one identity %q", id)
	}
}
