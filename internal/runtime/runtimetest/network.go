package runtimetest

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
)

// testCABundle is the CA bundle egress sandboxes of the suite get (runtimes do not parse it).
var testCABundle = []byte("-----BEGIN CERTIFICATE-----\nMIIBagentboxruntimetest\n-----END CERTIFICATE-----\n")

// EgressSpec is DefaultSpec in network mode egress with a CA bundle.
func EgressSpec(id string) runtime.Spec {
	spec := DefaultSpec(id)
	spec.Network = runtime.NetworkEgress
	spec.CABundle = testCABundle
	return spec
}

// testEgressContract: a runtime declares egress; an egress sandbox (with or without a CA
// bundle) runs commands and leaves nothing once deleted; a CA bundle past
// runtime.MaxCABundleBytes is INVALID_ARGUMENT naming the bound, and leaves nothing.
func testEgressContract(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	if modes := rt.Capabilities().NetworkModes; !slices.Contains(modes, runtime.NetworkEgress) {
		if rt.Capabilities().EgressReason == "" {
			t.Fatalf("network modes %v lack %s", modes, runtime.NetworkEgress)
		}
		// A runtime that says why it has no egress (EgressReason: kubernetes) refuses it as
		// any unsupported mode, and leaves nothing.
		spec := EgressSpec(NewID())
		t.Cleanup(func() { _ = rt.Delete(context.Background(), spec.ID) })
		if _, err := runtime.CreateAndStart(ctx, rt, spec); !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), runtime.NetworkNone) {
			t.Errorf("network egress on a runtime without it: %v, want INVALID_ARGUMENT naming %q", err, runtime.NetworkNone)
		}
		if listed(t, rt, spec.ID) {
			t.Errorf("a refused egress create left %s behind", spec.ID)
		}
		return
	}
	for _, withCA := range []bool{true, false} {
		spec := EgressSpec(NewID())
		if !withCA {
			spec.CABundle = nil
		}
		t.Cleanup(func() { _ = rt.Delete(context.Background(), spec.ID) })
		if _, err := runtime.CreateAndStart(ctx, rt, spec); err != nil {
			t.Fatalf("create egress (CA bundle %v): %v", withCA, err)
		}
		c := Client(t, rt, spec.ID)
		rctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
		err := c.WaitReady(rctx)
		cancel()
		if err != nil {
			t.Fatalf("egress sandbox: %v", err)
		}
		if res := Exec(t, c, "echo", "egress"); res.Stdout != "egress\n" {
			t.Fatalf("exec in an egress sandbox: %+v", res)
		}
		if err := rt.Delete(ctx, spec.ID); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if listed(t, rt, spec.ID) {
			t.Fatalf("deleted egress sandbox %s still listed", spec.ID)
		}
	}
	spec := EgressSpec(NewID())
	spec.CABundle = make([]byte, runtime.MaxCABundleBytes+1)
	t.Cleanup(func() { _ = rt.Delete(context.Background(), spec.ID) })
	_, err := runtime.CreateAndStart(ctx, rt, spec)
	if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), "ca_bundle") {
		t.Errorf("an oversized CA bundle: %v, want INVALID_ARGUMENT naming ca_bundle", err)
	}
	if listed(t, rt, spec.ID) {
		t.Errorf("a refused create left %s behind", spec.ID)
	}
}

// bindScript (root) binds what the agent of an egress sandbox binds on every runtime:
// 127.0.0.1:53 (UDP and TCP) and 127.0.0.1:3128.
const bindScript = `import socket
for kind, port in ((socket.SOCK_STREAM, 53), (socket.SOCK_DGRAM, 53), (socket.SOCK_STREAM, 3128)):
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", port))
    if kind == socket.SOCK_STREAM:
        s.listen(1)
print("bound")
`

