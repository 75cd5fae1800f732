package netlab

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestLab: every server of the lab answers from the host's namespace, at the right address,
// and the lab leaves nothing behind.
func TestLab(t *testing.T) {
	var ns, link string
	t.Run("servers", func(t *testing.T) {
		l := New(t)
		ns, link = l.ns, l.hostIf
		c := l.Client()
		get := func(url string) (string, http.Header) {
			t.Helper()
			resp, err := c.Get(url)
			if err != nil {
				t.Fatalf("GET %s: %v", url, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 {
				t.Fatalf("GET %s: %s %s", url, resp.Status, b)
			}
			return string(b), resp.Header
		}
		if body, h := get("http://good.lab/hello"); body != Hello || !strings.HasPrefix(h.Get("X-Lab-Local-Addr"), l.HostOf("good.lab").String()+":") {
			t.Errorf("hello: %q local %q", body, h.Get("X-Lab-Local-Addr"))
		}
		if body, h := get("https://tls.lab/hello"); body != Hello || !strings.HasPrefix(h.Get("X-Lab-Local-Addr"), l.HostOf("tls.lab").String()+":443") {
			t.Errorf("https hello: %q local %q", body, h.Get("X-Lab-Local-Addr"))
		}
		if body, _ := get("http://good.lab/bytes?n=1000000"); len(body) != 1000000 {
			t.Errorf("bytes: %d", len(body))
		}
		req, _ := http.NewRequest("GET", "https://tls.lab/echo-headers?tag=t1", nil)
		req.Header.Set("X-Probe", "p1")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var hdr http.Header
		json.NewDecoder(resp.Body).Decode(&hdr)
		resp.Body.Close()
		if hdr.Get("X-Probe") != "p1" || hdr.Get("Host") != "tls.lab" {
			t.Errorf("echo-headers: %v", hdr)
		}
		if r := l.Recorded("t1"); len(r) != 1 || r[0].Get("X-Probe") != "p1" {
			t.Errorf("recorded: %v", r)
		}
		if body, _ := get("https://tls.lab/echo-headers?tag=t2&quiet=1"); body != "recorded\n" || len(l.Recorded("t2")) != 1 {
			t.Errorf("quiet echo: %q", body)
		}
		// The trap port is served by the lab and trapped on the host.
		if body, _ := get("http://" + net.JoinHostPort(l.Addr(RebindFirst).String(), itoa(l.TrapPort())) + "/hello"); body != Hello {
			t.Errorf("trap port on the lab: %q", body)
		}
		if l.TrapHits() != 0 {
			t.Fatalf("trap hit before any trap connection")
		}
		for _, a := range []string{"127.0.0.1", l.HostAddr().String()} {
			cn, err := net.Dial("tcp", net.JoinHostPort(a, itoa(l.TrapPort())))
			if err != nil {
				t.Fatal(err)
			}
			cn.Close()
		}
		waitFor(t, func() bool { return l.TrapHits() == 2 }, "trap hits")

		// WebSocket echo.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, "wss://tls.lab/ws", &websocket.DialOptions{HTTPClient: c})
		if err != nil {
			t.Fatal(err)
		}
		ws.Write(ctx, websocket.MessageText, []byte("ping"))
		if _, m, err := ws.Read(ctx); err != nil || string(m) != "ping" {
			t.Errorf("ws echo: %q %v", m, err)
		}
		ws.Close(websocket.StatusNormalClosure, "")

		// DNS.
		for name, want := range map[string]string{"good.lab": l.Addr(2).String(), "tls.lab": l.Addr(3).String(),
			"git.lab": l.Addr(4).String(), "pypi.lab": l.Addr(5).String(), EvilLoopback: "127.0.0.1", EvilMetadata: "169.254.169.254"} {
			ips, err := l.Resolve(name)
			if err != nil || len(ips) != 1 || ips[0].String() != want {
				t.Errorf("resolve %s: %v %v, want %s", name, ips, err, want)
			}
		}
		l.ResetRebind()
		var seq []string
		for range 3 {
			ips, err := l.Resolve(Rebind)
			if err != nil || len(ips) != 1 {
				t.Fatalf("rebind: %v %v", ips, err)
			}
			seq = append(seq, ips[0].String())
		}
		if seq[0] != l.Addr(RebindFirst).String() || seq[1] != "127.0.0.1" || seq[2] != "127.0.0.1" {
			t.Errorf("rebind answers %v", seq)
		}
		if _, err := l.Resolve("nope.lab"); err == nil {
			t.Errorf("nope.lab resolved")
		}
		var sawTCP bool
		for _, q := range l.Queries() {
			sawTCP = sawTCP || q.Net == "tcp"
		}
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", l.DNSAddr())
		}}
		if ips, err := r.LookupHost(context.Background(), "git.lab"); err != nil || len(ips) != 1 || ips[0] != l.Addr(4).String() {
			t.Errorf("resolve over TCP: %v %v", ips, err)
		}
		for _, q := range l.Queries() {
			sawTCP = sawTCP || q.Net == "tcp"
		}
		if !sawTCP {
			t.Errorf("no TCP query logged: %v", l.Queries())
		}

		// git clone over smart HTTP.
		dst := filepath.Join(t.TempDir(), "clone")
		cmd := exec.Command("git", "clone", "-q", "http://"+l.Addr(4).String()+RepoPath, dst)
		cmd.Env = append(noProxyEnv(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git clone: %v %s", err, out)
		}
		if b, _ := os.ReadFile(filepath.Join(dst, RepoFile)); string(b) != RepoContent {
			t.Errorf("cloned %s: %q", RepoFile, b)
		}

		// pip download from the index (pip only downloads; nothing is installed).
		pip := "/usr/bin/python3"
		dl := t.TempDir()
		cmd = exec.Command(pip, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--no-cache-dir",
			"--index-url", "http://"+l.Addr(5).String()+"/simple/", "--trusted-host", l.Addr(5).String(), "-d", dl, PkgName)
		cmd.Env = append(noProxyEnv(), "PIP_CONFIG_FILE=/dev/null")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pip download: %v %s", err, out)
		}
		if _, err := os.Stat(filepath.Join(dl, wheelName)); err != nil {
			t.Errorf("pip download left no %s", wheelName)
		}
	})
	if ns == "" {
		return
	}
	if _, err := os.Stat("/run/netns/" + ns); err == nil {
		t.Errorf("namespace %s left", ns)
	}
	if _, err := net.InterfaceByName(link); err == nil {
		t.Errorf("link %s left", link)
	}
}

