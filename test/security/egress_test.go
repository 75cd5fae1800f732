package security

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv/netlab"
	"github.com/agentbox/agentbox/internal/wire"
)

// egressFlags are the server's flags for the suite's lab (nil when the binary has no egress:
// the network not built in), set by start.
func egressFlags(bin string, lab *netlab.Lab) []string {
	out, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	if !strings.Contains(string(out), "-egress-allow-cidr") {
		return nil
	}
	return []string{"--allow-private-network", "--egress-allow-cidr", lab.CIDR(), "--egress-dns", lab.DNSAddr(), "--egress-upstream-ca", lab.CAFile()}
}

// egressReq is an egress sandbox allowed good.lab and tls.lab (ports 80 and 443).
func egressReq() wire.CreateRequest {
	return wire.CreateRequest{Network: &wire.Network{Policy: &wire.Policy{Allow: []string{"good.lab", "tls.lab"}, Deny: []string{}}}}
}

// needEgress fails the attack when the server runs without the lab's egress flags.
func (a *arena) needEgress() *netlab.Lab {
	a.t.Helper()
	if !a.s.egress {
		a.t.Fatal("the server has no --egress-allow-cidr: the egress network is not built into this binary")
	}
	return a.s.lab
}

// dnsProg sends DNS questions (argv[2]: JSON [[name, qtype, "udp"|"tcp"], ...]) to argv[3]
// port 53 and prints one line each: "<name> <qtype> <net> RCODE <n> ANSWERS <n>" or
// "<name> <qtype> <net> NOANSWER <err>".
const dnsProg = `
import struct
def query(name, qtype):
    q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
    for p in name.split("."):
        q += bytes([len(p)]) + p.encode()
    return q + b"\x00" + struct.pack(">HH", qtype, 1)
server = sys.argv[3]
for name, qtype, net in json.loads(sys.argv[2]):
    try:
        if net == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(2)
            s.sendto(query(name, qtype), (server, 53))
            r, _ = s.recvfrom(4096)
        else:
            s = socket.create_connection((server, 53), timeout=3)
            m = query(name, qtype)
            s.sendall(struct.pack(">H", len(m)) + m)
            n = struct.unpack(">H", s.recv(2))[0]
            r = b""
            while len(r) < n:
                c = s.recv(n - len(r))
                if not c: break
                r += c
        out(name, qtype, net, "RCODE", r[3] & 15, "ANSWERS", struct.unpack(">H", r[6:8])[0])
    except Exception as e:
        out(name, qtype, net, "NOANSWER", errname(e))
`

// rawProg tries raw and packet sockets, an ICMP echo over a datagram (ping) socket, and an
// ICMP echo over a raw socket, to argv[2]; prints what worked as "OPENED ..." or "REPLY ...".
const rawProg = `
import select, struct
target = sys.argv[2]
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
echo = struct.pack("!BBHHH", 8, 0, 0, 0x4242, 1) + b"absec"
echo = echo[:2] + struct.pack("!H", csum(echo)) + echo[4:]
for fam, typ, proto, what in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "raw-icmp"),
                              (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP, "raw-tcp"),
                              (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP, "raw-udp"),
                              (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6, "raw-icmp6"),
                              (socket.AF_PACKET, socket.SOCK_RAW, 0x0300, "packet"),
                              (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP, "ping")]:
    try:
        s = socket.socket(fam, typ, proto)
    except OSError as e:
        out(what, errname(e))
        continue
    out("OPENED", what)
    if what in ("raw-icmp", "ping"):
        try:
            s.sendto(echo, (target, 0))
            s.settimeout(2)
            r = s.recv(1024)
            out("REPLY", what, len(r))
        except OSError as e:
            out(what, "send/recv", errname(e))
    s.close()
`

