package security

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// impostorProg, run as root inside, replaces the agent's socket with a listener of its own (a
// daemon, out of the command's session and exec tag) and returns once it listens. What the
// impostor answers depends on the request's text (its argv or path):
//
//	impostor-endless  exec: one JSON string that never ends (the result's stdout, or a frame's data)
//	impostor-yes      exec: well-formed output frames without end, as `yes` would stream
//	impostor-big      a 1 GiB JSON string as the reply (with its Content-Length)
//	impostor-forge-C  an error reply with code C
//
// It logs to /workspace/.impostor.log, one line per event: "req N MODE", then "gone N BYTES"
// when the host stopped reading (the connection broke) or "done N BYTES".
const impostorProg = `
RUN = "/.agentbox/run"
LOG = "/workspace/.impostor.log"
A = b"A" * 65536
lock = __import__("threading").Lock()
def log(msg):
    with lock:
        fd = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, ("%.3f %s\n" % (time.time(), msg)).encode())
        os.fsync(fd)
        os.close(fd)
def read_request(c):
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = c.recv(65536)
        if not d:
            return None
        buf += d
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    n = 0
    for l in lines[1:]:
        k, _, v = l.partition(":")
        if k.strip().lower() == "content-length":
            n = int(v)
    while len(body) < n:
        d = c.recv(65536)
        if not d:
            break
        body += d
    return lines[0] + " " + body.decode("latin-1")
def endless(head):
    yield head
    while True:
        yield A
def frames():
    f = b'{"stream":"stdout","data":"eWVzCg=="}\n' * 4096
    while True:
        yield f
def big():
    yield b'{"exit_code":0,"stdout":"'
    for _ in range(16384):
        yield A
    yield b'"}'
STATUS = {"AUTH_FAILED": "401 Unauthorized", "CAPACITY_UNAVAILABLE": "503 Service Unavailable"}
def answer(req):
    stream = '"stream":true' in req
    if "impostor-endless" in req:
        if stream:
            return "200 OK", "application/x-ndjson", endless(b'{"stream":"stdout","data":"'), None
        return "200 OK", "application/json", endless(b'{"exit_code":0,"stdout":"'), None
    if "impostor-yes" in req:
        return "200 OK", "application/x-ndjson", frames(), None
    if "impostor-big" in req:
        return "200 OK", "application/json", big(), 16384 * 65536 + 27
    if "impostor-forge-" in req:
        code = req.split("impostor-forge-", 1)[1].split('"')[0].split(" ")[0].split("&")[0]
        body = json.dumps({"code": code, "message": "your token expired: run agentbox login --token <new>", "details": {"retry_after_s": 5}}).encode()
        return STATUS.get(code, "500 Internal Server Error"), "application/json", iter([body]), len(body)
    if "/v1/health" in req:
        body = b'{"ok":true,"version":"v1","pid":1}'
        return "200 OK", "application/json", iter([body]), len(body)
    body = b'{"code":"UNSUPPORTED_OPERATION","message":"impostor"}'
    return "501 Not Implemented", "application/json", iter([body]), len(body)
def serve(c, n):
    sent = 0
    try:
        req = read_request(c)
        if req is None:
            log("closed %d before a request" % n)
            return
        mode = next((m for m in ("impostor-endless", "impostor-yes", "impostor-big", "impostor-forge") if m in req), "other")
        log("req %d %s" % (n, mode))
        status, ctype, body, length = answer(req)
        h = "HTTP/1.1 %s\r\nContent-Type: %s\r\nConnection: close\r\n" % (status, ctype)
        if length is not None:
            h += "Content-Length: %d\r\n" % length
        c.sendall(h.encode() + b"\r\n")
        for chunk in body:
            c.sendall(chunk)
            sent += len(chunk)
        log("done %d %d" % (n, sent))
    except OSError:
        log("gone %d %d" % (n, sent))
    finally:
        c.close()
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.setgroups([])  # leave the command's exec tag: the impostor outlives it
        null = os.open("/dev/null", os.O_RDWR)
        for fd in range(3):
            os.dup2(null, fd)
        tmp = RUN + "/.impostor.sock"
        if os.path.exists(tmp):
            os.unlink(tmp)
        s = socket.socket(socket.AF_UNIX)
        s.bind(tmp)
        s.listen(64)
        os.rename(tmp, RUN + "/agent.sock")
        log("listening")
        os.write(w, b"x")
        n = 0
        while True:
            c, _ = s.accept()
            n += 1
            __import__("threading").Thread(target=serve, args=(c, n), daemon=True).start()
    os._exit(0)
os.close(w)
print("READY" if os.read(r, 1) == b"x" else "FAILED", flush=True)
`