// listenScript (root) is the transparent path's listener: 0.0.0.0:443 and 127.0.0.1:53 (TCP
// and UDP); it accepts one connection on 443 and prints its local address.
const listenScript = `import socket
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", 443))
l.listen(8)
d = socket.socket()
d.bind(("127.0.0.1", 53))
d.listen(1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 53))
l.settimeout(20)
a, peer = l.accept()
print("accepted %s:%d" % a.getsockname())
`

// dialScript (the agent user) connects to 203.0.113.7:443 (retrying while nothing listens
// yet), sends UDP to 8.8.8.8:53 and connects to [2001:db8::1]:443.
const dialScript = `import socket, time, errno
deadline = time.time() + 15
while True:
    try:
        c = socket.create_connection(("203.0.113.7", 443), timeout=3)
        break
    except ConnectionRefusedError:
        if time.time() > deadline:
            raise
        time.sleep(0.05)
print("tcp connected %s:%d" % c.getpeername())
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(2)
try:
    u.connect(("8.8.8.8", 53))
    u.send(b"\x00\x01query")
    u.recv(512)
    print("udp answered")
except ConnectionRefusedError:
    print("udp refused")
except socket.timeout:
    print("udp unanswered")
except OSError as e:
    print("udp failed", errno.errorcode.get(e.errno, e.errno))
try:
    s6 = socket.socket(socket.AF_INET6)
    s6.settimeout(3)
    s6.connect(("2001:db8::1", 443))
    print("v6 connected")
except OSError as e:
    print("v6 failed", errno.errorcode.get(e.errno, e.errno))
`

// unreachScript connects to 203.0.113.7:443 and prints "connected" or the errno's name.
const unreachScript = `import socket, errno
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("203.0.113.7", 443))
    print("connected")
except OSError as e:
    print("failed", errno.errorcode.get(e.errno, e.errno) if e.errno else type(e).__name__)
`

// execAs runs argv as user ("" = the agent user) and fails the test on a protocol error.
func execAs(t testing.TB, c *guest.Client, user string, argv ...string) Result {
	t.Helper()
	return ExecRequest(t, c, guest.ExecRequest{Argv: argv, User: user, TimeoutMs: 60000})
}

// needPython skips the test when the sandbox has no python3.
func needPython(t testing.TB, c *guest.Client) {
	t.Helper()
	if res := Exec(t, c, "python3", "-c", "pass"); res.ExitCode != 0 {
		t.Skipf("python3 is not available in the sandbox: %+v", res)
	}
}

// testEgressHost (host): inside an egress sandbox /etc/resolv.conf names 127.0.0.1, the CA
// bundle is at runtime.CABundlePath, readable by the agent user and writable by nobody, and
// root binds 127.0.0.1:53 (UDP and TCP) and :3128, as the agent does on every runtime.
func testEgressHost(t *testing.T, rt runtime.Runtime) {
	spec := EgressSpec(NewID())
	c := Start(t, rt, spec)
	if res := Exec(t, c, "cat", "/etc/resolv.conf"); !strings.Contains(res.Stdout, "nameserver 127.0.0.1\n") || strings.Count(res.Stdout, "nameserver") != 1 {
		t.Errorf("/etc/resolv.conf: %+v", res)
	}
	if res := Exec(t, c, "cat", runtime.CABundlePath); res.ExitCode != 0 || res.Stdout != string(testCABundle) {
		t.Errorf("the agent user reading %s: %+v", runtime.CABundlePath, res)
	}
	for _, user := range []string{"", "root"} {
		res := execAs(t, c, user, "sh", "-c", "echo x >> "+runtime.CABundlePath+" || exit 3; echo written")
		if res.ExitCode != 3 {
			t.Errorf("user %q appending to the CA bundle: %+v", user, res)
		}
		if res := execAs(t, c, user, "sh", "-c", "touch /etc/agentbox/other || exit 3"); res.ExitCode != 3 {
			t.Errorf("user %q creating a file beside the CA bundle: %+v", user, res)
		}
	}
	needPython(t, c)
	if res := execAs(t, c, "root", "python3", "-c", bindScript); strings.TrimSpace(res.Stdout) != "bound" {
		t.Errorf("root binding 127.0.0.1:53 and :3128: %+v", res)
	}
}

