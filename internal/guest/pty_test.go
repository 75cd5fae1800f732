//go:build linux

package guest_test

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// term is a PTY session under test: it collects the output in the background.
type term struct {
	t    *testing.T
	s    *guest.PTYSession
	mu   sync.Mutex
	out  bytes.Buffer
	exit *guest.PTYExit
	err  error
	done chan struct{}
}

func openTerm(t *testing.T, a *agent, req guest.PTYRequest) *term {
	t.Helper()
	s, err := a.c.PTY(ctxT(t, 2*time.Minute), req)
	if err != nil {
		t.Fatalf("PTY(%q): %v", req.Argv, err)
	}
	tm := &term{t: t, s: s, done: make(chan struct{})}
	go func() {
		defer close(tm.done)
		for {
			b, x, err := s.Next()
			tm.mu.Lock()
			switch {
			case err != nil:
				tm.err = err
			case x != nil:
				tm.exit = x
			default:
				tm.out.Write(b)
			}
			tm.mu.Unlock()
			if err != nil || x != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { _ = s.Close() })
	return tm
}

func (tm *term) send(s string) {
	tm.t.Helper()
	if _, err := tm.s.Write([]byte(s)); err != nil {
		tm.t.Fatalf("write %q: %v", s, err)
	}
}

func (tm *term) output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.out.String()
}

// waitFor waits until the output matches re and returns the match.
func (tm *term) waitFor(re string) []string {
	tm.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := rx.FindStringSubmatch(tm.output()); m != nil {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
	tm.t.Fatalf("output never matched %q; it is:\n%q", re, tm.output())
	return nil
}

func (tm *term) wait() *guest.PTYExit {
	tm.t.Helper()
	select {
	case <-tm.done:
	case <-time.After(30 * time.Second):
		tm.t.Fatalf("the terminal did not end; output:\n%q", tm.output())
	}
	if tm.err != nil {
		tm.t.Fatalf("terminal: %v; output:\n%q", tm.err, tm.output())
	}
	return tm.exit
}

func TestPTYTTYAndExitCode(t *testing.T) {
	a := startAgent(t)
	tm := openTerm(t, a, guest.PTYRequest{Argv: []string{"sh", "-c", "tty; echo TERM=$TERM; exit 7"}})
	x := tm.wait()
	if x.ExitCode != 7 {
		t.Fatalf("exit code %d, want 7; output %q", x.ExitCode, tm.output())
	}
	if !regexp.MustCompile(`(?m)^/dev/pts/\d+\r?$`).MatchString(tm.output()) {
		t.Fatalf("tty did not print a /dev/pts path: %q", tm.output())
	}
	if !strings.Contains(tm.output(), "TERM=xterm-256color") {
		t.Fatalf("TERM is not the default: %q", tm.output())
	}
}

func TestPTYResizeAndInterrupt(t *testing.T) {
	a := startAgent(t)
	tm := openTerm(t, a, guest.PTYRequest{Argv: []string{"sh"}, Rows: 30, Cols: 90})
	tm.send("stty size\n")
	tm.waitFor(`30 90`)
	if err := tm.s.Resize(41, 123); err != nil {
		t.Fatal(err)
	}
	tm.send("stty size\n")
	tm.waitFor(`41 123`)

	// Ctrl-C (0x03 on the terminal) interrupts the foreground command; the shell lives on.
	tm.send("sleep 100; echo after-sleep-$?\n")
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	tm.send("\x03")
	tm.send("echo alive-$((40+2))\n")
	tm.waitFor(`alive-42`)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Ctrl-C took %v to interrupt sleep", d)
	}
	if strings.Contains(tm.output(), "after-sleep-0") {
		t.Fatalf("sleep was not interrupted: %q", tm.output())
	}
	tm.send("exit 3\n")
	if x := tm.wait(); x.ExitCode != 3 {
		t.Fatalf("exit code %d, want 3", x.ExitCode)
	}
}

