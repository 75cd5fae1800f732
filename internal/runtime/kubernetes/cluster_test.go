//go:build linux

package kubernetes_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes/kubetest"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testenv"
)

// The cluster tests run on the cluster AGENTBOX_TEST_KUBECONFIG names (make test brings up
// hack/k8s's) through kubetest, and skip when it is unset. Each test has a namespace of its own
// (ab-kuberuntime-<hex>), deleted when it ends.

var (
	labOnce sync.Once
	lab     *kubetest.Lab
	labErr  error
)

// testLab returns the cluster with this tree's guest image imported (once per process); it
// skips the test when AGENTBOX_TEST_KUBECONFIG is unset.
func testLab(t testing.TB) *kubetest.Lab {
	t.Helper()
	kc := os.Getenv(kubetest.EnvKubeconfig)
	if kc == "" {
		t.Skip("AGENTBOX_TEST_KUBECONFIG is unset: no cluster to test the kubernetes runtime on (make test brings one up)")
	}
	testenv.RequireRoot(t) // ctr talks to the node's containerd
	bin := testenv.GuestBinary(t)
	labOnce.Do(func() { lab, labErr = kubetest.Open(kc, bin) })
	if labErr != nil {
		t.Fatalf("test cluster: %v", labErr)
	}
	return lab
}

// newRuntime makes a runtime on a fresh namespace, deleted (with every pod in it) when the
// test ends.
func newRuntime(t testing.TB, l *kubetest.Lab, isolation runtime.Isolation, class string) *kubernetes.Runtime {
	t.Helper()
	ctx := context.Background()
	ns, del, err := l.Namespace(ctx, "ab-kuberuntime")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := del(); err != nil {
			t.Errorf("delete namespace %s: %v", ns, err)
		}
	})
	rt, err := l.Runtime(ctx, ns, isolation, class)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	return rt
}

// killer kills the sandbox's container behind the runtime's back, as a crash would.
func killer(l *kubetest.Lab, rt *kubernetes.Runtime) runtimetest.Killer {
	return func(t testing.TB, id string) {
		t.Helper()
		if err := l.Kill(context.Background(), rt.Namespace(), id); err != nil {
			t.Fatalf("kill %s: %v", id, err)
		}
	}
}

func TestRuncClassSuite(t *testing.T) {
	l := testLab(t)
	rt := newRuntime(t, l, runtime.IsolationProcess, "runc")
	runtimetest.RunCluster(t, rt, killer(l, rt))
}

func TestGVisorClassSuite(t *testing.T) {
	l := testLab(t)
	rt := newRuntime(t, l, runtime.IsolationKernel, "gvisor")
	if caps := rt.Capabilities(); caps.Isolation != runtime.IsolationKernel || caps.Name != kubernetes.NameKernel {
		t.Fatalf("capabilities %+v", caps)
	}
	runtimetest.RunCluster(t, rt, killer(l, rt))
	t.Run("Kernel", func(t *testing.T) {
		cl := runtimetest.Start(t, rt, runtimetest.DefaultSpec(runtimetest.NewID()))
		// gVisor's sentry reports its own kernel version, never the host's.
		host, _ := os.ReadFile("/proc/sys/kernel/osrelease")
		res := runtimetest.Exec(t, cl, "uname", "-r")
		if strings.TrimSpace(res.Stdout) == strings.TrimSpace(string(host)) || res.ExitCode != 0 {
			t.Fatalf("uname -r inside %q, on the host %q: not gVisor", res.Stdout, host)
		}
	})
}

// TestSandboxPod: what a sandbox's pod holds and what it may do — the agent user, writable
// volumes only, the disk's owners, dropped capabilities, no service-account token, and no
// network past its own loopback (the host's listener on the node's addresses is not reached).
func TestSandboxPod(t *testing.T) {
	l := testLab(t)
	for _, class := range []struct {
		name      string
		isolation runtime.Isolation
	}{{"runc", runtime.IsolationProcess}, {"gvisor", runtime.IsolationKernel}} {
		t.Run(class.name, func(t *testing.T) { testSandboxPod(t, l, newRuntime(t, l, class.isolation, class.name)) })
	}
}