// impostorFanout is how many calls each attack makes at once: more than the idle connections
// the server may keep to the real agent (8), so that at least some dial the impostor.
const impostorFanout = 12

// impostor is one impostor attack's view: the sandbox whose socket is replaced, a bystander
// sandbox on the same server, and the server's memory.
type impostor struct {
	a         *arena
	bystander string
	baseRSS   int64 // KiB
	peakRSS   atomic.Int64
	stop      chan struct{}
	wg        sync.WaitGroup
	// slowest and failed are the bystander's exec round trips while the attack runs.
	slowest atomic.Int64
	failed  atomic.Value
}

// startImpostor makes a bystander sandbox, starts sampling the server's RSS and the bystander's
// exec round trips, and replaces the arena sandbox's agent socket with the impostor.
func startImpostor(a *arena) *impostor {
	a.t.Helper()
	im := &impostor{a: a, stop: make(chan struct{})}
	im.bystander = a.newSandbox(wire.CreateRequest{}).ID
	a.alive(im.bystander, 20*time.Second)
	im.baseRSS = kib(statusField(a.s.pid(), "VmRSS"))
	im.peakRSS.Store(im.baseRSS)
	im.wg.Add(2)
	go func() {
		defer im.wg.Done()
		for {
			select {
			case <-im.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if v := kib(statusField(a.s.pid(), "VmRSS")); v > im.peakRSS.Load() {
				im.peakRSS.Store(v)
			}
		}
	}()
	go func() {
		defer im.wg.Done()
		for {
			select {
			case <-im.stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			start := time.Now()
			res, err := a.tryExecIn(im.bystander, wire.ExecRequest{Command: []string{"echo", "alive"}, TimeoutSeconds: 10})
			if d := time.Since(start).Milliseconds(); d > im.slowest.Load() {
				im.slowest.Store(d)
			}
			if err != nil || res.Stdout != "alive\n" {
				im.failed.CompareAndSwap(nil, "bystander exec: "+strings.TrimSpace(res.Stdout)+" "+errString(err))
			}
		}
	}()
	res := a.pyAs("root", impostorProg, "")
	if strings.TrimSpace(res.Stdout) != "READY" {
		a.t.Fatalf("the impostor did not take the socket: %+v", res)
	}
	return im
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// finish stops the sampling and checks what must hold throughout: the server's memory stayed
// within bound, the bystander answered every exec promptly.
func (im *impostor) finish(boundMiB int64) {
	a := im.a
	a.t.Helper()
	close(im.stop)
	im.wg.Wait()
	grew := (im.peakRSS.Load() - im.baseRSS) >> 10
	a.t.Logf("server RSS %d MiB before, peak %d MiB (+%d MiB); bystander's slowest exec %d ms",
		im.baseRSS>>10, im.peakRSS.Load()>>10, grew, im.slowest.Load())
	if grew > boundMiB {
		a.t.Errorf("HOLE: the server's RSS grew by %d MiB under the impostor (bound %d MiB)", grew, boundMiB)
	}
	if f := im.failed.Load(); f != nil {
		a.t.Errorf("another sandbox stopped answering during the attack: %v", f)
	}
	if im.slowest.Load() > 15000 {
		a.t.Errorf("another sandbox's exec took %d ms during the attack", im.slowest.Load())
	}
	a.alive(im.bystander, 20*time.Second)
}

// log returns the impostor's log lines (from the host's side of the sandbox's disk).
func (im *impostor) log() []string {
	b, _ := os.ReadFile(filepath.Join(im.a.sandboxDir(im.a.id), "disk", "workspace", ".impostor.log"))
	return lines(string(b))
}

// served counts the requests the impostor got in mode.
func (im *impostor) served(mode string) int {
	n := 0
	for _, l := range im.log() {
		if f := strings.Fields(l); len(f) == 4 && f[1] == "req" && f[3] == mode {
			n++
		}
	}
	return n
}

// fanout runs call impostorFanout times at once and returns the errors. At least one call must
// have failed: a call that succeeds went to the real agent, and an attack that reached only it
// tested nothing.
func (im *impostor) fanout(what string, call func() error) []error {
	im.a.t.Helper()
	errs := make([]error, impostorFanout)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = call()
		}()
	}
	wg.Wait()
	if !slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
		im.a.t.Errorf("%s: all %d calls were answered by the real agent: the attack reached nothing", what, len(errs))
	}
	return errs
}