// declaresTransparent reports whether the runtime declares HardeningTransparentEgress.
func declaresTransparent(caps runtime.Capabilities) bool {
	return slices.Contains(caps.Hardening, runtime.HardeningTransparentEgress)
}

// testEgressTransparent (host, runtimes declaring transparent_egress): in an egress sandbox a
// connection from the agent user to any IPv4 address:443 lands on root's listener on
// 0.0.0.0:443 with the original destination as its local address; UDP to anywhere is refused
// or unanswered; IPv6 anywhere is unreachable; root inside cannot change routes, addresses or
// links; /sys is an empty read-only tmpfs (no sysfs: the namespace is not the sandbox's),
// with the sandbox's cgroups still at /sys/fs/cgroup.
func testEgressTransparent(t *testing.T, rt runtime.Runtime) {
	caps := rt.Capabilities()
	if !declaresTransparent(caps) {
		reason := caps.TransparentEgressReason
		if reason == "" {
			reason = "its hardening does not list it"
		}
		t.Skipf("runtime %s gives egress sandboxes no transparent path: %s", rt.Name(), reason)
	}
	c := Start(t, rt, EgressSpec(NewID()))
	needPython(t, c)
	var wg sync.WaitGroup
	var listened Result
	wg.Add(1)
	go func() {
		defer wg.Done()
		listened = execAs(t, c, "root", "python3", "-c", listenScript)
	}()
	dialed := execAs(t, c, "", "python3", "-c", dialScript)
	wg.Wait()
	if strings.TrimSpace(listened.Stdout) != "accepted 203.0.113.7:443" {
		t.Errorf("the listener on 0.0.0.0:443: %+v", listened)
	}
	out := dialed.Stdout
	if !strings.Contains(out, "tcp connected 203.0.113.7:443\n") {
		t.Errorf("the agent user's connect to 203.0.113.7:443: %+v", dialed)
	}
	if !strings.Contains(out, "udp refused\n") && !strings.Contains(out, "udp unanswered\n") {
		t.Errorf("UDP to 8.8.8.8:53: %+v", dialed)
	}
	if !strings.Contains(out, "v6 failed ENETUNREACH\n") {
		t.Errorf("IPv6 to 2001:db8::1: %+v", dialed)
	}
	for _, argv := range [][]string{
		{"ip", "route", "add", "10.0.0.0/8", "dev", "lo"},
		{"ip", "route", "del", "local", "0.0.0.0/0", "dev", "lo", "table", "local"},
		{"ip", "addr", "add", "10.9.8.7/32", "dev", "lo"},
		{"ip", "link", "set", "lo", "down"},
	} {
		res := execAs(t, c, "root", argv...)
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Operation not permitted") {
			t.Errorf("root running %q: %+v, want EPERM", argv, res)
		}
	}
	if res := Exec(t, c, "python3", "-c", unreachScript); strings.TrimSpace(res.Stdout) != "failed ECONNREFUSED" {
		t.Errorf("after the listener exited, 203.0.113.7:443: %+v", res)
	}
	if res := Exec(t, c, "sh", "-c", "grep ' /sys ' /proc/self/mountinfo; ls -A /sys"); !strings.Contains(res.Stdout, " - tmpfs ") ||
		!strings.Contains(res.Stdout, " ro,") || !strings.HasSuffix(res.Stdout, "\nfs\n") {
		t.Errorf("/sys of an egress sandbox, want an empty read-only tmpfs holding fs/cgroup: %+v", res)
	}
	if res := execAs(t, c, "root", "sh", "-c", "mkdir /sys/x || touch /sys/x || exit 3"); res.ExitCode != 3 {
		t.Errorf("root writing to /sys: %+v", res)
	}
	if res := Exec(t, c, "sh", "-c", "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max"); strings.TrimSpace(res.Stdout) != "256" {
		t.Errorf("the sandbox's pids.max under /sys/fs/cgroup: %+v", res)
	}
}