func egressAttacks() []attack {
	return []attack{
		{
			name:   "egress-raw-icmp",
			does:   "in a sandbox allowed good.lab, as the agent user and as root, opens raw IPv4 sockets (ICMP, TCP, UDP), a raw ICMPv6 socket, an AF_PACKET socket and an ICMP datagram (ping) socket, and sends echo requests to the lab's address and to the host's own lab address",
			want:   "no raw or packet socket opens (no CAP_NET_RAW); no echo request gets a reply (a ping socket, where the sandbox's kernel allows one, reaches only the sandbox's own loopback)",
			gvisor: "gVisor's netstack (--network=none) has only loopback: the same",
			create: egressReq(),
			run: func(a *arena) {
				lab := a.needEgress()
				for _, target := range []string{lab.HostOf("good.lab").String(), lab.HostAddr().String()} {
					for _, u := range users {
						r := a.pyAs(u, rawProg, "", target)
						for _, l := range lines(r.Stdout) {
							if strings.HasPrefix(l, "REPLY") || strings.HasPrefix(l, "OPENED") && !strings.HasSuffix(l, "ping") {
								a.t.Errorf("HOLE as %s to %s: %s\n%s", userName(u), target, l, r.Stdout)
							}
						}
						if r.ExitCode != 0 {
							a.t.Errorf("as %s: %s", userName(u), r.Stderr)
						}
					}
				}
			},
		},
		{
			name:   "egress-udp",
			does:   "in a sandbox allowed good.lab, as the agent user and as root, sends UDP DNS questions for a unique name straight to the lab's DNS server, to the host's lab address, to 8.8.8.8 and to 169.254.169.254, and UDP datagrams to the lab's trap port",
			want:   "no answer comes back, and the lab's DNS server never sees the unique name: UDP leaves the sandbox only as DNS questions to its own resolver",
			create: egressReq(),
			run: func(a *arena) {
				lab := a.needEgress()
				unique := "udp-" + randHex(6) + ".lab"
				var qs []string
				for _, q := range []string{unique} {
					qs = append(qs, fmt.Sprintf(`[%q, 1, "udp"]`, q))
				}
				for _, server := range []string{lab.HostOf("good.lab").String(), lab.HostAddr().String(), "8.8.8.8", "169.254.169.254"} {
					for _, u := range users {
						r := a.pyAs(u, dnsProg, "", "["+strings.Join(qs, ",")+"]", server)
						if strings.Contains(r.Stdout, "RCODE") || r.ExitCode != 0 {
							a.t.Errorf("HOLE? as %s, UDP DNS to %s answered:\n%s%s", userName(u), server, r.Stdout, r.Stderr)
						}
					}
				}
				for _, q := range lab.Queries() {
					if q.Name == unique {
						a.t.Errorf("HOLE: the lab's DNS server got %+v straight from the sandbox", q)
					}
				}
			},
		},
		{
			name:   "egress-ipv6",
			does:   "in a sandbox allowed good.lab, connects over IPv6 to the host's IPv6 addresses, to 2001:db8::1 and to the lab's address as an IPv4-mapped IPv6 address on the lab's trap port, and asks its resolver for good.lab's AAAA records",
			want:   "no IPv6 connection is made (no route beyond ::1; the mapped address reaches no listener), the resolver answers AAAA with no records, and the host's trap listeners see nothing",
			create: egressReq(),
			run: func(a *arena) {
				lab := a.needEgress()
				before := lab.TrapHits()
				tcp := [][2]any{{"2001:db8::1", 80}, {"::ffff:" + lab.HostOf("good.lab").String(), lab.TrapPort()}, {"::ffff:" + lab.HostAddr().String(), lab.TrapPort()}}
				addrs, _ := net.InterfaceAddrs()
				for _, ad := range addrs {
					if ipn, ok := ad.(*net.IPNet); ok && ipn.IP.To4() == nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
						tcp = append(tcp, [2]any{ipn.IP.String(), lab.TrapPort()}, [2]any{ipn.IP.String(), 80})
					}
				}
				for _, u := range users {
					if r := a.pyAs(u, connectProg, "", targetsJSON(tcp, nil, nil)); strings.Contains(r.Stdout, "CONNECTED") || r.ExitCode != 0 {
						a.t.Errorf("HOLE? as %s:\n%s%s", userName(u), r.Stdout, r.Stderr)
					}
				}
				r := a.pyAs("", dnsProg, "", `[["good.lab", 28, "udp"], ["good.lab", 1, "udp"]]`, "127.0.0.1")
				if !strings.Contains(r.Stdout, "good.lab 28 udp RCODE 0 ANSWERS 0") || !strings.Contains(r.Stdout, "good.lab 1 udp RCODE 0 ANSWERS 1") {
					a.t.Errorf("the resolver's AAAA and A answers for good.lab: %s%s", r.Stdout, r.Stderr)
				}
				if lab.TrapHits() != before {
					a.t.Errorf("HOLE: the host's trap listeners saw %d connections", lab.TrapHits()-before)
				}
			},
		},
		{
			name:   "egress-dns-tunnel",
			does:   "in a sandbox allowed good.lab, asks its resolver (UDP and TCP) TXT, MX, ANY and NULL questions for good.lab, and A questions for 63-character labels of data under good.lab and under a name no rule allows, as a DNS tunnel would",
			want:   "every one is REFUSED (rcode 5) without an answer, none reaches the lab's DNS server, and the connection records list them as refused DNS queries",
			create: wire.CreateRequest{Network: &wire.Network{Policy: &wire.Policy{Allow: []string{"good.lab"}, Deny: []string{}}}},
			run: func(a *arena) {
				lab := a.needEgress()
				data := randHex(31) + "a" // 63 characters
				names := []string{data + ".good.lab", data + ".tunnel.lab", data + "." + data + ".lab"}
				var qs []string
				for _, nt := range []string{"udp", "tcp"} {
					for _, typ := range []int{16, 15, 255, 10} { // TXT, MX, ANY, NULL
						qs = append(qs, fmt.Sprintf(`["good.lab", %d, %q]`, typ, nt))
					}
					for _, n := range names {
						qs = append(qs, fmt.Sprintf(`[%q, 1, %q]`, n, nt))
					}
				}
				r := a.pyAs("", dnsProg, "", "["+strings.Join(qs, ",")+"]", "127.0.0.1")
				got := lines(r.Stdout)
				if len(got) != len(qs) {
					a.t.Fatalf("%d answers to %d questions:\n%s%s", len(got), len(qs), r.Stdout, r.Stderr)
				}
				for _, l := range got {
					if !strings.HasSuffix(l, "RCODE 5 ANSWERS 0") {
						a.t.Errorf("HOLE? not refused: %s", l)
					}
				}
				for _, q := range lab.Queries() {
					if q.Type != "A" && q.Type != "AAAA" || strings.Contains(q.Name, data) {
						a.t.Errorf("HOLE: the lab's DNS server was asked %+v", q)
					}
				}
				deadline := time.Now().Add(10 * time.Second)
				for {
					var refused int
					for _, c := range a.connections() {
						if c.Kind == egress.KindDNS && c.Decision == egress.Denied && (strings.Contains(c.Host, data) || c.Host == "good.lab") {
							refused++
						}
					}
					if refused >= len(qs) {
						break
					}
					if time.Now().After(deadline) {
						a.t.Errorf("%d refused DNS queries recorded, want %d", refused, len(qs))
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
			},
		},
		{
			name:   "egress-host-side",
			does:   "in a sandbox allowed good.lab, as the agent user and as root, looks for the egress proxy's host side: connects to the host's lab address and 127.0.0.1 on the lab's trap port, on the server's port and on 3128, lists the unix sockets it can see and connects to each (the agent's session socket among them), and, as the agent user, POSTs an agentbox-net/1 upgrade to the agent's socket",
			want:   "no host listener sees a connection (nothing of the host is reachable: the host dials the agent, not the reverse); the agent user cannot open the agent's socket (its directory is root's)",
			create: egressReq(),
			run: func(a *arena) {
				lab := a.needEgress()
				before := lab.TrapHits()
				_, sport, _ := net.SplitHostPort(strings.TrimPrefix(a.s.url, "http://"))
				serverPort, _ := strconv.Atoi(sport)
				var tcp [][2]any
				for _, h := range []string{lab.HostAddr().String(), "127.0.0.1"} {
					tcp = append(tcp, [2]any{h, lab.TrapPort()}, [2]any{h, serverPort})
				}
				tcp = append(tcp, [2]any{lab.HostAddr().String(), 3128})
				for _, u := range users {
					r := a.pyAs(u, connectProg, "", targetsJSON(tcp, nil, nil))
					for _, l := range lines(r.Stdout) {
						// The sandbox's own 127.0.0.1:3128 is its agent's proxy; anything else
						// connecting is a hole (the server's port on the sandbox's loopback is
						// no server).
						if strings.HasPrefix(l, "CONNECTED") {
							a.t.Errorf("HOLE? as %s: %s", userName(u), l)
						}
					}
				}
				if lab.TrapHits() != before {
					a.t.Errorf("HOLE: the host's trap listeners saw %d connections", lab.TrapHits()-before)
				}
				// Unix sockets: the agent user reaches none of the agent's.
				r := a.pyAs("", `
paths = set()
for l in open("/proc/net/unix").read().splitlines()[1:]:
    f = l.split()
    if len(f) >= 8:
        paths.add(f[7])
paths.add("/.agentbox/run/agent.sock")
for p in sorted(paths):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect("\0" + p[1:] if p.startswith("@") else p)
        s.sendall(b"POST /v1/net/session HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: agentbox-net/1\r\nContent-Length: 0\r\n\r\n")
        out("CONNECTED", p, s.recv(64))
    except OSError as e:
        out("unix", p, errname(e))
`, "")
				for _, l := range lines(r.Stdout) {
					if strings.HasPrefix(l, "CONNECTED") && strings.Contains(l, "agent") {
						a.t.Errorf("HOLE: the agent user reached the agent's socket: %s", l)
					}
				}
				if !strings.Contains(r.Stdout, "/.agentbox/run/agent.sock") {
					a.t.Errorf("the agent's socket was not tried:\n%s%s", r.Stdout, r.Stderr)
				}
			},
		},
		{
			name:   "egress-preview-other-token",
			does:   "sandboxes A and B each expose port 8000 (private) with a server on it; the attacker holds A's access token (and the cookie A's preview URL set) and requests B's preview URL with them, and A's URL with B's sandbox id swapped in",
			want:   "B's preview answers only with B's token or the server's bearer token: A's token and cookie get no page of B's",
			create: wire.CreateRequest{},
			run: func(a *arena) {
				b := a.newSandbox(wire.CreateRequest{})
				tokens := map[string]string{}
				urls := map[string]string{}
				for _, id := range []string{a.id, b.ID} {
					page := "absec-preview-" + id
					a.execIn(id, wire.ExecRequest{Command: []string{"sh", "-c", "mkdir -p /tmp/www && echo " + page + " > /tmp/www/index.html"}})
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					_, err := a.s.c.StartJob(ctx, id, wire.ExecRequest{Command: []string{"python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/tmp/www"}})
					cancel()
					if err != nil {
						a.t.Fatalf("start the server in %s: %v", id, err)
					}
					st, body, err := a.s.rest(context.Background(), "POST", "/v1/sandboxes/"+id+"/expose", nil, strings.NewReader(`{"port": 8000, "public": false}`))
					if err != nil || st/100 != 2 {
						a.t.Fatalf("expose %s: %d %s %v", id, st, body, err)
					}
					var exp struct {
						URL         string `json:"url"`
						AccessToken string `json:"access_token"`
					}
					if err := json.Unmarshal(body, &exp); err != nil || exp.AccessToken == "" {
						a.t.Fatalf("expose reply %s", body)
					}
					tokens[id], urls[id] = exp.AccessToken, exp.URL
				}
				get := func(u string, hdr map[string]string) (int, string, []*http.Cookie) {
					deadline := time.Now().Add(20 * time.Second)
					for {
						req, _ := http.NewRequest("GET", u, nil)
						for k, v := range hdr {
							req.Header.Set(k, v)
						}
						resp, err := previewHTTP(a.s.url).Do(req)
						if err != nil {
							a.t.Fatalf("GET %s: %v", u, err)
						}
						body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
						resp.Body.Close()
						// 502 while the sandbox's server is still starting.
						if resp.StatusCode != http.StatusBadGateway || time.Now().After(deadline) {
							return resp.StatusCode, string(body), resp.Cookies()
						}
						time.Sleep(200 * time.Millisecond)
					}
				}
				pageB := "absec-preview-" + b.ID
				// A's token in the URL is traded for a cookie (302); the cookie opens A's page.
				st, body, cookies := get(urls[a.id]+"?agentbox_token="+tokens[a.id], nil)
				var cookie []string
				for _, c := range cookies {
					cookie = append(cookie, c.Name+"="+c.Value)
				}
				if st != http.StatusFound || len(cookie) == 0 {
					a.t.Fatalf("control: A's preview with A's token: %d %q, cookies %v; want 302 with a cookie", st, body, cookie)
				}
				if st, body, _ := get(urls[a.id], map[string]string{"Cookie": strings.Join(cookie, "; ")}); st != 200 || !strings.Contains(body, "absec-preview-"+a.id) {
					a.t.Fatalf("control: A's preview with A's cookie: %d %q", st, body)
				}
				for what, try := range map[string]struct {
					u   string
					hdr map[string]string
				}{
					"A's token":             {urls[b.ID] + "?agentbox_token=" + tokens[a.id], nil},
					"A's cookie":            {urls[b.ID], map[string]string{"Cookie": strings.Join(cookie, "; ")}},
					"A's token as a bearer": {urls[b.ID], map[string]string{"Authorization": "Bearer " + tokens[a.id]}},
					"A's URL with B's id":   {strings.Replace(urls[a.id], a.id, b.ID, 1) + "?agentbox_token=" + tokens[a.id], nil},
				} {
					if st, body, _ := get(try.u, try.hdr); st == 200 || strings.Contains(body, pageB) {
						a.t.Errorf("HOLE: B's preview with %s: %d %q", what, st, body)
					}
				}
				if st, _, cookies := get(urls[b.ID]+"?agentbox_token="+tokens[b.ID], nil); st != http.StatusFound || len(cookies) == 0 {
					a.t.Errorf("control: B's preview with B's token: %d, cookies %v; want 302 with a cookie", st, cookies)
				} else if st, body, _ := get(urls[b.ID], map[string]string{"Cookie": cookies[0].Name + "=" + cookies[0].Value}); st != 200 || !strings.Contains(body, pageB) {
					a.t.Errorf("control: B's preview with B's cookie: %d %q", st, body)
				}
			},
		},
		{
			name:   "egress-routes-sysctls",
			does:   "in an egress sandbox, as root, tries to change its network: deletes the local route that sends every address to its loopback, adds a default route and an address, creates a veth and a dummy link, brings lo down, and writes net sysctls (ip_forward, ip_unprivileged_port_start, route_localnet, disable_ipv6)",
			want:   "every change is refused (no CAP_NET_ADMIN over the sandbox's network namespace, /proc/sys read-only); the routing table and the sysctls are as before; egress still obeys the policy (good.lab allowed, blocked.lab refused)",
			gvisor: "gVisor's netstack has no local-route trick to undo and no interface but loopback: route and link changes are refused; root may flip ip_forward of the sandbox's own netstack (gVisor does not honour /proc/sys read-only there), which forwards nothing with loopback alone, and egress still obeys the policy",
			create: egressReq(),
			run: func(a *arena) {
				a.needEgress()
				state := `ip -4 route show table all 2>&1 | sort; ip -6 route show table all 2>&1 | sort; ip -br link 2>&1; for f in ipv4/ip_forward ipv4/ip_unprivileged_port_start ipv4/conf/all/route_localnet ipv6/conf/all/disable_ipv6; do echo "$f=$(cat /proc/sys/net/$f 2>&1)"; done`
				before := a.root(state).Stdout
				r := a.root(`
for c in "ip route del local 0.0.0.0/0 dev lo table local" "ip route add default dev lo" "ip addr add 10.99.0.1/24 dev lo" \
         "ip link add absec0 type veth peer name absec1" "ip link add absec2 type dummy" "ip link set lo down" \
         "ip -6 route add default dev lo"; do
  if $c 2>/dev/null; then echo "CHANGED: $c"; fi
done
for f in ipv4/ip_forward ipv4/ip_unprivileged_port_start ipv4/conf/all/route_localnet ipv6/conf/all/disable_ipv6; do
  (echo 1 > /proc/sys/net/$f) 2>/dev/null && echo "WROTE: $f"
done
echo done`)
				wrote := r.Stdout
				after := a.root(state).Stdout
				if a.gvisor() {
					// gVisor's own netstack: ip_forward is writable and harmless (see gvisor above).
					wrote = strings.ReplaceAll(wrote, "WROTE: ipv4/ip_forward\n", "")
					before = strings.Replace(before, "ipv4/ip_forward=0", "ipv4/ip_forward=*", 1)
					after = strings.Replace(strings.Replace(after, "ipv4/ip_forward=1", "ipv4/ip_forward=*", 1), "ipv4/ip_forward=0", "ipv4/ip_forward=*", 1)
				}
				if strings.Contains(wrote, "CHANGED") || strings.Contains(wrote, "WROTE") || !strings.HasSuffix(wrote, "done\n") {
					a.t.Errorf("HOLE: root changed the sandbox's network:\n%s%s", r.Stdout, r.Stderr)
				}
				if after != before {
					a.t.Errorf("HOLE: the network changed:\nbefore:\n%s\nafter:\n%s", before, after)
				}
				r = a.sh(`curl -s --max-time 20 -o /dev/null -w '%{http_code} ' http://good.lab/hello; curl -s --max-time 20 -o /dev/null -w '%{http_code}\n' http://blocked.lab/hello`)
				if r.Stdout != "200 403\n" {
					a.t.Errorf("egress after the attempts: %q %q, want 200 for good.lab and 403 for blocked.lab", r.Stdout, r.Stderr)
				}
			},
		},
	}
}

// connections returns the arena sandbox's connection records (newest 1000).
func (a *arena) connections() []egress.Connection {
	a.t.Helper()
	st, b, err := a.s.rest(context.Background(), "GET", "/v1/sandboxes/"+a.id+"/connections", map[string][]string{"limit": {"1000"}}, nil)
	var page sandbox.ConnectionList
	if err != nil || st != 200 || json.Unmarshal(b, &page) != nil {
		a.t.Fatalf("connections: %d %s %v", st, b, err)
	}
	return page.Connections
}

// previewHTTP dials the server whatever host a preview URL names.
func previewHTTP(serverURL string) *http.Client {
	addr := strings.TrimPrefix(serverURL, "http://")
	return &http.Client{
		Timeout: 20 * time.Second,
		Transport: &http.Transport{Proxy: nil, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
