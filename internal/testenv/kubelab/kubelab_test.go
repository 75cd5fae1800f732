package kubelab_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testenv/kubelab"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCluster proves the test cluster works from Go through the API server: a pod per
// RuntimeClass runs, exec over WebSocket returns stdout, stderr, stdin and exit codes, runc shows
// the host's kernel and gVisor its own, pods have an address on the bridge, no default route and
// no way off the bridge, a hardened pod (non-root, no capabilities, seccomp, read-only root,
// emptyDir with a size limit, Guaranteed QoS) runs on runc and gVisor, and a deny-all
// NetworkPolicy can be created.
func TestCluster(t *testing.T) {
	l := kubelab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	hostKernel := strings.TrimSpace(string(host))

	for _, rc := range []string{kubelab.RuntimeClassRunc, kubelab.RuntimeClassGVisor, kubelab.RuntimeClassGVisorHostnet} {
		t.Run(rc, func(t *testing.T) {
			start := time.Now()
			p, err := l.RunPod(ctx, kubelab.BusyboxPod("bb-"+rc, rc))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: pod running after %v, IP %s", rc, time.Since(start).Round(time.Millisecond), p.Status.PodIP)

			r, err := l.Exec(ctx, p.Name, "main", []string{"sh", "-c", "uname -r; echo oops >&2; exit 3"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.ExitCode != 3 || strings.TrimSpace(string(r.Stderr)) != "oops" {
				t.Fatalf("exit %d stderr %q, want 3 and \"oops\"", r.ExitCode, r.Stderr)
			}
			kernel := strings.TrimSpace(string(r.Stdout))
			if rc == kubelab.RuntimeClassRunc && kernel != hostKernel {
				t.Fatalf("runc pod's kernel %q, want the host's %q", kernel, hostKernel)
			}
			if rc != kubelab.RuntimeClassRunc && (kernel == hostKernel || kernel == "") {
				t.Fatalf("gVisor pod's kernel %q, want gVisor's own (the host's is %q)", kernel, hostKernel)
			}
			t.Logf("%s: uname -r = %s", rc, kernel)

			r, err = l.Exec(ctx, p.Name, "main", []string{"cat"}, strings.NewReader("through stdin\n"))
			if err != nil || r.ExitCode != 0 || string(r.Stdout) != "through stdin\n" {
				t.Fatalf("cat: %v, exit %d, stdout %q", err, r.ExitCode, r.Stdout)
			}

			// No route leaves the bridge: an address off it is unreachable at once, on every class.
			r, err = l.Exec(ctx, p.Name, "main", []string{"nc", "-w", "2", "1.1.1.1", "53"}, strings.NewReader(""))
			if err != nil || r.ExitCode == 0 || !strings.Contains(string(r.Stderr), "unreachable") {
				t.Fatalf("nc 1.1.1.1 53: %v, exit %d, stderr %q: want \"Network is unreachable\"", err, r.ExitCode, r.Stderr)
			}

			if rc != kubelab.RuntimeClassGVisor { // gVisor's netstack has its own table; the pod's Linux netns is the others'
				if !strings.HasPrefix(p.Status.PodIP, "10.250.0.") {
					t.Fatalf("pod IP %q, want one on the bridge's 10.250.0.0/24", p.Status.PodIP)
				}
				r, err = l.Exec(ctx, p.Name, "main", []string{"cat", "/proc/net/route"}, nil)
				if err != nil || r.ExitCode != 0 {
					t.Fatalf("cat /proc/net/route: %v, exit %d, %s", err, r.ExitCode, r.Stderr)
				}
				for _, line := range strings.Split(string(r.Stdout), "\n")[1:] {
					if f := strings.Fields(line); len(f) > 1 && f[1] == "00000000" {
						t.Fatalf("the pod has a default route: %s", bytes.TrimSpace(r.Stdout))
					}
				}
			}
		})
	}

	// The hardened shape a sandbox pod takes: non-root, no capabilities, seccomp RuntimeDefault,
	// read-only root, an emptyDir with a size limit, cpu/memory limits (Guaranteed QoS, whose
	// oom_score_adj these machines can only have through restrict_oom_score_adj).
	for _, rc := range []string{kubelab.RuntimeClassRunc, kubelab.RuntimeClassGVisor} {
		t.Run("hardened-"+rc, func(t *testing.T) {
			pod := kubelab.BusyboxPod("hard-"+rc, rc)
			uid, no, yes := int64(65534), false, true
			size := resource.MustParse("64Mi")
			pod.Spec.SecurityContext = &corev1.PodSecurityContext{
				RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: &yes,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			}
			pod.Spec.Volumes = []corev1.Volume{{Name: "ws", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &size}}}}
			c := &pod.Spec.Containers[0]
			c.SecurityContext = &corev1.SecurityContext{
				AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes,
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			}
			c.VolumeMounts = []corev1.VolumeMount{{Name: "ws", MountPath: "/workspace"}}
			limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("128Mi")}
			c.Resources = corev1.ResourceRequirements{Requests: limits, Limits: limits}
			p, err := l.RunPod(ctx, pod)
			if err != nil {
				t.Fatal(err)
			}
			if p.Status.QOSClass != corev1.PodQOSGuaranteed {
				t.Fatalf("QoS %s, want Guaranteed", p.Status.QOSClass)
			}
			script := `id -u; grep -E '^(CapEff|Seccomp):' /proc/self/status; touch /x 2>/dev/null && echo root-writable; ` +
				`echo ok > /workspace/f && cat /workspace/f`
			r, err := l.Exec(ctx, p.Name, "main", []string{"sh", "-c", script}, nil)
			if err != nil || r.ExitCode != 0 {
				t.Fatalf("exec: %v, exit %d, stderr %q", err, r.ExitCode, r.Stderr)
			}
			out := string(r.Stdout)
			t.Logf("%s hardened: %q", rc, out)
			if !strings.HasPrefix(out, "65534\n") || !strings.Contains(out, "CapEff:\t0000000000000000") ||
				strings.Contains(out, "root-writable") || !strings.HasSuffix(out, "ok\n") {
				t.Fatalf("want uid 65534, no capabilities, a read-only root and a writable /workspace; got %q", out)
			}
			if rc == kubelab.RuntimeClassRunc && !strings.Contains(out, "Seccomp:\t2") {
				t.Fatalf("runc pod without a seccomp filter: %q", out)
			}
		})
	}

	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-all"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
	if _, err := l.Client.NetworkingV1().NetworkPolicies(l.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := l.Client.NetworkingV1().NetworkPolicies(l.Namespace).Get(ctx, "deny-all", metav1.GetOptions{})
	if err != nil || len(got.Spec.PolicyTypes) != 2 {
		t.Fatalf("get the NetworkPolicy back: %v %+v", err, got)
	}
}