// wantAgentRefused checks the error of a call the impostor may have answered: a typed error that
// is neither the forged code nor untyped, and (when INTERNAL) attributed to the sandbox's agent.
// A dial the server refused because its peer is not the agent is as good. The real agent
// (through a connection the server kept from before) answers it with a result or its own error.
func (im *impostor) wantAgentRefused(what string, err error, forged ...errcode.Code) {
	a := im.a
	a.t.Helper()
	if err == nil {
		return // the real agent, through an idle connection kept from before the attack
	}
	c := code(err)
	for _, f := range forged {
		if c == f {
			a.t.Errorf("HOLE: %s: the forged code %s reached the caller: %v", what, f, err)
		}
	}
	if c == "?" {
		a.t.Errorf("%s: untyped error %v", what, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		a.t.Errorf("%s: the call ran to its deadline: %v", what, err)
	}
}

func impostorAttacks() []attack {
	const does = "a command run as root replaces the agent's socket with its own listener (a daemon out of the command's session and exec tag), then the host calls it: "
	const gv = "the same: the impostor's socket is created on the host through --host-uds, like the agent's; a peer-credential check cannot tell the sentry's processes apart, so the bounds are what protect the server"
	return []attack{
		{
			name:   "impostor-endless-reply",
			does:   does + "exec (non-streamed, and streamed) gets one JSON string that never ends, 12 calls at once",
			want:   "each call fails within 60 s with a typed error (oversized reply, or refused as not the agent), none runs to its deadline; the server's RSS grows by less than 512 MiB; another sandbox on the server answers exec throughout",
			gvisor: gv,
			serial: true,
			run: func(a *arena) {
				im := startImpostor(a)
				for _, stream := range []bool{false, true} {
					start := time.Now()
					errs := im.fanout("endless exec", func() error {
						ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
						defer cancel()
						var onOutput func(string, []byte)
						if stream {
							onOutput = func(string, []byte) {}
						}
						_, err := a.s.c.Exec(ctx, a.id, wire.ExecRequest{Command: []string{"echo", "impostor-endless"}}, onOutput)
						return err
					})
					for _, err := range errs {
						im.wantAgentRefused("endless exec", err)
					}
					a.t.Logf("stream=%v: %d calls in %s: %v", stream, len(errs), time.Since(start).Round(time.Millisecond), errs[0])
				}
				if im.served("impostor-endless") == 0 {
					a.t.Logf("the impostor never got a request: the server refused to dial it (%d log lines)", len(im.log()))
				}
				im.finish(512)
			},
		},
		{
			name:   "impostor-1gib-json",
			does:   does + "exec, stat and list each get a 1 GiB JSON string as the reply, 12 calls at once",
			want:   "each call fails with a typed error (oversized reply, or refused as not the agent) while the impostor has sent a small part of the 1 GiB; the server's RSS grows by less than 512 MiB; another sandbox answers exec throughout",
			gvisor: gv,
			serial: true,
			run: func(a *arena) {
				im := startImpostor(a)
				ctx := func() (context.Context, context.CancelFunc) {
					return context.WithTimeout(context.Background(), 60*time.Second)
				}
				for what, call := range map[string]func() error{
					"exec": func() error {
						c, cancel := ctx()
						defer cancel()
						_, err := a.s.c.Exec(c, a.id, wire.ExecRequest{Command: []string{"echo", "impostor-big"}}, nil)
						return err
					},
					"stat": func() error {
						c, cancel := ctx()
						defer cancel()
						_, err := a.s.c.Stat(c, a.id, "/impostor-big")
						return err
					},
					"list": func() error {
						c, cancel := ctx()
						defer cancel()
						_, err := a.s.c.ListDir(c, a.id, "/impostor-big")
						return err
					},
				} {
					for _, err := range im.fanout(what, call) {
						im.wantAgentRefused(what+" of 1 GiB", err)
					}
				}
				for _, l := range im.log() {
					if f := strings.Fields(l); len(f) == 4 && f[1] == "done" {
						a.t.Errorf("HOLE: the server read a whole 1 GiB reply: %s", l)
					}
				}
				im.finish(512)
			},
		},
		{
			name:   "impostor-forged-codes",
			does:   does + "exec and stat get error replies with the server's own codes AUTH_FAILED and CAPACITY_UNAVAILABLE and a message telling the user to log in again",
			want:   "no caller (REST client, CLI) sees AUTH_FAILED, nor CAPACITY_UNAVAILABLE from a files call; a code the agent's endpoint may return (CAPACITY_UNAVAILABLE from exec: the sandbox is out of processes) arrives marked details.origin=sandbox_agent; the others are INTERNAL naming the unexpected code",
			gvisor: gv,
			serial: true,
			run: func(a *arena) {
				im := startImpostor(a)
				// check: the forged code never arrives as the server's; where the endpoint may return it
				// (CAPACITY_UNAVAILABLE from exec: the sandbox is out of processes), it arrives marked
				// as the sandbox agent's.
				check := func(what string, err error, forged errcode.Code, mayPass bool) {
					if !mayPass {
						im.wantAgentRefused(what, err, forged)
						return
					}
					im.wantAgentRefused(what, err)
					if e, ok := errcode.As(err); ok && e.Code == forged && e.Details["origin"] != "sandbox_agent" {
						a.t.Errorf("HOLE: %s: %s passed on without marking the sandbox's agent as its origin: %v", what, forged, e.Details)
					}
				}
				for _, forged := range []errcode.Code{errcode.AuthFailed, errcode.CapacityUnavailable} {
					mark := "impostor-forge-" + string(forged)
					for _, err := range im.fanout("exec "+mark, func() error {
						ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
						defer cancel()
						_, err := a.s.c.Exec(ctx, a.id, wire.ExecRequest{Command: []string{"echo", mark}}, nil)
						return err
					}) {
						check("exec "+mark, err, forged, forged == errcode.CapacityUnavailable)
					}
					for _, err := range im.fanout("stat "+mark, func() error {
						ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
						defer cancel()
						_, err := a.s.c.Stat(ctx, a.id, "/"+mark)
						return err
					}) {
						check("stat "+mark, err, forged, false)
					}
				}
				// The CLI, as a user would run it: what it prints of an error goes to stderr (the real
				// agent, through a kept connection, would echo the argument on stdout). The command
				// takes a second on the real agent, so that the 12 CLI processes, which start one by
				// one, hold more connections at once than the server keeps idle and some calls dial
				// anew (and meet the impostor, or the peer check).
				im.fanout("the CLI's exec", func() error {
					_, stderr, exit := a.s.cli(context.Background(), "exec", a.id, "--", "sh", "-c", "sleep 1; echo impostor-forge-AUTH_FAILED")
					if strings.Contains(stderr, "AUTH_FAILED") && !strings.Contains(stderr, "unexpected error code") {
						a.t.Errorf("HOLE: the CLI shows the forged AUTH_FAILED: %s", stderr)
					}
					if exit != 0 {
						return errors.New(stderr)
					}
					return nil
				})
				im.finish(512)
			},
		},
		{
			name:   "impostor-caller-goes",
			does:   does + "a streamed exec gets well-formed output frames without end (as `yes` would send); the REST client reads for 2 s, then hangs up",
			want:   "the output reaches the client while it reads; after it hangs up the server stops reading from the impostor within 5 s (the impostor's write fails), and the server's RSS grows by less than 200 MiB",
			gvisor: gv,
			serial: true,
			run: func(a *arena) {
				im := startImpostor(a)
				var got atomic.Int64
				var cancelled time.Time
				for _, err := range im.fanout("endless output", func() error {
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					time.AfterFunc(2*time.Second, cancel)
					_, err := a.s.c.Exec(ctx, a.id, wire.ExecRequest{Command: []string{"echo", "impostor-yes"}}, func(_ string, d []byte) { got.Add(int64(len(d))) })
					if err != nil && ctx.Err() != nil {
						return ctx.Err() // the caller went: what its own client says of that is not the server's
					}
					return err
				}) {
					if err != nil && !errors.Is(err, context.Canceled) {
						im.wantAgentRefused("endless output", err)
					}
				}
				cancelled = time.Now()
				served := im.served("impostor-yes")
				a.t.Logf("%d KiB of output delivered; the impostor served %d of the calls", got.Load()>>10, served)
				deadline := time.Now().Add(5 * time.Second)
				for {
					gone := 0
					for _, l := range im.log() {
						if f := strings.Fields(l); len(f) == 4 && f[1] == "gone" {
							gone++
						}
					}
					if gone >= served {
						break
					}
					if time.Now().After(deadline) {
						a.t.Errorf("HOLE: the server was still reading %d of %d endless streams 5 s after the callers went:\n%s",
							served-gone, served, strings.Join(im.log(), "\n"))
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if served > 0 && got.Load() == 0 {
					a.t.Error("no output of the impostor's well-formed frames reached the callers")
				}
				a.t.Logf("the impostor saw the server go %s after the callers did", time.Since(cancelled).Round(time.Millisecond))
				im.finish(200)
			},
		},
	}
}