// TestLabsInParallel: two labs at once get distinct subnets and both serve.
func TestLabsInParallel(t *testing.T) {
	var wg sync.WaitGroup
	labs := make([]*Lab, 2)
	for i := range labs {
		wg.Add(1)
		go func() { defer wg.Done(); labs[i] = New(t) }()
	}
	wg.Wait()
	if labs[0] == nil || labs[1] == nil {
		t.FailNow()
	}
	if labs[0].N() == labs[1].N() {
		t.Fatalf("two labs on 10.203.%d", labs[0].N())
	}
	for _, l := range labs {
		resp, err := l.Client().Get("http://good.lab/hello")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
}

func noProxyEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !strings.HasSuffix(strings.ToLower(k), "_proxy") {
			env = append(env, kv)
		}
	}
	return env
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestFixtureRepos: the target's check fails before the fixture agent's edit and passes after;
// the agent's refs build (good) and fail to build (bad-build); the private repository over
// HTTPS needs the token and records what it saw.
func TestFixtureRepos(t *testing.T) {
	l := New(t)
	home := t.TempDir()
	git := func(dir string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(noProxyEnv(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+home, "GIT_TERMINAL_PROMPT=0", "GIT_SSL_CAINFO="+l.CAFile())
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	sh := func(dir string, env []string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command("/bin/sh", args...)
		cmd.Dir = dir
		cmd.Env = append(noProxyEnv(), env...)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	git4 := l.Addr(4).String()
	tmp := t.TempDir()

	// the target over plain HTTP: the check fails
	target := filepath.Join(tmp, "target")
	if out, err := git(tmp, "clone", "-q", "http://"+git4+TargetRepoPath, target); err != nil {
		t.Fatalf("clone target: %v %s", err, out)
	}
	if out, code := sh(target, nil, TargetCheck); code != 1 || !strings.Contains(out, "status.txt is not fixed") {
		t.Fatalf("check before the edit: exit %d %q", code, out)
	}

	// the agent at each ref, over HTTPS with the lab's CA
	for _, ref := range []string{AgentGoodRef, AgentBadBuildRef} {
		agent := filepath.Join(tmp, "agent-"+ref)
		if out, err := git(tmp, "clone", "-q", "-b", ref, "https://"+git4+AgentRepoPath, agent); err != nil {
			t.Fatalf("clone agent %s: %v %s", ref, err, out)
		}
		out, code := sh(agent, nil, AgentBuild)
		if ref == AgentGoodRef && (code != 0 || !strings.Contains(out, "fixture build ok")) ||
			ref == AgentBadBuildRef && (code != 1 || !strings.Contains(out, "fixture build failed")) {
			t.Fatalf("build of %s: exit %d %q", ref, code, out)
		}
	}
	// the good agent, invoked the oh-my-pi way in the target, fixes it
	launcher := filepath.Join(tmp, "agent-"+AgentGoodRef, AgentLauncher)
	out, code := sh(target, nil, launcher, "--print", "--", "fix the status")
	if code != 0 || out != "fixture agent good: built=yes task=fix the status\n" {
		t.Fatalf("launcher: exit %d %q", code, out)
	}
	// ... and as a generic command with the task in the environment, then on stdin
	if out, code := sh(target, []string{"AGENT_TASK=second task"}, launcher); code != 0 || !strings.Contains(out, "task=second task") {
		t.Fatalf("launcher with AGENT_TASK: exit %d %q", code, out)
	}
	cmd := exec.Command("/bin/sh", launcher)
	cmd.Dir, cmd.Stdin = target, strings.NewReader("third task")
	if b, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(b), "task=third task") {
		t.Fatalf("launcher with stdin: %v %q", err, b)
	}
	if b, _ := os.ReadFile(filepath.Join(target, TargetTasksFile)); string(b) != "fix the status\nsecond task\nthird task\n" {
		t.Fatalf("%s = %q", TargetTasksFile, b)
	}
	if out, code := sh(target, nil, TargetCheck); code != 0 || out != "check ok\n" {
		t.Fatalf("check after the edit: exit %d %q", code, out)
	}
	if out, code := sh(filepath.Join(tmp, "agent-"+AgentBadBuildRef), nil, AgentLauncher, "--print", "--", "x"); code != 0 ||
		!strings.Contains(out, "fixture agent bad-build: built=no") {
		t.Fatalf("bad-build launcher: exit %d %q", code, out)
	}

	// the private repository: refused without the token, with a wrong one, served with it
	priv := "https://" + git4 + PrivateRepoPath
	if out, err := git(tmp, "clone", "-q", priv, filepath.Join(tmp, "p0")); err == nil {
		t.Fatalf("clone without credentials succeeded: %s", out)
	}
	l.SetGitToken("tok-chosen-by-the-test")
	basic := func(user, pass string) string {
		return "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	if out, err := git(tmp, "-c", "http.extraHeader="+basic("x-access-token", "wrong"), "clone", "-q", priv, filepath.Join(tmp, "p1")); err == nil {
		t.Fatalf("clone with a wrong token succeeded: %s", out)
	}
	_, denied := l.GitAuthCounts()
	if denied < 2 {
		t.Fatalf("denied = %d", denied)
	}
	if out, err := git(tmp, "-c", "http.extraHeader="+basic("x-access-token", "tok-chosen-by-the-test"), "clone", "-q", priv, filepath.Join(tmp, "p2")); err != nil {
		t.Fatalf("clone with the token: %v %s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(tmp, "p2", TargetStatusFile)); string(b) != "broken\n" {
		t.Fatalf("private %s = %q", TargetStatusFile, b)
	}
	accepted, _ := l.GitAuthCounts()
	seen := l.GitAuth()
	want := strings.TrimPrefix(basic("x-access-token", "tok-chosen-by-the-test"), "Authorization: ")
	found := false
	for _, a := range seen {
		found = found || a == want
	}
	if accepted < 2 || !found {
		t.Fatalf("accepted %d, seen %q", accepted, seen)
	}
	// over plain HTTP too (same rule)
	resp, err := l.Client().Get("http://git.lab" + PrivateRepoPath + "/info/refs?service=git-upload-pack")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") != `Basic realm="netlab"` {
		t.Fatalf("plain HTTP without credentials: %s %v", resp.Status, resp.Header)
	}
	// the git delay holds every git request
	l.SetGitDelay(400 * time.Millisecond)
	start := time.Now()
	resp, err = l.Client().Get("http://git.lab" + TargetRepoPath + "/info/refs?service=git-upload-pack")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if el := time.Since(start); resp.StatusCode != 200 || el < 400*time.Millisecond {
		t.Fatalf("delayed info/refs: %s after %v", resp.Status, el)
	}
	l.SetGitDelay(0)
}
