package guest

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/text"
)

const (
	// hangupGrace is how long a hung-up command's processes have after SIGHUP before SIGKILL.
	hangupGrace = time.Second
	// ptyDrainWait bounds the wait for the terminal's last output once the command has ended
	// and its tree has been killed.
	ptyDrainWait = 2 * time.Second
)

// handlePTY validates a PTYRequest, switches the connection to PTY frames and runs the command
// on a new pseudo-terminal, the terminal its controlling one in a session of its own.
func (s *server) handlePTY(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), PTYUpgrade) {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "POST /v1/pty needs \"Connection: Upgrade\" and \"Upgrade: %s\"", PTYUpgrade))
		return
	}
	var req PTYRequest
	if err := decodeJSON(w, r, maxSmallBody, &req); err != nil {
		s.writeError(w, err)
		return
	}
	if err := checkPTYSize(req.Rows, req.Cols); err != nil {
		s.writeError(w, err)
		return
	}
	if req.Rows == 0 {
		req.Rows, req.Cols = 24, 80
	}
	if req.Term == "" {
		req.Term = DefaultTerm
	}
	if len(req.Term) > 64 || strings.ContainsAny(req.Term, "\x00=/ ") {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "term %q is not a terminal type name (at most 64 bytes, e.g. xterm-256color)", text.Cut(req.Term, 64)))
		return
	}
	login := len(req.Argv) == 0
	if login {
		req.Argv = []string{"/bin/sh"} // replaced by the user's shell below; validates the rest
	}
	env := map[string]string{"TERM": req.Term}
	for k, v := range req.Env {
		env[k] = v
	}
	sp, err := s.prepareExec(&ExecRequest{Argv: req.Argv, Env: env, Cwd: req.Cwd, User: req.User})
	if err != nil {
		s.writeError(w, err)
		return
	}
	if login {
		name := ""
		if sp.user != nil {
			name = sp.user.Name
		} else if u, err := userByUID(os.Geteuid()); err == nil {
			name = u
		}
		shell := loginShell(name)
		sp.path, sp.failCode, sp.failMsg = shell, 0, ""
		sp.argv = []string{"-" + filepath.Base(shell)} // a login shell, as login(1) starts it
	}

	ptm, tty, err := pty.Open()
	if err != nil {
		s.writeError(w, errcode.Wrap(errcode.CapacityUnavailable, err, "cannot open a pseudo-terminal in the sandbox: %v", err))
		return
	}
	defer ptm.Close()
	closeTTY := sync.OnceFunc(func() { _ = tty.Close() })
	defer closeTTY()
	if err := pty.Setsize(ptm, &pty.Winsize{Rows: uint16(req.Rows), Cols: uint16(req.Cols)}); err != nil {
		s.writeError(w, errcode.Wrap(errcode.Internal, err, "cannot size the pseudo-terminal: %v", err))
		return
	}

	rc := http.NewResponseController(w)
	w.Header().Set("Connection", "Upgrade")
	w.Header().Set("Upgrade", PTYUpgrade)
	w.WriteHeader(http.StatusSwitchingProtocols)
	if err := rc.Flush(); err != nil {
		return
	}
	conn, brw, err := rc.Hijack()
	if err != nil {
		s.log.Warn("guest: cannot take over the connection for a terminal", "err", err)
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Time{})
	s.runPTY(r.Context(), conn, brw.Reader, ptm, tty, closeTTY, sp)
}

// runPTY starts sp on tty and relays frames between conn and ptm until the command ends (then
// the exit frame) or conn drops (then the command's tree is hung up and killed).
func (s *server) runPTY(ctx context.Context, conn net.Conn, in *bufio.Reader, ptm, tty *os.File, closeTTY func(), sp *execSpec) {
	var wmu sync.Mutex
	send := func(typ byte, payload []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return writeFrame(conn, typ, payload)
	}
	sendExit := func(x PTYExit) {
		b, _ := json.Marshal(x)
		_ = send(ptyExit, b)
	}
	if sp.failCode != 0 {
		_ = send(ptyData, []byte(strings.ReplaceAll(sp.failMsg, "\n", "\r\n")))
		sendExit(PTYExit{ExitCode: sp.failCode})
		return
	}
	attr := &os.ProcAttr{
		Dir:   sp.dir,
		Env:   sp.env,
		Files: []*os.File{tty, tty, tty},
		// Its own session, with the terminal as its controlling terminal: the terminal's
		// line discipline then signals its foreground process group (Ctrl-C is SIGINT).
		Sys: s.procAttr(&syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}),
	}
	tree := processTree{since: bootTicks()}
	if s.root {
		tree.tag = s.reaper.tags.acquire()
		defer s.reaper.tags.release(tree.tag)
		cred := &syscall.Credential{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid()), Groups: []uint32{}}
		if sp.user != nil {
			cred.Uid, cred.Gid = sp.user.UID, sp.user.GID
		}
		if tree.tag != 0 {
			cred.Groups = []uint32{tree.tag}
		}
		attr.Sys.Credential = cred
	}
	pid, waitCh, err := s.reaper.start(sp.path, sp.argv, attr)
	closeTTY() // the command has its own copies
	if err != nil {
		code, why := startFailure(err)
		_ = send(ptyData, []byte(fmt.Sprintf("agentbox: %s: %s\r\n", sp.argv[0], why)))
		sendExit(PTYExit{ExitCode: code})
		return
	}

	// Output: terminal → connection, one frame at a time (a slow reader stops this loop, and
	// the command once the terminal's buffer is full).
	outDone := make(chan struct{})
	go func() {
		defer close(outDone)
		buf := make([]byte, MaxPTYData)
		for {
			n, err := ptm.Read(buf)
			if n > 0 {
				if send(ptyData, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				return // EIO: every holder of the terminal has closed it
			}
		}
	}()
	// Input: connection → terminal. Its end (EOF, error, or a bad frame) is the host leaving.
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		buf := make([]byte, MaxPTYData+maxPTYControl)
		for {
			typ, p, err := readFrame(in, buf)
			if err != nil {
				return
			}
			switch typ {
			case ptyData:
				if _, err := ptm.Write(p); err != nil {
					return
				}
			case ptyResize:
				rows, cols := binary.BigEndian.Uint16(p[0:]), binary.BigEndian.Uint16(p[2:])
				if len(p) == 4 && checkPTYSize(int(rows), int(cols)) == nil && rows > 0 {
					_ = pty.Setsize(ptm, &pty.Winsize{Rows: rows, Cols: cols}) // TIOCSWINSZ: SIGWINCH to the foreground
				}
			default:
				return // only the agent sends exit and error frames
			}
		}
	}()

	var ws unix.WaitStatus
	select {
	case ws = <-waitCh:
		// The command ended: what it left running on the terminal is hung up too.
		s.hangup(pid, tree, nil)
	case <-gone:
		s.hangup(pid, tree, waitCh)
		return
	case <-ctx.Done(): // the agent is shutting down
		s.hangup(pid, tree, waitCh)
		return
	}
	// Every holder of the terminal is gone: the output loop reads what is left, then EIO.
	select {
	case <-outDone:
	case <-time.After(ptyDrainWait):
		s.log.Warn("guest: terminal output did not end after the command's tree was killed", "pid", pid)
		_ = ptm.Close()
		<-outDone
	}
	x := PTYExit{}
	switch {
	case ws.Exited():
		x.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		x.ExitCode = 128 + int(ws.Signal())
		x.Signal = unix.SignalName(ws.Signal())
	default:
		x.ExitCode = -1
	}
	sendExit(x)
}