func TestPTYLoginShellDefault(t *testing.T) {
	a := startAgent(t)
	tm := openTerm(t, a, guest.PTYRequest{})
	tm.send("echo shell-$((6*7)) $0\n")
	m := tm.waitFor(`shell-42 (\S+)`)
	if !strings.HasPrefix(m[1], "-") {
		t.Errorf("$0 is %q; a login shell's starts with -", m[1])
	}
	tm.send("exit\n")
	if x := tm.wait(); x.ExitCode != 0 {
		t.Fatalf("exit code %d", x.ExitCode)
	}
}

// A dropped connection leaves nothing running: the shell, its foreground job, a background job
// and (with the agent as root: exec tags) a setsid daemon.
func TestPTYDropKillsTree(t *testing.T) {
	a := startAgent(t)
	tm := openTerm(t, a, guest.PTYRequest{Argv: []string{"sh"}})
	tm.send("trap '' HUP; echo shell=$$\n")
	shell := atoi(t, tm.waitFor(`shell=(\d+)`)[1])
	tm.send("sleep 1001 & echo bg=$!\n")
	bg := atoi(t, tm.waitFor(`bg=(\d+)`)[1])
	pids := []int{shell, bg}
	if os.Geteuid() == 0 {
		tm.send("setsid sh -c 'echo daemon=$$; trap \"\" HUP; exec sleep 1002' &\n")
		pids = append(pids, atoi(t, tm.waitFor(`daemon=(\d+)`)[1]))
	}
	tm.send("sleep 1003\n")
	time.Sleep(300 * time.Millisecond)
	for _, p := range pids {
		if procState(p) == "gone" {
			t.Fatalf("process %d is not running before the drop", p)
		}
	}
	_ = tm.s.Close()
	for _, p := range pids {
		processGone(t, p, 15*time.Second)
	}
}

func TestPTYBadRequests(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := a.c.PTY(ctx, guest.PTYRequest{Rows: 5000, Cols: 80})
	wantCode(t, err, errcode.InvalidArgument, "rows and cols")
	_, err = a.c.PTY(ctx, guest.PTYRequest{User: "nobody"})
	wantCode(t, err, errcode.InvalidArgument, "nobody")
	_, err = a.c.PTY(ctx, guest.PTYRequest{Term: "a/b"})
	wantCode(t, err, errcode.InvalidArgument, "term")
	tm := openTerm(t, a, guest.PTYRequest{Argv: []string{"no-such-command-xyz"}})
	if x := tm.wait(); x.ExitCode != 127 {
		t.Fatalf("exit %d, want 127: %q", x.ExitCode, tm.output())
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A host that stops reading stops the command (the terminal's buffer fills and its write
// blocks): nothing is buffered without bound on the way. Then every byte arrives.
func TestPTYSlowReaderBackpressure(t *testing.T) {
	a := startAgent(t)
	const size = 32 << 20
	s, err := a.c.PTY(ctxT(t, 2*time.Minute), guest.PTYRequest{Argv: []string{"sh", "-c", "stty raw; head -c " + strconv.Itoa(size) + " /dev/zero"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	time.Sleep(2 * time.Second) // not reading
	if pids := pidsOf(t, "head -c "+strconv.Itoa(size)+" /dev/zero"); len(pids) == 0 {
		t.Fatal("the command finished while nobody read its output: it was buffered")
	}
	n := 0
	for {
		b, x, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if x != nil {
			if x.ExitCode != 0 || n != size {
				t.Fatalf("exit %d after %d bytes, want 0 after %d", x.ExitCode, n, size)
			}
			return
		}
		if len(b) > guest.MaxPTYData {
			t.Fatalf("a %d-byte frame", len(b))
		}
		n += len(b)
	}
}

// pidsOf lists the live processes whose command line is cmdline (arguments space-separated).
func pidsOf(t *testing.T, cmdline string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ") == cmdline && procState(pid) != "Z" {
			pids = append(pids, pid)
		}
	}
	return pids
}
