package kubernetes

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

func testInput() podInput {
	return podInput{ID: "sb-0123456789ab", Namespace: "ns1", Runtime: NameKernel, Instance: "inst1", Version: "0.1.0",
		Image: "python:3.12-slim", GuestImage: "localhost/agentbox-guest:0.1.0-abc", RuntimeClass: "gvisor",
		CPU: 1.5, MemoryMB: 512, DiskMB: 2048, Env: map[string]string{"B": "2", "A": "$(HOME)/x", "HOME": "/h"}}
}

func TestBuildPodIdentity(t *testing.T) {
	p := buildPod(testInput())
	if p.Name != "sb-0123456789ab" || p.Namespace != "ns1" || p.Spec.Hostname != p.Name {
		t.Fatalf("name %s/%s hostname %s", p.Namespace, p.Name, p.Spec.Hostname)
	}
	want := map[string]string{LabelManagedBy: "agentbox", LabelRole: "sandbox", LabelSandbox: p.Name, LabelRuntime: NameKernel}
	for k, v := range want {
		if p.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, p.Labels[k], v)
		}
	}
	if p.Annotations[AnnotationInstance] != "inst1" || p.Annotations[AnnotationVersion] != "0.1.0" {
		t.Errorf("annotations %v", p.Annotations)
	}
	if p.Spec.RuntimeClassName == nil || *p.Spec.RuntimeClassName != "gvisor" {
		t.Errorf("runtimeClassName %v", p.Spec.RuntimeClassName)
	}
	in := testInput()
	in.RuntimeClass = ""
	if p := buildPod(in); p.Spec.RuntimeClassName != nil {
		t.Errorf("no class configured, yet runtimeClassName %q", *p.Spec.RuntimeClassName)
	}
	// The NetworkPolicy selects exactly agentbox's sandbox pods.
	np := DenyAllPolicy("ns1")
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if p.Labels[k] != v {
			t.Errorf("the deny-all policy selects %s=%s, which the pod lacks", k, v)
		}
	}
	if len(np.Spec.Ingress) != 0 || len(np.Spec.Egress) != 0 || !slices.Contains(np.Spec.PolicyTypes, "Egress") || !slices.Contains(np.Spec.PolicyTypes, "Ingress") {
		t.Errorf("policy is not deny-all both ways: %+v", np.Spec)
	}
}

func TestBuildPodHardening(t *testing.T) {
	p := buildPod(testInput())
	s := p.Spec
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		t.Error("the service-account token is mounted")
	}
	if s.EnableServiceLinks == nil || *s.EnableServiceLinks {
		t.Error("service links are on")
	}
	if s.HostNetwork || s.HostPID || s.HostIPC || s.ShareProcessNamespace != nil {
		t.Error("the pod shares a host namespace or its process namespace")
	}
	if s.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restart policy %s", s.RestartPolicy)
	}
	if s.SecurityContext.SeccompProfile == nil || s.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("pod seccomp is not RuntimeDefault")
	}
	for _, c := range slices.Concat(s.InitContainers, s.Containers) {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged == nil || *sc.Privileged {
			t.Errorf("%s: privilege escalation or privileged", c.Name)
			continue
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: writable root", c.Name)
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s: capabilities not dropped: %+v", c.Name, sc.Capabilities)
		}
		for _, add := range sc.Capabilities.Add {
			if !slices.Contains(capsAdded, add) {
				t.Errorf("%s: adds %s, outside the minimal set", c.Name, add)
			}
		}
		if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: seccomp not RuntimeDefault", c.Name)
		}
		if slices.Contains(sc.Capabilities.Add, "SYS_ADMIN") || slices.Contains(sc.Capabilities.Add, "NET_RAW") {
			t.Errorf("%s: a dangerous capability", c.Name)
		}
	}
	main := s.Containers[0]
	// The main container's only writable places are its volumes; the binary is read-only.
	writable := map[string]bool{}
	for _, m := range main.VolumeMounts {
		if !m.ReadOnly {
			writable[m.MountPath] = true
		}
		if m.MountPath == "/.agentbox/bin" && !m.ReadOnly {
			t.Error("the agent's binary is writable in the sandbox")
		}
	}
	for _, want := range []string{"/workspace", "/home/agent", "/root", "/tmp", "/.agentbox/run"} {
		if !writable[want] {
			t.Errorf("%s is not a writable volume", want)
		}
	}
}

