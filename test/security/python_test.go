package security

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/wire"
)

// Attacks that need raw system calls are Python programs (python3 comes from the host's /usr,
// bound read-only into every sandbox). prelude gives them the syscall numbers of this
// architecture and a few helpers.
var prelude = func() string {
	nr, _ := json.Marshal(map[string]int{
		"keyctl": unix.SYS_KEYCTL, "add_key": unix.SYS_ADD_KEY, "request_key": unix.SYS_REQUEST_KEY,
		"bpf": unix.SYS_BPF, "io_uring_setup": unix.SYS_IO_URING_SETUP, "userfaultfd": unix.SYS_USERFAULTFD,
		"unshare": unix.SYS_UNSHARE, "setns": unix.SYS_SETNS, "chroot": unix.SYS_CHROOT, "ptrace": unix.SYS_PTRACE,
		"mount": unix.SYS_MOUNT, "mknodat": unix.SYS_MKNODAT, "sethostname": unix.SYS_SETHOSTNAME,
		"setdomainname": unix.SYS_SETDOMAINNAME, "kill": unix.SYS_KILL, "pivot_root": unix.SYS_PIVOT_ROOT,
		"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT, "name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT,
	})
	return fmt.Sprintf(`
import ctypes, errno, json, os, socket, sys, time
NR = json.loads(%q)
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    """Runs a system call; returns (result, "OK" or the errno name)."""
    ctypes.set_errno(0)
    r = libc.syscall(NR[name], *args)
    e = ctypes.get_errno()
    return r, ("OK" if r >= 0 else errno.errorcode.get(e, str(e)))
def out(*a):
    print(*a, flush=True)
def errname(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if isinstance(e, OSError) and e.errno else type(e).__name__
def wait_release():
    token = sys.argv[1]
    deadline = time.time() + 60
    while time.time() < deadline and not os.path.exists("/workspace/.release-" + token):
        time.sleep(0.05)
def hold():
    """Keeps what the attack got (fds, namespaces, processes) until the host has looked."""
    out("HOLDING")
    wait_release()
`, nr)
}()

// holding runs prog (Python, after the prelude) as user with args (sys.argv[2:]); prog calls
// hold() once it has done its attack, keeping what it got. check runs on the host while it holds, with the output so far;
// then the program is released and its result returned.
func (a *arena) holding(user, prog string, check func(out string), args ...string) wire.ExecResult {
	a.t.Helper()
	res, err := a.tryHolding(user, prog, check, args...)
	if err != nil {
		a.t.Fatalf("exec of the holding program as %q: %v", user, err)
	}
	return res
}

// tryHolding is holding returning the exec's error.
func (a *arena) tryHolding(user, prog string, check func(out string), args ...string) (wire.ExecResult, error) {
	a.t.Helper()
	token := randHex(6)
	var (
		mu    sync.Mutex
		buf   strings.Builder
		once  sync.Once
		res   wire.ExecResult
		err   error
		ready = make(chan struct{})
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		res, err = a.s.c.Exec(ctx, a.id, wire.ExecRequest{Command: append([]string{"python3", "-c", prelude + prog, token}, args...), User: user, TimeoutSeconds: 120},
			func(stream string, data []byte) {
				if stream != "stdout" {
					return
				}
				mu.Lock()
				buf.Write(data)
				held := strings.Contains(buf.String(), "HOLDING\n")
				mu.Unlock()
				if held {
					once.Do(func() { close(ready) })
				}
			})
	}()
	select {
	case <-ready:
	case <-done:
	case <-time.After(2 * time.Minute):
	}
	mu.Lock()
	soFar := buf.String()
	mu.Unlock()
	check(soFar)
	if werr := a.writeFile(a.id, "/workspace/.release-"+token, nil); werr != nil {
		a.t.Logf("release the holder: %v", werr)
	}
	<-done
	return res, err
}

// pyAs runs a Python program (after the prelude) as user with args (sys.argv[2:]); stdin feeds
// it.
func (a *arena) pyAs(user, prog, stdin string, args ...string) wire.ExecResult {
	a.t.Helper()
	return a.execIn(a.id, wire.ExecRequest{Command: append([]string{"python3", "-c", prelude + prog, "-"}, args...), User: user, Stdin: stdin, TimeoutSeconds: 120})
}

// users are the identities inside a sandbox every privilege attack is tried as.
var users = []string{"", "root"}

func userName(u string) string {
	if u == "" {
		return "agent"
	}
	return u
}
