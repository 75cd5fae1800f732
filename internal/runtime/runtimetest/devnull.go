//go:build linux

package runtimetest

import (
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

// HostDevNull describes the host's /dev/null as a test sees it: device, inode, type, owner and
// mode. A runtime must never give a sandbox that node: runsc fchowns the stdio it opens for its
// sandbox process to the sentry's user, and runc and crun bind "the host's" /dev/null into a
// container with a user namespace, so a create whose runtime sees the host's node hands it to
// the sandbox (chowned to its root, or shared by every sandbox).
func HostDevNull(t testing.TB) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/dev/null", &st); err != nil {
		t.Fatalf("stat the host's /dev/null: %v", err)
	}
	return fmt.Sprintf("dev=%d ino=%d mode=%o rdev=%d:%d owner=%d:%d", st.Dev, st.Ino, st.Mode,
		unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), st.Uid, st.Gid)
}

// testHostDevNull: creating, using and deleting a sandbox leaves the host's /dev/null as it was
// (a character device 1:3, root's, 0666, the same inode); the sandbox's /dev/null works and is
// not the host's node.
func testHostDevNull(t *testing.T, rt runtime.Runtime) {
	want := "mode=20666 rdev=1:3 owner=0:0"
	before := HostDevNull(t)
	if !strings.HasSuffix(before, want) {
		t.Fatalf("the host's /dev/null is %s before the test, want %s (restore it: rm /dev/null; mknod -m 666 /dev/null c 1 3)", before, want)
	}
	id := NewID()
	spec := DefaultSpec(id)
	if rt.Capabilities().UserNamespaces {
		spec.IDMap = TestIDMap() // the runtimes bind /dev/null, and chown stdio, with one
	}
	c := Start(t, rt, spec)
	res := Exec(t, c, "sh", "-c", `echo x > /dev/null && head -c 1 /dev/null | wc -c && stat -c 'dev=%d ino=%i' /dev/null`)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if res.ExitCode != 0 || len(lines) != 2 || strings.TrimSpace(lines[0]) != "0" {
		t.Fatalf("the sandbox's /dev/null does not work: %+v", res)
	}
	if strings.HasPrefix(before, lines[1]+" ") {
		t.Errorf("the sandbox's /dev/null is the host's node (%s)", lines[1])
	}
	if err := rt.Delete(t.Context(), id); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if after := HostDevNull(t); after != before {
		t.Fatalf("the host's /dev/null changed: %s, was %s", after, before)
	}
}
