package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/netlab"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestNetwork is the network end to end on runc, crun and gVisor (in parallel, one server each,
// one lab for all): the default "none", egress by name through the proxy (curl, pip, git) and,
// where the runtime declares "transparent_egress", through the transparent path; every
// never-reachable class refused with its reason recorded; SNI mismatch; a live policy change;
// the 403 body; secrets that reach only their hosts and appear nowhere else; preview URLs of a
// no-network sandbox; and a server SIGKILL that the egress session survives.
func TestNetwork(t *testing.T) {
	testenv.RequireRoot(t)
	lab := netlab.New(t)
	for _, rt := range []string{"runc", "crun", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			testNetwork(t, lab, rt)
		})
	}
	// Checked when every runtime is done: nothing ever reached the host's own listeners at the
	// lab's trap port (127.0.0.1 and the host's lab address).
	t.Cleanup(func() {
		if n := lab.TrapHits(); n != 0 {
			t.Errorf("HOLE: %d connections from sandboxes reached the host's trap listeners", n)
		}
	})
}

// netEnv is one runtime's server, its lab and what the test saw.
type netEnv struct {
	t      *testing.T
	lab    *netlab.Lab
	rt     string
	s      *server
	dir    string
	args   []string
	env    []string
	secret string // the value of env:NETLAB_SECRET_<RT>
	fileV  []string
	secDir string

	allow []string // the egress sandbox's policy at create

	mu      sync.Mutex
	replies bytes.Buffer // every REST reply body, searched for secret values at the end
	oldLogs string       // the logs of servers killed before n.s
}

func testNetwork(t *testing.T, lab *netlab.Lab, rt string) {
	n := &netEnv{t: t, lab: lab, rt: rt, dir: testenv.ShortTempDir(t, "abnet")}
	n.secret = "netlab-secret-" + randHex(16)
	n.secDir = t.TempDir()
	n.fileV = []string{"netlab-file-secret-" + randHex(16)}
	if err := os.WriteFile(filepath.Join(n.secDir, "key"), []byte(n.fileV[0]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	envName := "NETLAB_SECRET_" + strings.ToUpper(rt)
	n.env = []string{envName + "=" + n.secret}
	n.args = []string{"--allow-private-network", "--egress-allow-cidr", lab.CIDR(), "--egress-dns", lab.DNSAddr(),
		"--egress-upstream-ca", lab.CAFile(), "--secret-env", envName, "--secret-dir", n.secDir}
	n.s = &server{testenv.StartServerEnv(t, n.dir, token, n.env, n.args...), t}
	defer func() {
		if t.Failed() {
			t.Logf("server log (tail):\n%s", tailString(n.s.Logs.String(), 12<<10))
		}
	}()

	none := n.create(map[string]any{})
	t.Run("none-by-default", func(t *testing.T) { n.noneByDefault(t, none) })
	t.Run("preview-url", func(t *testing.T) { n.preview(t, none) })

	port := lab.TrapPort()
	rebind := "rebind-" + rt + ".lab"
	allow := []string{"good.lab", "tls.lab", "git.lab", "pypi.lab", "alt.lab",
		fmt.Sprintf("%s:%d", netlab.EvilLoopback, port), netlab.EvilMetadata, fmt.Sprintf("%s:%d", rebind, port),
		lab.HostOf("pypi.lab").String() + "/32",
		fmt.Sprintf("%s/32:%d", lab.HostAddr(), port)}
	n.allow = allow
	eg := n.create(map[string]any{
		"network": map[string]any{"allow": allow, "deny": []string{}},
		"secrets": map[string]any{
			"LAB_TOKEN": map[string]any{"from": "env:" + envName, "hosts": []string{"alt.lab"}},
			"LAB_FILE":  map[string]any{"from": "file:" + filepath.Join(n.secDir, "key"), "hosts": []string{"alt.lab"}},
		},
	})
	transparent := slices.Contains(eg.Hardening, runtime.HardeningTransparentEgress)
	if rt != "gvisor" && !transparent {
		t.Errorf("%s sandbox's hardening %v lacks %q", rt, eg.Hardening, runtime.HardeningTransparentEgress)
	}
	if rt == "gvisor" && transparent {
		t.Errorf("gVisor claims %q (it has no transparent path)", runtime.HardeningTransparentEgress)
	}
	n.putLabCA(eg.ID)

	t.Run("environment", func(t *testing.T) { n.environment(t, eg) })
	t.Run("proxy-by-name", func(t *testing.T) { n.proxyByName(t, eg) })
	t.Run("transparent", func(t *testing.T) { n.transparentPath(t, eg, transparent) })
	t.Run("never-reachable", func(t *testing.T) { n.neverReachable(t, eg, rebind) })
	t.Run("live-update", func(t *testing.T) { n.liveUpdate(t, eg, none) })
	t.Run("secrets", func(t *testing.T) { n.secrets(t, eg) })
	t.Run("connections-recorded", func(t *testing.T) { n.connectionsRecorded(t, eg) })
	t.Run("server-restart", func(t *testing.T) { n.restart(t, eg) })
	t.Run("secret-nowhere", func(t *testing.T) { n.secretNowhere(t, eg) })
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// rest sends one REST request (body marshalled as JSON unless nil) and returns the status and
// the reply body, which is kept for the final secret search.
func (n *netEnv) rest(method, path string, body any) (int, []byte) {
	n.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, n.s.URL+path, r)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	n.mu.Lock()
	n.replies.Write(b)
	n.mu.Unlock()
	return resp.StatusCode, b
}

// create makes a sandbox on the env's runtime (256 MiB of memory and disk) from a raw request.
func (n *netEnv) create(req map[string]any) sandbox.Sandbox {
	n.t.Helper()
	req["runtime"] = n.rt
	req["memory_mb"] = 256
	req["disk_mb"] = 256
	st, b := n.rest("POST", "/v1/sandboxes", req)
	var sb sandbox.Sandbox
	if err := json.Unmarshal(b, &sb); st != http.StatusCreated && st != http.StatusOK || err != nil || sb.State != sandbox.StateRunning {
		n.t.Fatalf("create %v: %d %s", req, st, b)
	}
	return sb
}

// exec runs argv in id as user ("" = agent) and returns the result; a failed call fails the test.
func (n *netEnv) exec(t *testing.T, id, user string, argv ...string) wire.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	res, err := n.s.client().Exec(ctx, id, wire.ExecRequest{Command: argv, User: user, TimeoutSeconds: 90}, nil)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", argv, id, err)
	}
	n.mu.Lock()
	n.replies.WriteString(res.Stdout + res.Stderr)
	n.mu.Unlock()
	return res
}