func TestBuildPodResourcesAndVolumes(t *testing.T) {
	p := buildPod(testInput())
	main := p.Spec.Containers[0]
	for _, rl := range []corev1.ResourceList{main.Resources.Requests, main.Resources.Limits} {
		if cpu := rl[corev1.ResourceCPU]; cpu.MilliValue() != 1500 {
			t.Errorf("cpu %s, want 1500m", cpu.String())
		}
		if mem := rl[corev1.ResourceMemory]; mem.Value() != 512<<20 {
			t.Errorf("memory %s, want 512Mi", mem.String())
		}
	}
	vols := map[string]corev1.Volume{}
	for _, v := range p.Spec.Volumes {
		vols[v.Name] = v
	}
	if d := vols["disk"].EmptyDir; d == nil || d.SizeLimit.Cmp(resource.MustParse("2Gi")) != 0 || d.Medium != "" {
		t.Errorf("disk volume %+v, want a 2Gi emptyDir on disk", vols["disk"].EmptyDir)
	}
	if tmp := vols["tmp"].EmptyDir; tmp == nil || tmp.Medium != corev1.StorageMediumMemory || tmp.SizeLimit.Value() != 128<<20 {
		t.Errorf("tmp volume %+v, want a 128Mi memory emptyDir (a quarter of memory)", vols["tmp"].EmptyDir)
	}
	// Unlimited cpu and memory: no requests or limits for them; disk 0 takes the default.
	in := testInput()
	in.CPU, in.MemoryMB, in.DiskMB = 0, 0, 0
	q := buildPod(in)
	if len(q.Spec.Containers[0].Resources.Limits) != 0 {
		t.Errorf("limits %v for an unlimited sandbox", q.Spec.Containers[0].Resources.Limits)
	}
	for _, v := range q.Spec.Volumes {
		if v.Name == "disk" && v.EmptyDir.SizeLimit.Value() != defaultDiskMB<<20 {
			t.Errorf("default disk %s", v.EmptyDir.SizeLimit)
		}
	}
}

func TestBuildPodCommandAndEnv(t *testing.T) {
	p := buildPod(testInput())
	main := p.Spec.Containers[0]
	if main.Image != "python:3.12-slim" || main.Command[0] != GuestBinaryPath || main.Command[1] != "guest" {
		t.Fatalf("main container %s %q", main.Image, main.Command)
	}
	if !slices.Contains(main.Command, GuestSocketPath) || !slices.Contains(main.Command, "1000:1000") {
		t.Errorf("command %q lacks the socket or the agent user", main.Command)
	}
	// The agent caps RLIMIT_FSIZE at the disk's size (a pod has no rlimit field).
	if i := slices.Index(main.Command, "--fsize-mb"); i < 0 || i+1 >= len(main.Command) || main.Command[i+1] != strconv.FormatInt(testInput().DiskMB, 10) {
		t.Errorf("command %q does not pass --fsize-mb %d", main.Command, testInput().DiskMB)
	}
	init := p.Spec.InitContainers[0]
	if init.Image != "localhost/agentbox-guest:0.1.0-abc" || init.Command[0] != "/agentbox" || init.Command[1] != "guest-install" {
		t.Errorf("init container %s %q", init.Image, init.Command)
	}
	var names []string
	got := map[string]string{}
	for _, e := range main.Env {
		names = append(names, e.Name)
		got[e.Name] = e.Value
	}
	if !slices.IsSorted(names) {
		t.Errorf("env not sorted: %v", names)
	}
	// The spec wins over the defaults; $ is escaped from the kubelet's $(VAR) expansion.
	if got["HOME"] != "/h" || got["TERM"] != "xterm" || got["B"] != "2" || got["A"] != "$$(HOME)/x" {
		t.Errorf("env %v", got)
	}
	for _, arg := range slices.Concat(main.Command, init.Command) {
		if strings.Contains(arg, "$(") {
			t.Errorf("argument %q would be expanded by the kubelet", arg)
		}
	}
}

func TestPodStatus(t *testing.T) {
	mk := func(phase corev1.PodPhase, mainTerminated bool) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: phase}}
		st := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
		if mainTerminated {
			st = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}
		}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, State: st}}
		return p
	}
	cases := []struct {
		pod  *corev1.Pod
		want runtime.Status
	}{
		{mk(corev1.PodPending, false), runtime.StatusCreated},
		{mk(corev1.PodRunning, false), runtime.StatusRunning},
		{mk(corev1.PodRunning, true), runtime.StatusStopped},
		{mk(corev1.PodFailed, true), runtime.StatusStopped},
		{mk(corev1.PodSucceeded, true), runtime.StatusStopped},
	}
	for i, c := range cases {
		if got := podStatus(c.pod); got != c.want {
			t.Errorf("case %d (%s): %s, want %s", i, c.pod.Status.Phase, got, c.want)
		}
	}
}

