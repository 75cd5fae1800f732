package security

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/wire"
)

// countingListener accepts and counts connections until closed.
type countingListener struct {
	ln net.Listener
	n  atomic.Int64
}

func listenCounting(a *arena, network, addr string) *countingListener {
	ln, err := net.Listen(network, addr)
	if err != nil {
		a.t.Fatalf("listen %s %s: %v", network, addr, err)
	}
	l := &countingListener{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.n.Add(1)
			c.Close()
		}
	}()
	a.t.Cleanup(func() { ln.Close() })
	return l
}

// control connects once from the host, proving the listener counts.
func (l *countingListener) control(a *arena) {
	a.t.Helper()
	c, err := net.Dial(l.ln.Addr().Network(), l.ln.Addr().String())
	if err != nil {
		a.t.Fatalf("control connection to %s: %v", l.ln.Addr(), err)
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for l.n.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if l.n.Load() != 1 {
		a.t.Fatalf("listener %s counted %d control connections", l.ln.Addr(), l.n.Load())
	}
}

// connectProg tries every target given as JSON in argv[2] ({"tcp": [[host, port]], "udp": [...],
// "unix": [path]}; an abstract unix name starts with "@") and prints CONNECTED or SENT for each
// that worked.
const connectProg = `
t = json.loads(sys.argv[2])
for host, port in t.get("tcp", []):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((host, port))
        out("CONNECTED tcp", host, port)
    except OSError as e:
        out("tcp", host, port, errname(e))
    s.close()
for host, port in t.get("udp", []):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b"absec", (host, port))
        out("sent udp", host, port)
    except OSError as e:
        out("udp", host, port, errname(e))
    s.close()
for path in t.get("unix", []):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect("\0" + path[1:] if path.startswith("@") else path)
        out("CONNECTED unix", path)
    except OSError as e:
        out("unix", path, errname(e))
    s.close()
`

func targetsJSON(tcp, udp [][2]any, unix []string) string {
	if tcp == nil {
		tcp = [][2]any{}
	}
	if udp == nil {
		udp = [][2]any{}
	}
	if unix == nil {
		unix = []string{}
	}
	b, _ := json.Marshal(map[string]any{"tcp": tcp, "udp": udp, "unix": unix})
	return string(b)
}

func portOf(addr net.Addr) int { return addr.(*net.TCPAddr).Port }

// hostIPs are the host's non-loopback IPv4 addresses.
func hostIPs() []string {
	var out []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}

func netAttacks() []attack {
	return []attack{
		{
			name: "net-host-loopback",
			does: "as the agent user and as root, connects to TCP listeners the test runs on the host's 127.0.0.1 and on all interfaces (via 127.0.0.1 and every host address), to the agentbox server's own port, to the cloud metadata address and common gateway addresses, and sends UDP datagrams to a host UDP socket",
			want: "every connection fails (the sandbox has only its own loopback); the host listeners accept nothing but the test's own control connection and the UDP socket receives nothing",
			run: func(a *arena) {
				lo := listenCounting(a, "tcp4", "127.0.0.1:0")
				all := listenCounting(a, "tcp4", "0.0.0.0:0")
				lo.control(a)
				all.control(a)
				udp, err := net.ListenPacket("udp4", "0.0.0.0:0")
				if err != nil {
					a.t.Fatal(err)
				}
				defer udp.Close()
				var datagrams atomic.Int64
				go func() {
					buf := make([]byte, 64)
					for {
						if _, _, err := udp.ReadFrom(buf); err != nil {
							return
						}
						datagrams.Add(1)
					}
				}()
				uport := udp.LocalAddr().(*net.UDPAddr).Port
				_, sport, _ := net.SplitHostPort(strings.TrimPrefix(a.s.url, "http://"))
				serverPort, _ := strconv.Atoi(sport)
				tcp := [][2]any{{"127.0.0.1", portOf(lo.ln.Addr())}, {"127.0.0.1", portOf(all.ln.Addr())}, {"127.0.0.1", serverPort},
					{"169.254.169.254", 80}, {"10.0.2.2", portOf(all.ln.Addr())}, {"172.17.0.1", portOf(all.ln.Addr())}}
				udpT := [][2]any{{"127.0.0.1", uport}}
				for _, ip := range hostIPs() {
					tcp = append(tcp, [2]any{ip, portOf(all.ln.Addr())}, [2]any{ip, serverPort})
					udpT = append(udpT, [2]any{ip, uport})
				}
				for _, u := range users {
					res := a.pyAs(u, connectProg, "", targetsJSON(tcp, udpT, nil))
					if strings.Contains(res.Stdout, "CONNECTED") || res.ExitCode != 0 {
						a.t.Errorf("as %s:\n%s%s", userName(u), res.Stdout, res.Stderr)
					}
				}
				time.Sleep(200 * time.Millisecond)
				if lo.n.Load() != 1 || all.n.Load() != 1 || datagrams.Load() != 0 {
					a.t.Errorf("HOLE: host listeners saw loopback %d, all-interfaces %d connections (1 is the test's own), UDP %d datagrams",
						lo.n.Load(), all.n.Load(), datagrams.Load())
				}
			},
		},
		{
			name:   "net-host-unix-sockets",
			does:   "as the agent user and as root, connects to an abstract unix socket the test listens on in the host's network namespace, and to a unix socket file the test listens on in a host directory, by its path",
			want:   "both connections fail; the host listeners accept nothing but the test's own control connection",
			gvisor: "gVisor runs with --host-uds=all (the agent's socket needs it), so a host socket file would be reachable if a host path to one were visible inside; none is (only /usr and the sandbox's own dirs are bound), which this checks",
			run: func(a *arena) {
				abstract := listenCounting(a, "unix", "@absec-"+randHex(6))
				path := listenCounting(a, "unix", filepath.Join(a.s.secretDir, "absec-"+randHex(4)+".sock"))
				abstract.control(a)
				path.control(a)
				targets := targetsJSON(nil, nil, []string{abstract.ln.Addr().String(), path.ln.Addr().String()})
				for _, u := range users {
					res := a.pyAs(u, connectProg, "", targets)
					if strings.Contains(res.Stdout, "CONNECTED") || res.ExitCode != 0 {
						a.t.Errorf("as %s:\n%s%s", userName(u), res.Stdout, res.Stderr)
					}
				}
				time.Sleep(100 * time.Millisecond)
				if abstract.n.Load() != 1 || path.n.Load() != 1 {
					a.t.Errorf("HOLE: host unix listeners saw abstract %d, path %d connections (1 is the test's own)", abstract.n.Load(), path.n.Load())
				}
			},
		},
		{
			name: "net-other-sandbox",
			does: "sandbox B (same runtime) listens on 127.0.0.1:7777, 0.0.0.0:7778, UDP 127.0.0.1:7779 and the abstract socket @absec-b; sandbox A, as the agent user and as root, connects and sends to all of them",
			want: "A reaches nothing; B's listeners accept exactly the two control connections B makes to itself (so they were live)",
			run: func(a *arena) {
				b := a.newSandbox(wire.CreateRequest{})
				var wg sync.WaitGroup
				var lres wire.ExecResult
				var lerr error
				wg.Add(1)
				go func() {
					defer wg.Done()
					lres, lerr = a.tryExecIn(b.ID, wire.ExecRequest{Command: []string{"python3", "-c", prelude + listenProg, "-"}, TimeoutSeconds: 60})
				}()
				deadline := time.Now().Add(30 * time.Second)
				for {
					if _, err := a.s.c.Stat(context.Background(), b.ID, "/workspace/ready"); err == nil {
						break
					}
					if time.Now().After(deadline) {
						a.t.Fatalf("B's listener did not start")
					}
					time.Sleep(20 * time.Millisecond)
				}
				self := targetsJSON([][2]any{{"127.0.0.1", 7777}}, nil, []string{"@absec-b"})
				if r := a.execIn(b.ID, wire.ExecRequest{Command: []string{"python3", "-c", prelude + connectProg, "-", self}}); strings.Count(r.Stdout, "CONNECTED") != 2 {
					a.t.Errorf("B's control connections to itself: %s%s", r.Stdout, r.Stderr)
				}
				targets := targetsJSON([][2]any{{"127.0.0.1", 7777}, {"127.0.0.1", 7778}}, [][2]any{{"127.0.0.1", 7779}}, []string{"@absec-b"})
				for _, u := range users {
					res := a.pyAs(u, connectProg, "", targets)
					if strings.Contains(res.Stdout, "CONNECTED") || res.ExitCode != 0 {
						a.t.Errorf("HOLE? as %s in A:\n%s%s", userName(u), res.Stdout, res.Stderr)
					}
				}
				if err := a.writeFile(b.ID, "/workspace/stop", nil); err != nil {
					a.t.Fatal(err)
				}
				wg.Wait()
				if lerr != nil {
					a.t.Fatalf("B's listener: %v", lerr)
				}
				if !strings.Contains(lres.Stdout, "ACCEPTED 2 UDP 0") {
					a.t.Errorf("HOLE: B's listeners saw more than its own 2 connections: %s%s", lres.Stdout, lres.Stderr)
				}
			},
		},
	}
}

// listenProg listens on TCP 127.0.0.1:7777 and 0.0.0.0:7778, UDP 127.0.0.1:7779 and the abstract
// unix socket @absec-b until /workspace/stop appears, then prints how many it accepted.
const listenProg = `
import select
socks = []
poller = select.poll()
for fam, addr in [(socket.AF_INET, ("127.0.0.1", 7777)), (socket.AF_INET, ("0.0.0.0", 7778)), (socket.AF_UNIX, "\0absec-b")]:
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.bind(addr)
    s.listen(16)
    socks.append(s)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 7779))
byfd = {s.fileno(): s for s in socks + [u]}
for fd in byfd:
    poller.register(fd, select.POLLIN)
open("/workspace/ready", "w").close()
accepted = udp = 0
deadline = time.time() + 50
while time.time() < deadline and not os.path.exists("/workspace/stop"):
    for fd, _ in poller.poll(100):  # poll, not select: gVisor's seccomp refuses select(2)
        s = byfd[fd]
        if s is u:
            u.recv(64); udp += 1
        else:
            c, _ = s.accept(); c.close(); accepted += 1
out("ACCEPTED", accepted, "UDP", udp)
`