func testSandboxPod(t *testing.T, l *kubetest.Lab, rt *kubernetes.Runtime) {
	ctx := context.Background()
	if _, err := l.Client.NetworkingV1().NetworkPolicies(rt.Namespace()).Get(ctx, kubernetes.NetworkPolicyName, metav1.GetOptions{}); err != nil {
		t.Fatalf("the deny-all NetworkPolicy: %v", err)
	}
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			conn.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	id := runtimetest.NewID()
	cl := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"id", "-u"}, "1000"},
		{[]string{"sh", "-c", "touch /workspace/x && touch $HOME/y && touch /tmp/z && echo ok"}, "ok"},
		{[]string{"sh", "-c", "touch /etc/x 2>/dev/null || touch /x 2>/dev/null || echo refused"}, "refused"},
		{[]string{"sh", "-c", "echo x > /.agentbox/bin/agentbox 2>/dev/null || echo refused"}, "refused"},
		{[]string{"sh", "-c", "ls /var/run/secrets/kubernetes.io 2>/dev/null || echo none"}, "none"},
		{[]string{"sh", "-c", "grep CapEff /proc/self/status"}, "CapEff:\t0000000000000000"},
		{[]string{"sh", "-c", "grep NoNewPrivs /proc/self/status"}, "NoNewPrivs:\t1"},
		// RLIMIT_FSIZE at the disk's size (the agent's --fsize-mb), hard too: not raised back.
		{[]string{"sh", "-c", "grep 'Max file size' /proc/self/limits | tr -s ' '"}, "Max file size 1073741824 1073741824 bytes"},
		{[]string{"sh", "-c", "ulimit -f unlimited 2>/dev/null || echo refused"}, "refused"},
		{[]string{"sh", "-c", "cat /proc/1/limits | grep 'Max file size' | tr -s ' '"}, "Max file size 1073741824 1073741824 bytes"},
	} {
		if res := runtimetest.Exec(t, cl, tc.argv...); strings.TrimSpace(res.Stdout) != tc.want {
			t.Errorf("%q: %s, want %q", tc.argv, res, tc.want)
		}
	}
	// seccomp RuntimeDefault filters the workload under runc; under gVisor the workload's
	// calls go to the sentry, which runs under gVisor's own filter (the hardening list says so).
	wantSeccomp := "Seccomp:\t2"
	if rt.Capabilities().Isolation == runtime.IsolationKernel {
		wantSeccomp = "Seccomp:\t0"
		if !slices.Contains(rt.Capabilities().Hardening, "seccomp:gvisor-sentry") {
			t.Errorf("hardening %v claims what gVisor does not apply", rt.Capabilities().Hardening)
		}
	}
	if res := runtimetest.Exec(t, cl, "sh", "-c", "grep Seccomp: /proc/self/status"); strings.TrimSpace(res.Stdout) != wantSeccomp {
		t.Errorf("seccomp: %s, want %q", res, wantSeccomp)
	}
	res := runtimetest.ExecRequest(t, cl, guest.ExecRequest{Argv: []string{"sh", "-c", "id -u; grep CapEff /proc/self/status; touch /root/r && echo ok"}, User: "root", TimeoutMs: 30000})
	if !strings.HasPrefix(res.Stdout, "0\nCapEff:") || !strings.HasSuffix(res.Stdout, "\nok\n") || strings.Contains(res.Stdout, "CapEff:\t000001ff") {
		t.Errorf("as root: %s", res)
	}
	// The probe works: nc reaches a listener on the pod's own loopback.
	if res := runtimetest.Exec(t, cl, "sh", "-c", "nc -l -p 9999 >/dev/null & sleep 0.5; echo hi | nc -w 3 127.0.0.1 9999 && echo connected || echo failed"); strings.TrimSpace(res.Stdout) != "connected" {
		t.Fatalf("nc to the pod's own loopback: %s", res)
	}
	// No egress: every address of the node (the host in tests) is unreachable from the pod.
	addrs, _ := net.InterfaceAddrs()
	tried := 0
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.To4() == nil {
			continue
		}
		tried++
		res := runtimetest.Exec(t, cl, "sh", "-c", fmt.Sprintf("nc -w 3 %s %d </dev/null && echo connected || echo failed", ipn.IP, port))
		if strings.Contains(res.Stdout, "connected") {
			t.Errorf("the sandbox reached %s:%d: %s", ipn.IP, port, res)
		}
	}
	if tried == 0 {
		t.Fatal("the host has no IPv4 address to try")
	}
	select {
	case <-accepted:
		t.Error("the host's listener accepted a connection from the sandbox")
	default:
	}
}