func (n *netEnv) sh(t *testing.T, id, script string) wire.ExecResult {
	t.Helper()
	return n.exec(t, id, "", "sh", "-c", script)
}

func (n *netEnv) py(t *testing.T, id, prog string, args ...string) wire.ExecResult {
	t.Helper()
	return n.exec(t, id, "", append([]string{"python3", "-c", prog}, args...)...)
}

// putLabCA copies the lab's CA into the sandbox as /tmp/lab-ca.pem, for clients that talk TLS
// to lab hosts that are not intercepted.
func (n *netEnv) putLabCA(id string) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := n.s.client().WriteFile(ctx, id, "/tmp/lab-ca.pem", 0o644, bytes.NewReader(n.lab.CAPEM())); err != nil {
		n.t.Fatal(err)
	}
}

// connections returns all of id's connection records (paged).
func (n *netEnv) connections(t *testing.T, id string) []egress.Connection {
	t.Helper()
	var all []egress.Connection
	after := int64(0)
	for range 100 {
		st, b := n.rest("GET", "/v1/sandboxes/"+id+"/connections?limit=1000&after="+strconv.FormatInt(after, 10), nil)
		var page sandbox.ConnectionList
		if err := json.Unmarshal(b, &page); st != 200 || err != nil {
			t.Fatalf("connections: %d %s", st, b)
		}
		all = append(all, page.Connections...)
		if len(page.Connections) == 0 || page.Next <= after {
			return all
		}
		after = page.Next
	}
	t.Fatalf("connections of %s: more than 100 pages", id)
	return nil
}