// TestPodsIsolated: the test cluster's bridge forwards nothing between pods (cni-isolate sets
// every pod's bridge port isolated; the bridge CNI enforces no NetworkPolicy), so a pod cannot
// reach another pod's listener, while the listener answers on the same address from inside its
// own pod (the positive control: it listens, and the address is right).
func TestPodsIsolated(t *testing.T) {
	l := kubelab.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := kubelab.BusyboxPod("listener", kubelab.RuntimeClassRunc)
	srv.Spec.Containers[0].Command = []string{"sh", "-c", "while true; do echo hi | nc -l -p 7777; done"}
	b, err := l.RunPod(ctx, srv)
	if err != nil {
		t.Fatal(err)
	}
	a, err := l.RunPod(ctx, kubelab.BusyboxPod("client", kubelab.RuntimeClassRunc))
	if err != nil {
		t.Fatal(err)
	}
	probe := []string{"sh", "-c", "nc -w 2 " + b.Status.PodIP + " 7777 </dev/null"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := l.Exec(ctx, b.Name, "main", probe, nil)
		if err == nil && strings.TrimSpace(string(r.Stdout)) == "hi" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the listener does not answer on %s:7777 from its own pod: %v %+v", b.Status.PodIP, err, r)
		}
		time.Sleep(200 * time.Millisecond)
	}
	r, err := l.Exec(ctx, a.Name, "main", probe, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(r.Stdout), "hi") {
		t.Fatalf("pod %s (%s) reached pod %s's listener at %s:7777 across the bridge", a.Name, a.Status.PodIP, b.Name, b.Status.PodIP)
	}
	t.Logf("pod %s → %s:7777: exit %d, stderr %q (refused, as wanted)", a.Status.PodIP, b.Status.PodIP, r.ExitCode, bytes.TrimSpace(r.Stderr))
}
