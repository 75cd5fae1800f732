// Package testenv gives tests what real-component tests need: the agentbox binary and its lean
// agent built once per test process, a root check that skips only when not root (CI is root), and host leak checks.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// ModuleRoot returns the directory holding go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}

// Binary builds ./cmd/agentbox and, beside it, the lean agent ./cmd/agentbox-guest
// (CGO_ENABLED=0, as make build does) once per test process and returns the server's path: a
// server run from it finds the agent where make build puts it.
func Binary(t testing.TB) string {
	t.Helper()
	build(t)
	return binPath
}

// GuestBinary is the lean agent Binary builds beside the server (agentbox-guest): what a
// runtime made in a test binds into its sandboxes (oci.Config.GuestBinary) and what the
// kubernetes guest image holds.
func GuestBinary(t testing.TB) string {
	t.Helper()
	build(t)
	return filepath.Join(filepath.Dir(binPath), "agentbox-guest")
}

func build(t testing.TB) {
	t.Helper()
	root := ModuleRoot(t)
	buildOnce.Do(func() {
		removeOrphanBinaries()
		dir, err := os.MkdirTemp("", fmt.Sprintf("agentbox-bin-%d-", os.Getpid()))
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "agentbox")
		// One go build of both main packages writes each into dir under its own name.
		cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/agentbox", "./cmd/agentbox-guest")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("build agentbox: %v\n%s", buildErr, buildOut)
	}
}

// removeOrphanBinaries removes the build dirs of test processes that have exited: a test binary
// has no hook at its end to remove its own (127 MB each, one per package of a run), so the next
// build removes them instead, and a run leaves at most its last packages' behind.
func removeOrphanBinaries() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "agentbox-bin-*-*"))
	for _, dir := range dirs {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(dir), "agentbox-bin-"), "-", 2)[0])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(dir)
		}
	}
}

// RequireRoot skips the test when not running as root, saying why. CI runs as root, so these
// tests run there.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (real runc sandboxes); CI runs as root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Fatal("runc is not installed: run `sudo make deps` (make test installs it)")
	}
}

// ShortTempDir returns a temp dir with a short path (unix socket paths are limited to 108
// bytes), removed at the end of the test. It is searchable by everyone (0711), like a server's
// state dir: sandboxes' root users, unprivileged on the host, must reach a runtime root in it.
func ShortTempDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		releaseMounts(dir) // a failed test may leave a sandbox's disk mounted in it
		os.RemoveAll(dir)
	})
	return dir
}

// LeaksAfter is Leaks, asked again every 100 ms for up to wait while it finds something: a
// short-lived command that merely names the sandbox (a `runsc state` the control loop started
// just before the destroy) is gone by then, while a leak stays.
func LeaksAfter(wait time.Duration, needles ...string) []string {
	deadline := time.Now().Add(wait)
	for {
		found := Leaks(needles...)
		if len(found) == 0 || time.Now().After(deadline) {
			return found
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Leaks returns host resources that mention any of needles: mounts in /proc/self/mountinfo,
// loop devices whose backing file's path mentions them, cgroup directories under
// /sys/fs/cgroup, and processes whose cgroup or command line mentions them.
func Leaks(needles ...string) []string {
	var found []string
	mounts, _ := mountinfo.GetMounts(nil)
	for _, m := range mounts {
		for _, n := range needles {
			if strings.Contains(m.Mountpoint, n) || strings.Contains(m.Root, n) || strings.Contains(m.Source, n) {
				found = append(found, fmt.Sprintf("mount: %s (%s %s, root %s)", m.Mountpoint, m.FSType, m.Source, m.Root))
				break
			}
		}
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range backing {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // detached meanwhile
		}
		for _, n := range needles {
			if strings.Contains(string(b), n) {
				dev := filepath.Base(filepath.Dir(filepath.Dir(p)))
				found = append(found, "loop device /dev/"+dev+": "+strings.TrimSpace(string(b)))
				break
			}
		}
	}
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.Count(p, "/") > 7 {
			return filepath.SkipDir
		}
		for _, n := range needles {
			if strings.Contains(filepath.Base(p), n) {
				found = append(found, "cgroup: "+p)
				return filepath.SkipDir
			}
		}
		return nil
	})
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if stat, _ := os.ReadFile(p + "/stat"); zombie(stat) {
			// An exited process waiting for its parent to collect it holds no resource but a
			// pid. A server killed with SIGKILL leaves its sandboxes' inits to the host's init,
			// which reaps them in its own time.
			continue
		}
		cg, _ := os.ReadFile(p + "/cgroup")
		b, _ := os.ReadFile(p + "/cmdline")
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		for _, n := range needles {
			if strings.Contains(string(cg), n) || strings.Contains(cmd, n) {
				found = append(found, "process "+filepath.Base(p)+": "+cmd)
				break
			}
		}
	}
	return found
}

// zombie reports whether a /proc/PID/stat line is of a zombie ("pid (comm) Z ...").
func zombie(stat []byte) bool {
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// Containers lists the containers a server's state dir holds in each of its OCI runtimes' roots
// (runc's and crun's: <stateDir>/runtimes/<name>/state), as "<runtime>/<id>"; a root that does
// not exist has none. A runtime's own list failing is an error.
func Containers(stateDir string) ([]string, error) {
	var out []string
	for _, rt := range []string{"runc", "crun"} {
		root := filepath.Join(stateDir, "runtimes", rt, "state")
		if _, err := os.Stat(root); err != nil {
			continue
		}
		b, err := exec.Command(rt, "--root", root, "list", "-q").CombinedOutput()
		if err != nil {
			return out, fmt.Errorf("%s --root %s list: %v: %s", rt, root, err, b)
		}
		for _, id := range strings.Fields(string(b)) {
			out = append(out, rt+"/"+id)
		}
	}
	return out, nil
}
