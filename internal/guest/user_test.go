//go:build linux

package guest_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/guest"
)

// testUID is the default user of the tests that need root: an id no account of a test host has.
const testUID = 54321

// userAgent starts an agent (the test process, as root) whose commands run as testUID by
// default, in a workdir and home that user owns, as in a sandbox.
func userAgent(t *testing.T) (*agent, guest.User) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("running commands as another user needs root (CI runs as root)")
	}
	dir, err := os.MkdirTemp("", "agu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	u := guest.User{Name: "agent", UID: testUID, GID: testUID, Home: filepath.Join(dir, "home")}
	work := filepath.Join(dir, "work")
	for _, d := range []string{work, u.Home} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, testUID, testUID); err != nil {
			t.Fatal(err)
		}
	}
	return startAgentWith(t, work, &u), u
}

func owner(t *testing.T, path string) (uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

func TestDefaultUser(t *testing.T) {
	t.Parallel()
	a, u := userAgent(t)
	res := a.exec(t, guest.ExecRequest{Argv: []string{"sh", "-c", `id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"; pwd`}})
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	if res.ExitCode != 0 || len(lines) != 5 {
		t.Fatalf("result %+v", res)
	}
	if lines[0] != strconv.Itoa(testUID) || lines[1] != strconv.Itoa(testUID) {
		t.Errorf("uid %s gid %s, want %d", lines[0], lines[1], testUID)
	}
	// The supplementary groups are the command's exec tag only.
	groups := strings.Fields(lines[2])
	if len(groups) != 2 || groups[0] != strconv.Itoa(testUID) {
		t.Errorf("groups %q, want the primary group and one exec tag", lines[2])
	} else if g, _ := strconv.Atoi(groups[1]); g < 50000 || g >= 60000 {
		t.Errorf("exec tag %d outside 50000-59999", g)
	}
	if want := u.Home + " agent agent"; lines[3] != want {
		t.Errorf("HOME USER LOGNAME = %q, want %q", lines[3], want)
	}
	if lines[4] != a.workdir {
		t.Errorf("cwd %s, want %s", lines[4], a.workdir)
	}

	res = a.exec(t, guest.ExecRequest{Argv: []string{"sh", "-c", `id -u; id -g; echo "$HOME $USER"`}, User: "root"})
	if string(res.Stdout) != "0\n0\n/root root\n" {
		t.Errorf("user root: %+v", res)
	}
	res = a.exec(t, guest.ExecRequest{Argv: []string{"sh", "-c", `echo $HOME`}, Env: map[string]string{"HOME": "/elsewhere"}})
	if string(res.Stdout) != "/elsewhere\n" {
		t.Errorf("the request's env does not override HOME: %q", string(res.Stdout))
	}

	// The default user writes where it owns, and nowhere root owns.
	res = a.exec(t, guest.ExecRequest{Argv: []string{"sh", "-c", `touch mine "$HOME/mine" && touch /etc/agentbox-user-test`}})
	if res.ExitCode == 0 {
		os.Remove("/etc/agentbox-user-test")
		t.Fatalf("the default user could write /etc: %+v", res)
	}
	for _, p := range []string{filepath.Join(a.workdir, "mine"), filepath.Join(u.Home, "mine")} {
		if uid, gid := owner(t, p); uid != testUID || gid != testUID {
			t.Errorf("%s is owned by %d:%d, want %d", p, uid, gid, testUID)
		}
	}
}

func TestDefaultUserNeedsRoot(t *testing.T) {
	t.Parallel()
	if os.Geteuid() == 0 {
		t.Skip("checks the refusal an unprivileged agent gives")
	}
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	err = guest.Run(context.Background(), guest.ServerConfig{Socket: filepath.Join(dir, "s"), Workdir: dir,
		DefaultUser: &guest.User{Name: "agent", UID: 1000, GID: 1000, Home: dir}})
	if err == nil || !strings.Contains(err.Error(), "root") {
		t.Fatalf("Run with a default user, not as root: %v", err)
	}
}

func TestFilesOwnedByDefaultUser(t *testing.T) {
	t.Parallel()
	a, _ := userAgent(t)
	ctx := ctxT(t, 30*time.Second)
	check := func(path string, uid uint32, mode string) {
		t.Helper()
		if got, gid := owner(t, path); got != uid || gid != uid {
			t.Errorf("%s is owned by %d:%d, want %d", path, got, gid, uid)
		}
		if fi, err := a.c.Stat(ctx, path); err != nil || fi.Mode != mode {
			t.Errorf("%s: mode %s (%v), want %s", path, fi.Mode, err, mode)
		}
	}
	// New files and directories, parents included, belong to the default user.
	a.write(t, "new.txt", 0o640, []byte("x"))
	check(filepath.Join(a.workdir, "new.txt"), testUID, "0640")
	if _, err := a.c.Mkdir(ctx, guest.MkdirRequest{Path: "p/q/r", Mode: "2750", Parents: true}); err != nil {
		t.Fatal(err)
	}
	check(filepath.Join(a.workdir, "p"), testUID, "0755")
	check(filepath.Join(a.workdir, "p/q"), testUID, "0755")
	check(filepath.Join(a.workdir, "p/q/r"), testUID, "2750")
	if _, err := a.c.Mkdir(ctx, guest.MkdirRequest{Path: "single", Mode: "0700"}); err != nil {
		t.Fatal(err)
	}
	check(filepath.Join(a.workdir, "single"), testUID, "0700")
	// Commands, as that user, can change them.
	res := a.exec(t, guest.ExecRequest{Argv: []string{"sh", "-c", "echo more >> new.txt && touch p/q/r/f single/f && rm -r p"}})
	if res.ExitCode != 0 {
		t.Fatalf("the default user cannot change what the files API created: %+v", res)
	}

	// Replacing a file keeps its owner, whoever it is.
	rootOwned := filepath.Join(a.workdir, "root.txt")
	if err := os.WriteFile(rootOwned, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	a.write(t, "root.txt", 0o644, []byte("new"))
	check(rootOwned, 0, "0644")
	a.write(t, "new.txt", 0o600, []byte("replaced"))
	check(filepath.Join(a.workdir, "new.txt"), testUID, "0600")
}

// TestTimeoutKillsDaemons: a command that starts a setsid daemon and a double-forked orphan and
// then times out takes both with it; a daemon an earlier command left running survives.
func TestTimeoutKillsDaemons(t *testing.T) {
	t.Parallel()
	a, _ := userAgent(t)
	for _, user := range []string{"", "root"} {
		t.Run("user="+user, func(t *testing.T) {
			// An earlier command leaves a daemon behind on purpose, and returns.
			res := a.exec(t, guest.ExecRequest{Argv: []string{"sh", "-c", `setsid sleep 1000 >/dev/null 2>&1 & echo $!`}, User: user})
			kept, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
			if err != nil {
				t.Fatalf("kept daemon: %+v", res)
			}
			t.Cleanup(func() { _ = unix.Kill(kept, unix.SIGKILL) })

			script := `
setsid sh -c 'echo $$; exec sleep 1000' &
sh -c 'sleep 1000 >/dev/null 2>&1 & echo $!'
setsid sh -c 'trap "" TERM HUP; (sleep 1000 >/dev/null 2>&1 & echo $!) ; sleep 1000' &
sleep 1000`
			start := time.Now()
			res = a.exec(t, guest.ExecRequest{Argv: []string{"sh", "-c", script}, TimeoutMs: 1000, User: user})
			if !res.TimedOut || res.Signal != "SIGKILL" {
				t.Fatalf("result %+v", res)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the timeout took %v", d)
			}
			pids := strings.Fields(string(res.Stdout))
			if len(pids) != 3 {
				t.Fatalf("want 3 daemon pids, stdout %q", string(res.Stdout))
			}
			for _, s := range pids {
				pid, _ := strconv.Atoi(s)
				processGone(t, pid, 5*time.Second)
			}
			if err := unix.Kill(kept, 0); err != nil {
				t.Fatalf("the daemon an earlier command left running was killed too: %v", err)
			}
		})
	}
}