// hangup ends a terminal command's tree as a terminal hang-up does: SIGHUP to its process group,
// every process of its session and (with an exec tag) every process that carries the tag, then,
// after hangupGrace, SIGKILL until nothing is left. waitCh, if not nil, is the main process's
// status, collected so it is reaped.
func (s *server) hangup(pid int, tree processTree, waitCh <-chan unix.WaitStatus) {
	signalTree(pid, tree, unix.SIGHUP)
	deadline := time.Now().Add(hangupGrace)
	for time.Now().Before(deadline) {
		if !sessionTreeAlive(pid, tree) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for deadline := time.Now().Add(killWait); ; {
		n := signalTree(pid, tree, unix.SIGKILL)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			s.log.Warn("guest: processes of a hung-up terminal still alive after repeated kills", "sid", pid, "tag", tree.tag)
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if waitCh == nil {
		return
	}
	select {
	case <-waitCh:
	case <-time.After(killWait):
		s.log.Warn("guest: hung-up terminal command was not reaped in time", "pid", pid)
	}
}

// signalTree sends sig to the process group and session pid leads and to the processes that
// carry tree's tag, and returns how many processes it signalled.
func signalTree(pid int, tree processTree, sig unix.Signal) int {
	n := 0
	if unix.Kill(-pid, sig) == nil {
		n++
	}
	self := os.Getpid()
	for _, p := range procPids() {
		if p == self {
			continue
		}
		state, start, _, ok := procStat(p)
		if !ok || state == 'Z' || state == 'X' || start < tree.since {
			continue
		}
		if sessionOf(p) == pid || (tree.tag != 0 && hasGroup(p, []byte(strconv.FormatUint(uint64(tree.tag), 10))) && descends(p, self)) {
			if unix.Kill(p, sig) == nil {
				n++
			}
		}
	}
	return n
}

// sessionTreeAlive reports whether anything of the tree is still alive (not a zombie).
func sessionTreeAlive(pid int, tree processTree) bool {
	self := os.Getpid()
	for _, p := range procPids() {
		if p == self {
			continue
		}
		state, start, _, ok := procStat(p)
		if !ok || state == 'Z' || state == 'X' || start < tree.since {
			continue
		}
		if sessionOf(p) == pid || (tree.tag != 0 && hasGroup(p, []byte(strconv.FormatUint(uint64(tree.tag), 10))) && descends(p, self)) {
			return true
		}
	}
	return false
}

func procPids() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	pids := make([]int, 0, len(ents))
	for _, e := range ents {
		if p, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

// sessionOf returns the session id of pid (field 6 of /proc/<pid>/stat), or -1.
func sessionOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return -1
	}
	sid, err := strconv.Atoi(f[3])
	if err != nil {
		return -1
	}
	return sid
}

// loginShell returns name's login shell from /etc/passwd when it is an executable file, else
// /bin/sh.
func loginShell(name string) string {
	f, err := os.Open("/etc/passwd")
	if err == nil {
		defer f.Close()
		sc := bufio.NewScanner(io.LimitReader(f, 4<<20))
		for sc.Scan() {
			p := strings.Split(sc.Text(), ":")
			if len(p) >= 7 && p[0] == name && filepath.IsAbs(p[6]) {
				if fi, err := os.Stat(p[6]); err == nil && fi.Mode().IsRegular() && unix.Access(p[6], unix.X_OK) == nil {
					return p[6]
				}
			}
		}
	}
	return "/bin/sh"
}

// userByUID returns the name /etc/passwd gives uid.
func userByUID(uid int) (string, error) {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 4<<20))
	want := strconv.Itoa(uid)
	for sc.Scan() {
		p := strings.Split(sc.Text(), ":")
		if len(p) >= 7 && p[2] == want {
			return p[0], nil
		}
	}
	return "", errors.New("no such user")
}