// findConn waits (records are written in batches) for a record of host[:port] matching decision.
func (n *netEnv) findConn(t *testing.T, id, host string, port int, decision string) egress.Connection {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var seen []string
		for _, c := range n.connections(t, id) {
			if c.Host == host && (port == 0 || c.Port == port) && c.Decision == decision {
				return c
			}
			seen = append(seen, fmt.Sprintf("%s %s:%d %s %s %q", c.Kind, c.Host, c.Port, c.Decision, c.Rule, c.Reason))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s connection record for %s:%d; records:\n%s", decision, host, port, strings.Join(seen, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// probeProg tries, with no proxy, a DNS lookup, a TCP connection and a UDP DNS query to the lab,
// and prints one line each: "dns OK|FAIL", "tcp OK|FAIL", "udp OK|FAIL" (OK = an answer came).
const probeProg = `
import socket, sys, struct
name, addr = sys.argv[1], sys.argv[2]
try:
    socket.getaddrinfo(name, 80, socket.AF_INET)
    print("dns OK")
except OSError as e:
    print("dns FAIL", e)
try:
    s = socket.create_connection((addr, 80), timeout=3)
    print("tcp OK")
except OSError as e:
    print("tcp FAIL", e)
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00\x00\x01\x00\x01"
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2)
    u.sendto(q, (addr, 53))
    u.recvfrom(512)
    print("udp OK")
except OSError as e:
    print("udp FAIL", e)
`

func (n *netEnv) noneByDefault(t *testing.T, sb sandbox.Sandbox) {
	res := n.py(t, sb.ID, probeProg, "good.lab", n.lab.HostOf("good.lab").String())
	for _, want := range []string{"dns FAIL", "tcp FAIL", "udp FAIL"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("network none: want %q:\n%s%s", want, res.Stdout, res.Stderr)
		}
	}
	// No proxy is announced, and the file says why nothing resolves.
	if r := n.sh(t, sb.ID, `echo "proxy=[$HTTP_PROXY$https_proxy]"`); r.Stdout != "proxy=[]\n" {
		t.Errorf("network none announces a proxy: %q", r.Stdout)
	}
	// A "none" sandbox's network cannot be changed live.
	st, b := n.rest("PATCH", "/v1/sandboxes/"+sb.ID+"/network", map[string]any{"allow": []string{"good.lab"}, "deny": []string{}})
	if st != http.StatusConflict || !strings.Contains(string(b), "CONFLICT") {
		t.Errorf("PATCH network of a none sandbox: %d %s, want 409 CONFLICT", st, b)
	}
}

// previewServer serves "/" (a page) and "/ws" (a WebSocket echo of text messages) on the port
// in argv[1], on 127.0.0.1 only; it uses only the standard library.
const previewServer = `
import base64, hashlib, http.server, socketserver, struct, sys
PAGE = b"<html><body>netlab preview page</body></html>"
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path.startswith("/ws") and self.headers.get("Upgrade", "").lower() == "websocket":
            key = self.headers["Sec-WebSocket-Key"]
            acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", acc)
            self.end_headers()
            self.wfile.flush()
            r = self.rfile
            while True:
                h = r.read(2)
                if len(h) < 2: return
                op, ln = h[0] & 15, h[1] & 127
                if ln == 126: ln = struct.unpack(">H", r.read(2))[0]
                elif ln == 127: ln = struct.unpack(">Q", r.read(8))[0]
                mask = r.read(4) if h[1] & 128 else b"\0\0\0\0"
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(ln)))
                if op == 8:
                    self.wfile.write(b"\x88\x00"); self.wfile.flush(); return
                if op in (1, 2):
                    out = bytes([0x80 | op])
                    out += bytes([len(data)]) if len(data) < 126 else b"\x7e" + struct.pack(">H", len(data))
                    self.wfile.write(out + data); self.wfile.flush()
        body = PAGE
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

func (n *netEnv) preview(t *testing.T, sb sandbox.Sandbox) {
	ctx := context.Background()
	if _, err := n.s.client().WriteFile(ctx, sb.ID, "/tmp/preview.py", 0o644, strings.NewReader(previewServer)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.client().StartJob(ctx, sb.ID, wire.ExecRequest{Command: []string{"python3", "/tmp/preview.py", "8000"}}); err != nil {
		t.Fatalf("start the preview server: %v", err)
	}
	// Wait until it listens (from inside).
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := n.py(t, sb.ID, `import socket; socket.create_connection(("127.0.0.1", 8000), timeout=1); print("up")`)
		if r.Stdout == "up\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the preview server never listened: %s", r.Stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	st, b := n.rest("POST", "/v1/sandboxes/"+sb.ID+"/expose", map[string]any{"port": 8000, "public": false})
	var exp struct {
		URL         string `json:"url"`
		Port        int    `json:"port"`
		Public      bool   `json:"public"`
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(b, &exp); st/100 != 2 || err != nil || exp.AccessToken == "" || exp.Port != 8000 || exp.Public {
		t.Fatalf("expose: %d %s", st, b)
	}
	u, err := url.Parse(exp.URL)
	if err != nil || u.Hostname() != "8000-"+sb.ID+".localhost" {
		t.Fatalf("preview URL %q, want http://8000-%s.localhost:PORT/", exp.URL, sb.ID)
	}
	get := func(path string, hdr map[string]string) (int, string) {
		t.Helper()
		resp, err := previewClient(n.s.URL).Do(previewReq(t, exp.URL+path, hdr))
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b)
	}
	const page = "netlab preview page"
	if st, body := get("", nil); st == 200 || strings.Contains(body, page) {
		t.Errorf("private preview without a token: %d %q", st, body)
	}
	if st, body := get("?agentbox_token=wrong-"+exp.AccessToken, nil); st == 200 || strings.Contains(body, page) {
		t.Errorf("private preview with a wrong token: %d %q", st, body)
	}
	// The access token in the URL is traded for a host-only cookie (302 to the URL without it),
	// which then opens the page.
	req := previewReq(t, exp.URL+"?agentbox_token="+exp.AccessToken, nil)
	req.Host = u.Host
	resp, err := previewClient(n.s.URL).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "agentbox_preview" {
			cookie = c
		}
	}
	if resp.StatusCode != http.StatusFound || cookie == nil || strings.Contains(resp.Header.Get("Location"), "agentbox_token") {
		t.Errorf("private preview with its access token: %d, cookie %v, Location %q; want 302 to the URL without the token, with a cookie", resp.StatusCode, cookie, resp.Header.Get("Location"))
	} else if st, body := get("", map[string]string{"Cookie": "agentbox_preview=" + cookie.Value}); st != 200 || !strings.Contains(body, page) {
		t.Errorf("private preview with the cookie: %d %q", st, body)
	}
	if st, body := get("", map[string]string{"Authorization": "Bearer " + token}); st != 200 || !strings.Contains(body, page) {
		t.Errorf("private preview with the server's token: %d %q", st, body)
	}
	// A WebSocket through the preview URL.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(exp.URL, "http") + "ws?agentbox_token=" + exp.AccessToken
	ws, _, err := websocket.Dial(wctx, wsURL, &websocket.DialOptions{HTTPClient: previewClient(n.s.URL), Host: u.Host})
	if err != nil {
		t.Errorf("WebSocket through the preview URL: %v", err)
	} else {
		ws.Write(wctx, websocket.MessageText, []byte("ping from the host"))
		if _, m, err := ws.Read(wctx); err != nil || string(m) != "ping from the host" {
			t.Errorf("WebSocket echo: %q %v", m, err)
		}
		ws.Close(websocket.StatusNormalClosure, "")
	}
	// Public: no token needed; unexposed: gone.
	if st, b := n.rest("POST", "/v1/sandboxes/"+sb.ID+"/expose", map[string]any{"port": 8000, "public": true}); st/100 != 2 {
		t.Fatalf("expose public: %d %s", st, b)
	}
	if st, body := get("", nil); st != 200 || !strings.Contains(body, page) {
		t.Errorf("public preview: %d %q", st, body)
	}
	if st, b := n.rest("DELETE", "/v1/sandboxes/"+sb.ID+"/expose/8000", nil); st/100 != 2 {
		t.Fatalf("unexpose: %d %s", st, b)
	}
	if st, body := get("", map[string]string{"Authorization": "Bearer " + token}); st == 200 || strings.Contains(body, page) {
		t.Errorf("preview after unexpose: %d %q", st, body)
	}
}

// previewClient dials the server's address whatever host a URL names (*.localhost).
func previewClient(serverURL string) *http.Client {
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

func previewReq(t *testing.T, u string, hdr map[string]string) *http.Request {
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return req
}

func (n *netEnv) environment(t *testing.T, sb sandbox.Sandbox) {
	r := n.sh(t, sb.ID, `echo "$HTTP_PROXY|$HTTPS_PROXY|$ALL_PROXY|$http_proxy|$https_proxy|$NO_PROXY|$SSL_CERT_FILE|$REQUESTS_CA_BUNDLE|$NODE_EXTRA_CA_CERTS|$GIT_SSL_CAINFO|$CURL_CA_BUNDLE"; grep '^nameserver' /etc/resolv.conf; test -s /etc/agentbox/ca-bundle.pem && echo bundle; echo "token=$LAB_TOKEN"`)
	p, b := "http://127.0.0.1:3128", runtime.CABundlePath
	want := strings.Join([]string{p, p, p, p, p}, "|") + "|"
	if !strings.HasPrefix(r.Stdout, want) {
		t.Errorf("proxy variables: %q, want prefix %q", r.Stdout, want)
	}
	if !strings.Contains(r.Stdout, strings.Join([]string{b, b, b, b, b}, "|")+"\n") {
		t.Errorf("CA variables: %q, want each %s", r.Stdout, b)
	}
	if !strings.Contains(r.Stdout, "localhost") || !strings.Contains(r.Stdout, "nameserver 127.0.0.1\n") || !strings.Contains(r.Stdout, "bundle\n") {
		t.Errorf("NO_PROXY, resolv.conf or CA bundle: %q", r.Stdout)
	}
	if !strings.Contains(r.Stdout, "token=agentbox-secret-") || strings.Contains(r.Stdout, n.secret) {
		t.Errorf("LAB_TOKEN is not a placeholder: %q", r.Stdout)
	}
}

func (n *netEnv) proxyByName(t *testing.T, sb sandbox.Sandbox) {
	r := n.sh(t, sb.ID, `curl -sS --max-time 20 http://good.lab/hello && curl -sS --max-time 20 --cacert /tmp/lab-ca.pem https://tls.lab/hello && python3 -c 'import socket; print(socket.getaddrinfo("good.lab", 80, socket.AF_INET)[0][4][0])'`)
	if r.ExitCode != 0 || strings.Count(r.Stdout, netlab.Hello) != 2 || !strings.HasPrefix(strings.Split(r.Stdout, netlab.Hello)[2], n.lab.HostOf("good.lab").String()) {
		t.Errorf("curl through the proxy / DNS: exit %d\n%s%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	r = n.sh(t, sb.ID, `cd /tmp && PIP_CONFIG_FILE=/dev/null python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check --index-url http://pypi.lab/simple/ --trusted-host pypi.lab -d /tmp/dl `+netlab.PkgName+` && ls /tmp/dl`)
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, netlab.PkgName+"-"+netlab.PkgVersion) {
		t.Errorf("pip download: exit %d\n%s%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	r = n.sh(t, sb.ID, `cd /tmp && rm -rf clone && git clone -q http://git.lab`+netlab.RepoPath+` clone && cat clone/`+netlab.RepoFile)
	if r.ExitCode != 0 || r.Stdout != netlab.RepoContent {
		t.Errorf("git clone: exit %d\n%s%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	// An IP literal named by a CIDR rule is allowed.
	r = n.sh(t, sb.ID, `curl -sS --max-time 20 http://`+n.lab.HostOf("pypi.lab").String()+`/hello`)
	if r.Stdout != netlab.Hello {
		t.Errorf("IP literal with a CIDR rule: exit %d\n%s%s", r.ExitCode, r.Stdout, r.Stderr)
	}
	n.findConn(t, sb.ID, "good.lab", 80, egress.Allowed)
}

// rawClient connects with no proxy to argv[1]:argv[2] (a name resolved through the sandbox's
// DNS, or an address), then for "tls" does a TLS handshake with SNI argv[3] ("-": none,
// hostname checks off) trusting the lab's CA, and sends GET /hello with Host argv[3]
// (argv[4] for "http"). Prints "OK <body line>" or "FAIL <error>".
const rawClient = `
import socket, ssl, sys
mode, host, port, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    s = socket.create_connection((host, port), timeout=10)
    if mode == "tls":
        ctx = ssl.create_default_context(cafile="/tmp/lab-ca.pem")
        if name == "-":
            ctx.check_hostname = False
        s = ctx.wrap_socket(s, server_hostname=None if name == "-" else name)
    s.sendall(("GET /hello HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (host if name == "-" else name)).encode())
    s.settimeout(10)
    data = b""
    while len(data) < 1 << 20:
        b = s.recv(65536)
        if not b:
            break
        data += b
    body = data.split(b"\r\n\r\n", 1)[-1].decode(errors="replace").strip()
    print(("OK " if data.startswith(b"HTTP/1.1 200") else "FAIL status ") + body[:200])
except Exception as e:
    print("FAIL", type(e).__name__, e)
`

func (n *netEnv) transparentPath(t *testing.T, sb sandbox.Sandbox, transparent bool) {
	hello := strings.TrimSpace(netlab.Hello)
	tlsAddr := n.lab.HostOf("tls.lab").String()
	if !transparent {
		// gVisor: no transparent path; the raw connection does not get out.
		if r := n.py(t, sb.ID, rawClient, "tls", "tls.lab", "443", "tls.lab"); !strings.HasPrefix(r.Stdout, "FAIL") {
			t.Errorf("raw TLS client on a runtime without the transparent path: %q %q", r.Stdout, r.Stderr)
		}
		return
	}
	cases := []struct {
		name             string
		mode, host, port string
		sni              string
		ok               bool
	}{
		{"tls-by-name", "tls", "tls.lab", "443", "tls.lab", true},
		{"http-by-name", "http", "good.lab", "80", "good.lab", true},
		{"tls-to-address-sni-allowed", "tls", tlsAddr, "443", "tls.lab", true},
		{"sni-mismatch", "tls", tlsAddr, "443", "blocked.lab", false},
		{"host-mismatch", "http", n.lab.HostOf("good.lab").String(), "80", "blocked.lab", false},
		{"no-sni-to-address", "tls", tlsAddr, "443", "-", false},
		{"sni-never-reachable", "tls", tlsAddr, "443", netlab.EvilMetadata, false},
	}
	for _, c := range cases {
		r := n.py(t, sb.ID, rawClient, c.mode, c.host, c.port, c.sni)
		if got := r.Stdout == "OK "+hello+"\n"; got != c.ok {
			t.Errorf("%s (%s %s:%s SNI/Host %s): %q %q, want ok=%v", c.name, c.mode, c.host, c.port, c.sni, r.Stdout, r.Stderr, c.ok)
		}
	}
	c := n.findConn(t, sb.ID, "blocked.lab", 443, egress.Denied)
	if c.Kind != egress.KindTransparent || c.Reason == "" {
		t.Errorf("SNI mismatch record: %+v", c)
	}
	n.findConn(t, sb.ID, "tls.lab", 443, egress.Allowed)
}

// curlStatus fetches url through the proxy and prints "<status>\n<body>".
func curlScript(u string) string {
	return `curl -s --max-time 20 -o /tmp/body -w '%{http_code}\n' '` + u + `'; cat /tmp/body 2>/dev/null`
}

func (n *netEnv) neverReachable(t *testing.T, sb sandbox.Sandbox, rebind string) {
	port := n.lab.TrapPort()
	trapBefore := n.lab.TrapHits()
	// policy: refused by the policy (no rule names it), so the 403 says how to change it;
	// otherwise a never-reachable class that no policy opens.
	type refusal struct {
		host, url string
		policy    bool
	}
	refused := []refusal{
		{netlab.EvilLoopback, fmt.Sprintf("http://%s:%d/hello", netlab.EvilLoopback, port), false},
		{netlab.EvilMetadata, "http://" + netlab.EvilMetadata + "/latest/meta-data/", false},
		{n.lab.HostOf("good.lab").String(), "http://" + n.lab.HostOf("good.lab").String() + "/hello", true}, // IP literal, no CIDR rule
		{n.lab.HostAddr().String(), fmt.Sprintf("http://%s:%d/hello", n.lab.HostAddr(), port), false},       // the host's own address, CIDR rule or not
		{"127.0.0.1", fmt.Sprintf("http://127.0.0.1:%d/hello", port), false},
		{"169.254.169.254", "http://169.254.169.254/latest/meta-data/", false},
		{"metadata.google.internal", "http://metadata.google.internal/computeMetadata/v1/", false},
	}
	for _, c := range refused {
		r := n.exec(t, sb.ID, "", "env", "NO_PROXY=", "no_proxy=", "sh", "-c", curlScript(c.url))
		if !strings.HasPrefix(r.Stdout, "403\n") || !strings.Contains(r.Stdout, "refused") || c.policy && !strings.Contains(r.Stdout, "sandbox_network_update") {
			t.Errorf("%s: want a 403 saying why (naming sandbox_network_update for a policy refusal), got:\n%s%s", c.url, r.Stdout, r.Stderr)
		}
		if rec := n.findConn(t, sb.ID, c.host, 0, egress.Denied); rec.Reason == "" {
			t.Errorf("%s: denied record without a reason: %+v", c.url, rec)
		}
	}
	// Names resolving only to never-reachable addresses get no DNS answer inside.
	r := n.sh(t, sb.ID, `for h in `+netlab.EvilLoopback+` `+netlab.EvilMetadata+` blocked.lab; do getent ahostsv4 $h >/dev/null && echo "RESOLVED $h"; done; echo done`)
	if r.Stdout != "done\n" {
		t.Errorf("DNS inside answered never-reachable or unallowed names:\n%s", r.Stdout)
	}
	// Rebinding: the first answer is a lab address, every later one 127.0.0.1. Whatever the
	// proxy asked, each connection went to the address it checked: the lab's, or none.
	var got []string
	for range 3 {
		r := n.sh(t, sb.ID, `curl -s --max-time 20 -D - -o /dev/null -w '%{http_code}\n' http://`+rebind+`:`+strconv.Itoa(port)+`/hello | tr -d '\r' | grep -iE '^(x-lab-local-addr|[0-9]{3}$)' | tr '\n' ' '`)
		got = append(got, strings.TrimSpace(r.Stdout))
	}
	var refusedOnce bool
	for _, g := range got {
		switch {
		case strings.HasSuffix(g, "403"):
			refusedOnce = true
		case strings.HasSuffix(g, "200") && strings.Contains(strings.ToLower(g), "x-lab-local-addr: "+n.lab.Addr(netlab.RebindFirst).String()+":"):
		default:
			t.Errorf("rebinding name: answer %q is neither the lab's first address nor a refusal", g)
		}
	}
	if !refusedOnce {
		t.Errorf("rebinding name never refused once it resolved to 127.0.0.1: %v", got)
	}
	if n.lab.TrapHits() != trapBefore {
		t.Errorf("HOLE: a connection reached the host's trap listener (127.0.0.1 or %s port %d)", n.lab.HostAddr(), port)
	}
}

func (n *netEnv) liveUpdate(t *testing.T, sb, none sandbox.Sandbox) {
	n.sh(t, sb.ID, `echo before > /tmp/marker; sleep 600 >/dev/null 2>&1 & echo $! > /tmp/sleeper`)
	r := n.sh(t, sb.ID, curlScript("http://blocked.lab/hello"))
	if !strings.HasPrefix(r.Stdout, "403\n") || !strings.Contains(r.Stdout, "blocked.lab") || !strings.Contains(r.Stdout, "sandbox_network_update") {
		t.Fatalf("blocked.lab before the update: want a 403 naming it and sandbox_network_update:\n%s", r.Stdout)
	}
	st, b := n.rest("GET", "/v1/sandboxes/"+sb.ID, nil)
	var pre sandbox.Sandbox
	if err := json.Unmarshal(b, &pre); st != 200 || err != nil {
		t.Fatalf("get: %d %s", st, b)
	}
	// The reply shows the sandbox's policy.
	var raw struct {
		Network json.RawMessage `json:"network"`
	}
	json.Unmarshal(b, &raw)
	var shown egress.Policy
	if err := json.Unmarshal(raw.Network, &shown); err != nil || len(shown.Allow) != len(n.allow) || !slices.Contains(shown.Allow, "good.lab") {
		t.Errorf("the sandbox's reply does not show its policy %v: %s", n.allow, raw.Network)
	}
	policy := egress.Policy{Allow: n.allow, Deny: []string{}}
	added := append(slices.Clone(policy.Allow), "blocked.lab")
	if st, b := n.rest("PATCH", "/v1/sandboxes/"+sb.ID+"/network", map[string]any{"allow": added, "deny": []string{}}); st != 200 {
		t.Fatalf("PATCH network: %d %s", st, b)
	}
	if r := n.sh(t, sb.ID, curlScript("http://blocked.lab/hello")); r.Stdout != "200\n"+netlab.Hello {
		t.Errorf("blocked.lab right after allowing it: %q", r.Stdout)
	}
	// Deny wins over allow.
	if st, b := n.rest("PATCH", "/v1/sandboxes/"+sb.ID+"/network", map[string]any{"allow": added, "deny": []string{"blocked.lab"}}); st != 200 {
		t.Fatalf("PATCH network: %d %s", st, b)
	}
	if r := n.sh(t, sb.ID, curlScript("http://blocked.lab/hello")); !strings.HasPrefix(r.Stdout, "403\n") || !strings.Contains(r.Stdout, "blocked.lab") {
		t.Errorf("blocked.lab after denying it: %q", r.Stdout)
	}
	if st, b := n.rest("PATCH", "/v1/sandboxes/"+sb.ID+"/network", map[string]any{"allow": policy.Allow, "deny": []string{}}); st != 200 {
		t.Fatalf("PATCH network back: %d %s", st, b)
	}
	// Bad policies are refused naming the argument, and change nothing.
	for _, bad := range []map[string]any{{"allow": []string{"exa mple.com"}}, {"allow": []string{"10.0.0.0/33"}}, {"allow": []string{"good.lab:99999"}}} {
		if st, b := n.rest("PATCH", "/v1/sandboxes/"+sb.ID+"/network", bad); st != 400 || !strings.Contains(string(b), "INVALID_ARGUMENT") || !strings.Contains(string(b), "allow") {
			t.Errorf("PATCH %v: %d %s, want 400 INVALID_ARGUMENT naming allow", bad, st, b)
		}
	}
	// The same sandbox: its files and processes were never restarted.
	if r := n.sh(t, sb.ID, `cat /tmp/marker; kill -0 $(cat /tmp/sleeper) && echo sleeper`); r.Stdout != "before\nsleeper\n" {
		t.Errorf("the sandbox was restarted by a policy change: %q %q", r.Stdout, r.Stderr)
	}
	if got, err := n.s.client().Get(context.Background(), sb.ID); err != nil || !got.CreatedAt.Equal(pre.CreatedAt) || got.State != wire.StateRunning {
		t.Errorf("after the updates: %+v %v", got, err)
	}
}

func (n *netEnv) secrets(t *testing.T, sb sandbox.Sandbox) {
	tag := func(s string) string { return n.rt + "-" + s + "-" + randHex(4) }
	// The named host gets the real values (over TLS the proxy intercepts: curl trusts the
	// sandbox's bundle); quiet=1 keeps the lab from echoing them back.
	t1 := tag("named")
	r := n.sh(t, sb.ID, `curl -sS --max-time 20 -H "Authorization: Bearer $LAB_TOKEN" -H "X-File: $LAB_FILE" 'https://alt.lab/echo-headers?quiet=1&tag=`+t1+`'`)
	if r.Stdout != "recorded\n" {
		t.Fatalf("intercepted request to alt.lab: exit %d %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	rec := n.lab.Recorded(t1)
	if len(rec) != 1 || rec[0].Get("Authorization") != "Bearer "+n.secret || rec[0].Get("X-File") != n.fileV[0] {
		t.Errorf("alt.lab saw %v, want the real values", rec)
	}
	placeholder := strings.TrimSpace(n.sh(t, sb.ID, `echo $LAB_TOKEN`).Stdout)
	// The named host echoing what it got (the real values) gives the sandbox the placeholder.
	t0 := tag("echoed")
	r = n.sh(t, sb.ID, `curl -sS --max-time 20 --compressed -H "Authorization: Bearer $LAB_TOKEN" 'https://alt.lab/echo-headers?tag=`+t0+`'`)
	if rec := n.lab.Recorded(t0); len(rec) != 1 || rec[0].Get("Authorization") != "Bearer "+n.secret {
		t.Errorf("alt.lab saw %v, want the real value", rec)
	}
	if strings.Contains(r.Stdout, n.secret) || !strings.Contains(r.Stdout, "Bearer "+placeholder) {
		t.Errorf("HOLE: the echo of the request reached the sandbox as %q (exit %d, %q)", r.Stdout, r.ExitCode, r.Stderr)
	}
	// Another allowed host gets the placeholder, over TLS (not intercepted: the lab's own
	// certificate) and over plain HTTP.
	t2, t3 := tag("tls-other"), tag("http-other")
	n.sh(t, sb.ID, `curl -sS --max-time 20 --cacert /tmp/lab-ca.pem -H "Authorization: Bearer $LAB_TOKEN" 'https://tls.lab/echo-headers?quiet=1&tag=`+t2+`'; curl -sS --max-time 20 -H "Authorization: Bearer $LAB_TOKEN" 'http://good.lab/echo-headers?quiet=1&tag=`+t3+`'`)
	for _, tg := range []string{t2, t3} {
		if rec := n.lab.Recorded(tg); len(rec) != 1 || rec[0].Get("Authorization") != "Bearer "+placeholder {
			t.Errorf("%s: the other host saw %v, want the placeholder %q", tg, rec, placeholder)
		}
	}
	// Rotating the file takes effect on the next request, without a restart.
	n.fileV = append(n.fileV, "netlab-file-secret-rotated-"+randHex(16))
	if err := os.WriteFile(filepath.Join(n.secDir, "key"), []byte(n.fileV[1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t4 := tag("rotated")
	n.sh(t, sb.ID, `curl -sS --max-time 20 -H "X-File: $LAB_FILE" 'https://alt.lab/echo-headers?quiet=1&tag=`+t4+`'`)
	if rec := n.lab.Recorded(t4); len(rec) != 1 || rec[0].Get("X-File") != n.fileV[1] {
		t.Errorf("after rotating the file alt.lab saw %v", rec)
	}
	// secret-calls lists the swaps, never the values.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, b := n.rest("GET", "/v1/sandboxes/"+sb.ID+"/secret-calls", nil)
		var list sandbox.SecretCallList
		if err := json.Unmarshal(b, &list); st != 200 || err != nil {
			t.Fatalf("secret-calls: %d %s", st, b)
		}
		var swapped int
		for _, c := range list.Calls {
			if c.Host == "alt.lab" && c.Replaced && c.Method == "GET" && c.Path == "/echo-headers" {
				swapped++
			}
		}
		if swapped >= 3 { // LAB_TOKEN and LAB_FILE, then LAB_FILE again
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("secret-calls: %d swaps to alt.lab recorded, want 3:\n%s", swapped, b)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	c := n.findConn(t, sb.ID, "alt.lab", 443, egress.Allowed)
	if !c.Intercepted {
		t.Errorf("alt.lab's connection is not marked intercepted: %+v", c)
	}
	if c := n.findConn(t, sb.ID, "tls.lab", 443, egress.Allowed); c.Intercepted {
		t.Errorf("tls.lab (no secret) was intercepted: %+v", c)
	}
	// Secret sources the server was not opened to are refused, naming the flag; nothing is made.
	before, _ := n.s.client().List(context.Background(), nil, nil)
	for _, bad := range []struct{ from, flag string }{{"env:PATH", "--secret-env"}, {"file:/etc/shadow", "--secret-dir"}, {"file:" + n.secDir + "/../x", "from"}, {"vault:x", "from"}} {
		st, b := n.rest("POST", "/v1/sandboxes", map[string]any{"runtime": n.rt, "network": map[string]any{"allow": []string{"alt.lab"}},
			"secrets": map[string]any{"K": map[string]any{"from": bad.from, "hosts": []string{"alt.lab"}}}})
		if st != 400 || !strings.Contains(string(b), "INVALID_ARGUMENT") || !strings.Contains(string(b), bad.flag) {
			t.Errorf("secret from %s: %d %s, want 400 INVALID_ARGUMENT naming %s", bad.from, st, b, bad.flag)
		}
	}
	if after, _ := n.s.client().List(context.Background(), nil, nil); len(after) != len(before) {
		t.Errorf("refused creates left sandboxes: %d before, %d after", len(before), len(after))
	}
}

func (n *netEnv) connectionsRecorded(t *testing.T, sb sandbox.Sandbox) {
	c := n.findConn(t, sb.ID, "good.lab", 80, egress.Allowed)
	if c.BytesIn <= 0 || c.BytesOut <= 0 || c.Addr == "" || c.Time.IsZero() || c.Rule == "" {
		t.Errorf("allowed record lacks bytes, address, time or rule: %+v", c)
	}
	if !strings.HasPrefix(c.Addr, n.lab.HostOf("good.lab").String()) {
		t.Errorf("good.lab record's address %q, want %s", c.Addr, n.lab.HostOf("good.lab"))
	}
	// DNS queries are records too.
	var dns bool
	for _, c := range n.connections(t, sb.ID) {
		dns = dns || c.Kind == egress.KindDNS
	}
	if !dns {
		t.Errorf("no DNS query recorded")
	}
	// Paging is bounded.
	if st, b := n.rest("GET", "/v1/sandboxes/"+sb.ID+"/connections?limit=100000", nil); st != 400 || !strings.Contains(string(b), "limit") {
		t.Errorf("connections?limit=100000: %d %s, want 400 naming limit", st, b)
	}
	st, b := n.rest("GET", "/v1/sandboxes/"+sb.ID+"/connections?limit=2", nil)
	var page sandbox.ConnectionList
	if json.Unmarshal(b, &page); st != 200 || len(page.Connections) != 2 || page.Omitted == 0 {
		t.Errorf("connections?limit=2: %d %s", st, b)
	}
}

// restart kills the server with SIGKILL and starts it again: the egress sandbox's session
// reopens and its network works without the sandbox being restarted; what was recorded before
// the kill converges (crashState): its exposure, its updated policy, its connection records.
func (n *netEnv) restart(t *testing.T, sb sandbox.Sandbox) {
	// The convergence of what was recorded before the kill is the control plane's (the store,
	// reconcile, the agent's session), the same whatever the runtime: checked on runc only.
	var cs *crashState
	if n.rt == "runc" {
		c := n.beforeCrash(t, sb)
		cs = &c
	}
	n.s.kill()
	n.mu.Lock()
	n.oldLogs += n.s.Logs.String()
	n.mu.Unlock()
	n.s = &server{testenv.StartServerEnv(n.t, n.dir, token, n.env, n.args...), n.t}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := n.sh(t, sb.ID, `curl -sS --max-time 10 http://good.lab/hello`)
		if r.Stdout == netlab.Hello {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("egress after the server's restart: %q %q", r.Stdout, r.Stderr)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if r := n.sh(t, sb.ID, `cat /tmp/marker`); r.Stdout != "before\n" {
		t.Errorf("the sandbox did not survive the restart as it was: %q", r.Stdout)
	}
	if cs != nil {
		n.afterCrash(t, sb, *cs)
	}
}

// crashState is what the server had recorded when it was killed.
type crashState struct {
	previewURL, accessToken string
	seqs                    []int64 // the egress sandbox's connection records
	other                   sandbox.Sandbox
	otherURL                string
}

// beforeCrash records state whose reply came before the kill: a private exposure of a server in
// the egress sandbox, a policy change (blocked.lab allowed, alt.lab denied), connection records
// (listed, so written), and a second egress sandbox with a record and a public exposure that is
// destroyed after the restart.
func (n *netEnv) beforeCrash(t *testing.T, sb sandbox.Sandbox) crashState {
	ctx := context.Background()
	var cs crashState
	if _, err := n.s.client().WriteFile(ctx, sb.ID, "/tmp/preview.py", 0o644, strings.NewReader(previewServer)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.s.client().StartJob(ctx, sb.ID, wire.ExecRequest{Command: []string{"python3", "/tmp/preview.py", "8001"}}); err != nil {
		t.Fatalf("start the preview server: %v", err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if r := n.py(t, sb.ID, `import socket; socket.create_connection(("127.0.0.1", 8001), timeout=1); print("up")`); r.Stdout == "up\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the preview server in the egress sandbox never listened")
		}
	}
	st, b := n.rest("POST", "/v1/sandboxes/"+sb.ID+"/expose", map[string]any{"port": 8001})
	var exp sandbox.Exposure
	if err := json.Unmarshal(b, &exp); st/100 != 2 || err != nil || exp.AccessToken == "" {
		t.Fatalf("expose: %d %s", st, b)
	}
	cs.previewURL, cs.accessToken = exp.URL, exp.AccessToken
	added := append(slices.Clone(n.allow), "blocked.lab")
	if st, b := n.rest("PATCH", "/v1/sandboxes/"+sb.ID+"/network", map[string]any{"allow": added, "deny": []string{"alt.lab"}}); st != 200 {
		t.Fatalf("PATCH network: %d %s", st, b)
	}
	if r := n.sh(t, sb.ID, curlScript("http://blocked.lab/hello")); r.Stdout != "200\n"+netlab.Hello {
		t.Fatalf("blocked.lab after allowing it: %q", r.Stdout)
	}
	last := n.findConn(t, sb.ID, "blocked.lab", 80, egress.Allowed) // listed: written
	for _, c := range n.connections(t, sb.ID) {
		cs.seqs = append(cs.seqs, c.Seq)
	}
	if !slices.Contains(cs.seqs, last.Seq) {
		t.Fatalf("the newest records %v lack blocked.lab's %d", cs.seqs, last.Seq)
	}
	cs.other = n.create(map[string]any{"network": map[string]any{"allow": []string{"good.lab"}}})
	if r := n.sh(t, cs.other.ID, curlScript("http://good.lab/hello")); r.Stdout != "200\n"+netlab.Hello {
		t.Fatalf("good.lab from the second egress sandbox: %q", r.Stdout)
	}
	n.findConn(t, cs.other.ID, "good.lab", 80, egress.Allowed)
	st, b = n.rest("POST", "/v1/sandboxes/"+cs.other.ID+"/expose", map[string]any{"port": 8002, "public": true})
	if err := json.Unmarshal(b, &exp); st/100 != 2 || err != nil {
		t.Fatalf("expose: %d %s", st, b)
	}
	cs.otherURL = exp.URL
	return cs
}

// afterCrash checks that the state recorded before the kill is what the restarted server
// serves and enforces, and that a sandbox destroyed now leaves no exposure behind.
func (n *netEnv) afterCrash(t *testing.T, sb sandbox.Sandbox, cs crashState) {
	// The exposure serves its page with its access token (traded for the cookie).
	u, err := url.Parse(cs.previewURL)
	if err != nil {
		t.Fatal(err)
	}
	req := previewReq(t, cs.previewURL+"?agentbox_token="+cs.accessToken, nil)
	req.Host = u.Host
	resp, err := previewClient(n.s.URL).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie string
	for _, c := range resp.Cookies() {
		if c.Name == "agentbox_preview" {
			cookie = c.Value
		}
	}
	if resp.StatusCode != http.StatusFound || cookie == "" {
		t.Errorf("the exposure made before the kill, with its access token: %d (cookie %q), want 302 with a cookie", resp.StatusCode, cookie)
	} else {
		resp, err := previewClient(n.s.URL).Do(previewReq(t, cs.previewURL, map[string]string{"Cookie": "agentbox_preview=" + cookie}))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "netlab preview page") {
			t.Errorf("the exposure made before the kill: %d %q", resp.StatusCode, body)
		}
	}
	if resp, err := previewClient(n.s.URL).Do(previewReq(t, cs.previewURL, nil)); err != nil || resp.StatusCode == 200 {
		t.Errorf("the private exposure without a token after the restart: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// The policy set before the kill is the one enforced.
	if r := n.sh(t, sb.ID, curlScript("http://blocked.lab/hello")); r.Stdout != "200\n"+netlab.Hello {
		t.Errorf("blocked.lab (allowed before the kill) after the restart: %q", r.Stdout)
	}
	if r := n.sh(t, sb.ID, curlScript("http://alt.lab/hello")); !strings.HasPrefix(r.Stdout, "403\n") || !strings.Contains(r.Stdout, "alt.lab") {
		t.Errorf("alt.lab (denied before the kill) after the restart: %q", r.Stdout)
	}
	if st, b := n.rest("PATCH", "/v1/sandboxes/"+sb.ID+"/network", map[string]any{"allow": n.allow, "deny": []string{}}); st != 200 {
		t.Fatalf("PATCH network back: %d %s", st, b)
	}

	// The records listed before the kill are still there, and new ones come after them.
	n.findConn(t, sb.ID, "alt.lab", 80, egress.Denied)
	var seqs []int64
	for _, c := range n.connections(t, sb.ID) {
		seqs = append(seqs, c.Seq)
	}
	maxBefore := slices.Max(cs.seqs)
	for _, s := range cs.seqs {
		if !slices.Contains(seqs, s) {
			t.Errorf("record %d, listed before the kill, is gone after the restart (now %v)", s, seqs)
		}
	}
	var newer int
	for i, s := range seqs {
		if i > 0 && s <= seqs[i-1] {
			t.Errorf("records out of order after the restart: %v", seqs)
		}
		if s > maxBefore {
			newer++
		}
	}
	if newer == 0 {
		t.Errorf("no record after the restart has a seq above %d (the newest before the kill): %v", maxBefore, seqs)
	}

	// A sandbox destroyed after the restart leaves no exposure: its preview URL is 404, its
	// exposures list empty; its records stay readable as history until its record is pruned.
	get := func(u string) int {
		resp, err := previewClient(n.s.URL).Do(previewReq(t, u, nil))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := get(cs.otherURL); st != http.StatusBadGateway {
		t.Errorf("the second sandbox's public exposure (nothing listening) after the restart: %d, want 502", st)
	}
	if st, b := n.rest("DELETE", "/v1/sandboxes/"+cs.other.ID, nil); st/100 != 2 {
		t.Fatalf("destroy: %d %s", st, b)
	}
	if st := get(cs.otherURL); st != http.StatusNotFound {
		t.Errorf("the destroyed sandbox's preview URL: %d, want 404", st)
	}
	if st, b := n.rest("GET", "/v1/sandboxes/"+cs.other.ID+"/expose", nil); st != 200 || !strings.Contains(string(b), `"exposures":[]`) {
		t.Errorf("the destroyed sandbox's exposures: %d %s, want none", st, b)
	}
	before := n.connections(t, cs.other.ID)
	time.Sleep(300 * time.Millisecond) // a flush period and more: nothing new is written for it
	if after := n.connections(t, cs.other.ID); len(after) != len(before) || len(after) == 0 {
		t.Errorf("the destroyed sandbox's records: %d before, %d after (want the same history, nothing added)", len(before), len(after))
	}
}

// secretNowhere searches for the secrets' values inside the sandbox (every process's
// environment, the files it can write, its disk image on the host), in the store, the server's
// log and every reply the test got.
func (n *netEnv) secretNowhere(t *testing.T, sb sandbox.Sandbox) {
	values := append([]string{n.secret}, n.fileV...)
	// The values reach the searcher on its stdin, so that no argv or environment inside holds
	// them.
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	res, err := n.s.client().Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"python3", "-c", secretSearch}, User: "root",
		Stdin: strings.Join(values, "\n") + "\n", TimeoutSeconds: 120}, nil)
	if err != nil || res.Stdout != "searched\n" {
		t.Errorf("a secret's value is inside the sandbox (or the search failed): %v\n%s%s", err, res.Stdout, res.Stderr)
	}
	// Host side: the sandbox's dir (disk image included), the whole state dir (store: db, wal,
	// shm), the server's log, the replies.
	// The overlays of a sandbox's root and their lower layers are skipped: they show the image's
	// layers and the host's /usr (gigabytes); what the sandbox wrote there is in its writable
	// layer, on its disk, which is searched (mounted, and as its image file).
	roots := []string{n.dir}
	for _, root := range roots {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() {
				var st unix.Statfs_t
				if d.Name() == "lower" || (unix.Statfs(p, &st) == nil && st.Type == unix.OVERLAYFS_SUPER_MAGIC) {
					return filepath.SkipDir
				}
				return nil
			}
			if !d.Type().IsRegular() {
				return nil
			}
			if hit := fileContains(p, values); hit != "" {
				t.Errorf("a secret's value is in %s", p)
			}
			return nil
		})
	}
	n.mu.Lock()
	logs := n.oldLogs + n.s.Logs.String()
	replies := n.replies.String()
	n.mu.Unlock()
	for _, v := range values {
		if strings.Contains(logs, v) {
			t.Errorf("a secret's value is in the server's log")
		}
		if strings.Contains(replies, v) {
			t.Errorf("a secret's value is in a reply")
		}
	}
}

// secretSearch reads values (one a line) from stdin and prints every place inside the sandbox
// that holds one: files under the writable roots, every process's environ and cmdline, its
// own environment; then "searched".
const secretSearch = `
import glob, os, sys
vals = [v.encode() for v in sys.stdin.read().split()]
def check(path):
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
    except OSError:
        return
    if any(v in data for v in vals):
        print(path)
for root in ["/etc", "/tmp", "/workspace", "/home", "/root", "/var", "/run", "/opt", "/srv"]:
    for d, dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            if os.path.isfile(p) and not os.path.islink(p):
                check(p)
for p in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
    check(p)
env = "\\n".join(k + "=" + v for k, v in os.environ.items()).encode()
if any(v in env for v in vals):
    print("environment")
print("searched")
`

// fileContains reports which of needles the file holds ("" if none), reading it in chunks.
func fileContains(path string, needles []string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const chunk = 4 << 20
	buf := make([]byte, chunk+256)
	keep := 0
	for {
		k, err := io.ReadFull(f, buf[keep:keep+chunk])
		data := buf[:keep+k]
		for _, nd := range needles {
			if bytes.Contains(data, []byte(nd)) {
				return nd
			}
		}
		if err != nil {
			return ""
		}
		keep = copy(buf, data[len(data)-256:])
	}
}