// TestAgentLatency reports what reaching the agent through the API server costs: the first
// dial (opening the exec tunnel) and later dials (a yamux stream each).
func TestAgentLatency(t *testing.T) {
	l := testLab(t)
	rt := newRuntime(t, l, runtime.IsolationProcess, "runc")
	ctx := context.Background()
	id := runtimetest.NewID()
	runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	// A fresh runtime on the same namespace has no tunnel yet (a restarted server).
	rt2, err := l.Runtime(ctx, rt.Namespace(), runtime.IsolationProcess, "runc")
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close(ctx)
	dial, err := rt2.Agent(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	conn, err := dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Since(start)
	conn.Close()
	var later []time.Duration
	for range 20 {
		start := time.Now()
		conn, err := dial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		later = append(later, time.Since(start))
		conn.Close()
	}
	gc := guest.NewClient(guest.Dialer(dial))
	defer gc.Close()
	var execs []time.Duration
	for range 10 {
		start := time.Now()
		if res := runtimetest.Exec(t, gc, "true"); res.ExitCode != 0 {
			t.Fatal(res)
		}
		execs = append(execs, time.Since(start))
	}
	t.Logf("first dial (exec tunnel opened) %s; later dials %s; exec true %s", first.Round(time.Millisecond), median(later), median(execs))
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2].Round(10 * time.Microsecond)
}

// TestInitContainerDelivery: the agent copied in by an init container (clusters without image
// volumes) works as the image volume does, on both classes.
func TestInitContainerDelivery(t *testing.T) {
	l := testLab(t)
	ctx := context.Background()
	ns, del, err := l.Namespace(ctx, "ab-kuberuntime")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = del() })
	for _, class := range []struct {
		name      string
		isolation runtime.Isolation
	}{{"runc", runtime.IsolationProcess}, {"gvisor", runtime.IsolationKernel}} {
		t.Run(class.name, func(t *testing.T) {
			cfg := l.Config(ns, class.isolation, class.name)
			cfg.Delivery = kubernetes.DeliveryInitContainer
			rt, err := l.RuntimeWith(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close(ctx)
			id := runtimetest.NewID()
			cl := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
			res := runtimetest.Exec(t, cl, "sh", "-c", "id -u; stat -c %u /workspace; touch /workspace/x && echo ok")
			if res.Stdout != "1000\n1000\nok\n" {
				t.Fatalf("%s", res)
			}
			p, err := l.Client.CoreV1().Pods(ns).Get(ctx, id, metav1.GetOptions{})
			if err != nil || len(p.Spec.InitContainers) != 1 {
				t.Fatalf("pod %v: init containers %d", err, len(p.Spec.InitContainers))
			}
		})
	}
}

// TestUnschedulableFailsFast: a sandbox the cluster cannot place (more cpu than any node has)
// fails as soon as the scheduler says so — CAPACITY_UNAVAILABLE with the scheduler's own
// message — instead of waiting out the ready timeout for a pod that stays Pending.
func TestUnschedulableFailsFast(t *testing.T) {
	l := testLab(t)
	rt := newRuntime(t, l, runtime.IsolationProcess, "runc")
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.CPU = 512 // no node of a test cluster has 512 cores
	ctx := context.Background()
	t.Cleanup(func() { rt.Delete(context.Background(), spec.ID) })
	if _, err := runtime.CreateAndStart(ctx, rt, spec); err != nil {
		t.Fatalf("create and start %s: %v", spec.ID, err)
	}
	c := runtimetest.Client(t, rt, spec.ID)
	rctx, cancel := context.WithTimeout(ctx, runtimetest.ReadyTimeout)
	defer cancel()
	err := c.WaitReady(rctx)
	if rctx.Err() != nil {
		t.Fatalf("the wait ran into its timeout (%v) instead of failing on the scheduler's word: %v", runtimetest.ReadyTimeout, err)
	}
	e, ok := errcode.As(err)
	if !ok || e.Code != errcode.CapacityUnavailable || !strings.Contains(e.Message, "Insufficient cpu") {
		t.Fatalf("the unplaceable sandbox's wait: %v; want CAPACITY_UNAVAILABLE with the scheduler's message", err)
	}
}