// TestUnschedulable: a pending pod the scheduler found no node for is recognised with the
// scheduler's message; one still being scheduled, or already bound, is not.
func TestUnschedulable(t *testing.T) {
	msg := "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
	cond := func(status corev1.ConditionStatus, reason string) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: status, Reason: reason, Message: msg}}
		return p
	}
	if got, ok := unschedulable(cond(corev1.ConditionFalse, corev1.PodReasonUnschedulable)); !ok || got != msg {
		t.Errorf("unschedulable pod: %q, %v", got, ok)
	}
	bound := cond(corev1.ConditionFalse, corev1.PodReasonUnschedulable)
	bound.Spec.NodeName = "node-1"
	for name, p := range map[string]*corev1.Pod{"scheduled": cond(corev1.ConditionTrue, ""), "bound": bound,
		"gated": cond(corev1.ConditionFalse, corev1.PodReasonSchedulingGated), "new": {Status: corev1.PodStatus{Phase: corev1.PodPending}}} {
		if got, ok := unschedulable(p); ok {
			t.Errorf("%s pod taken for unschedulable: %q", name, got)
		}
	}
}

// TestSpecRefusals: what the runtime cannot honour is INVALID_ARGUMENT before any I/O.
func TestSpecRefusals(t *testing.T) {
	r := &Runtime{cfg: Config{Name: NameProcess, Namespace: "ns", GuestImage: "g"}, caps: runtime.Capabilities{Available: true,
		Name: NameProcess, NetworkModes: []string{runtime.NetworkNone}, Images: []string{runtime.ImageRef}}}
	for name, spec := range map[string]runtime.Spec{
		"egress":   {ID: "sb-000000000001", Image: "busybox", Network: runtime.NetworkEgress},
		"host":     {ID: "sb-000000000001", Image: "host"},
		"rootfs":   {ID: "sb-000000000001", Image: "busybox", Rootfs: &runtime.Rootfs{}},
		"env name": {ID: "sb-000000000001", Image: "busybox", Env: map[string]string{"A=B": "x"}},
	} {
		if _, err := r.Create(context.Background(), spec); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
		}
	}
	r.caps.Available, r.caps.Reason = false, "no cluster"
	if _, err := r.Run(context.Background(), runtime.Spec{ID: "sb-000000000001", Image: "busybox"}); !errcode.Is(err, errcode.RuntimeUnavailable) {
		t.Errorf("unavailable runtime: %v, want RUNTIME_UNAVAILABLE", err)
	}
}

func TestGuestImageTag(t *testing.T) {
	bin := t.TempDir() + "/agentbox"
	if err := writeFile(bin, "binary one"); err != nil {
		t.Fatal(err)
	}
	a, err := GuestImageTag("0.1.0+dev", bin)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a, GuestImageRepo+":0.1.0-dev-") || len(a) != len(GuestImageRepo+":0.1.0-dev-")+12 {
		t.Fatalf("tag %q", a)
	}
	if err := writeFile(bin, "binary two"); err != nil {
		t.Fatal(err)
	}
	if b, _ := GuestImageTag("0.1.0+dev", bin); b == a {
		t.Fatalf("two binaries share tag %q", a)
	}
}

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }

// TestBuildPodImageVolume: with the image-volume delivery the guest image is a read-only image
// volume at the binary's directory, there is no init container, and the entrypoint prepares the
// disk's directories before it execs the same agent command.
func TestBuildPodImageVolume(t *testing.T) {
	in := testInput()
	init := buildPod(in)
	in.Delivery = DeliveryImageVolume
	p := buildPod(in)
	if len(p.Spec.InitContainers) != 0 {
		t.Fatalf("init containers %v", p.Spec.InitContainers)
	}
	v := p.Spec.Volumes[0]
	if v.Name != "guest" || v.Image == nil || v.Image.Reference != in.GuestImage || v.EmptyDir != nil {
		t.Fatalf("guest volume %+v", v)
	}
	main := p.Spec.Containers[0]
	for _, m := range main.VolumeMounts {
		if m.Name == "guest" && (!m.ReadOnly || m.MountPath != "/.agentbox/bin") {
			t.Errorf("guest mount %+v", m)
		}
	}
	want := append([]string{GuestBinaryPath, "guest-kube", "--uid", "1000", "--"}, init.Spec.Containers[0].Command[1:]...)
	if !slices.Equal(main.Command, want) {
		t.Fatalf("command %q, want %q", main.Command, want)
	}
}