// TestRoomOnCluster: the test cluster's room counts its node and fits a small sandbox, and no
// more 512-core ones than the scheduler would place (none).
func TestRoomOnCluster(t *testing.T) {
	l := testLab(t)
	rt := newRuntime(t, l, runtime.IsolationProcess, "runc")
	r, err := rt.Room(context.Background(), 0.1, 64)
	if err != nil {
		t.Fatal(err)
	}
	if r.Nodes < 1 || r.Fit < 1 || r.FreeMilliCPU <= 0 || r.FreeMemoryMB <= 0 {
		t.Fatalf("room %+v: want a node with room for a 0.1-cpu, 64 MiB sandbox", r)
	}
	if big, err := rt.Room(context.Background(), 512, 64); err != nil || big.Fit != 0 {
		t.Fatalf("512-core sandboxes fit %d times (%v)", big.Fit, err)
	}
}

// TestPodStartTrace: the first dial of a new sandbox's agent records the pod's start as the
// create trace's steps — scheduled, pod sandbox made (volumes mounted), container running,
// tunnel open — in that order, without gaps, each non-negative, under the caller's span, and
// covering the dial up to the tunnel.
func TestPodStartTrace(t *testing.T) {
	l := testLab(t)
	rt := newRuntime(t, l, runtime.IsolationProcess, "runc")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	ctx := context.Background()
	if _, err := rt.Run(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Delete(context.Background(), id) })
	dial, err := rt.Agent(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	pctx, parent := tp.Tracer("test").Start(ctx, "create.agent_ready")
	began := time.Now()
	conn, err := dial(pctx)
	opened := time.Since(began)
	parent.End()
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	want := []string{kubernetes.StepPodSchedule, kubernetes.StepPodSandbox, kubernetes.StepPodContainer, kubernetes.StepTunnel}
	var got []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if slices.Contains(want, s.Name()) {
			if s.Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("span %s is not under the caller's span", s.Name())
			}
			got = append(got, s)
		}
	}
	slices.SortFunc(got, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	var names []string
	var sum time.Duration
	for i, s := range got {
		names = append(names, s.Name())
		d := s.EndTime().Sub(s.StartTime())
		if d < 0 {
			t.Errorf("span %s lasted %s", s.Name(), d)
		}
		if i > 0 && !s.StartTime().Equal(got[i-1].EndTime()) {
			t.Errorf("span %s starts at %s, not where %s ended (%s)", s.Name(), s.StartTime(), got[i-1].Name(), got[i-1].EndTime())
		}
		sum += d
	}
	if !slices.Equal(names, want) {
		t.Fatalf("steps %v, want %v", names, want)
	}
	// The steps run from the dial's start to the tunnel's opening: all but what the dial does
	// after it (a stream and its status byte, a millisecond or two).
	if sum > opened || opened-sum > 50*time.Millisecond {
		t.Errorf("the steps sum to %s of the %s the dial took", sum, opened)
	}
	t.Logf("pod start: %s", func() string {
		var b strings.Builder
		for _, s := range got {
			fmt.Fprintf(&b, "%s %s; ", s.Name(), s.EndTime().Sub(s.StartTime()).Round(time.Millisecond))
		}
		return b.String()
	}())
	// A second dial reuses the tunnel and records nothing more.
	n := len(rec.Ended())
	conn, err = dial(pctx)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if m := len(rec.Ended()); m != n {
		t.Errorf("a later dial recorded %d more spans", m-n)
	}
}
