//go:build linux

package e2e

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes/kubetest"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// kubeServer starts `agentbox serve --runtime kubernetes` on the test cluster
// (AGENTBOX_TEST_KUBECONFIG; the test skips when it is unset) in a namespace of the test's own,
// deleted when it ends; image "host" is the lab's busybox image.
func kubeServer(t *testing.T) (*kubetest.Lab, string, func(dir string) *server) {
	t.Helper()
	kc := os.Getenv(kubetest.EnvKubeconfig)
	if kc == "" {
		t.Skip("AGENTBOX_TEST_KUBECONFIG is unset: no cluster for the kubernetes runtime (make test brings one up)")
	}
	testenv.RequireRoot(t)
	lab, err := kubetest.Open(kc, testenv.GuestBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lab.Close) // last: after the namespace's deletion
	ns, del, err := lab.Namespace(context.Background(), "ab-kuberuntime-e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := del(); err != nil {
			t.Errorf("delete namespace %s: %v", ns, err)
		}
	})
	start := func(dir string) *server {
		return startServer(t, dir, "--runtime", "kubernetes", "--kube-config", kc, "--kube-namespace", ns,
			"--kube-guest-image", lab.GuestImage, "--kube-host-image", lab.HostImage)
	}
	return lab, ns, start
}

// TestKubeREST: create → exec → files → destroy through REST on runtime kubernetes, and the
// kernel class through requirements; the pod is what the record says and goes with the destroy.
func TestKubeREST(t *testing.T) {
	lab, ns, start := kubeServer(t)
	s := start(testenv.ShortTempDir(t, "abkube"))
	ctx := context.Background()
	c := s.client()
	sb, err := c.Create(ctx, wire.CreateRequest{CPU: 0.5, MemoryMB: 256})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, s.Logs)
	}
	if sb.Runtime != kubernetes.NameProcess || sb.Node != "kube:"+ns || sb.State != wire.StateRunning {
		t.Fatalf("created %+v", sb)
	}
	pod, err := lab.Client.CoreV1().Pods(ns).Get(ctx, sb.ID, metav1.GetOptions{})
	if err != nil || pod.Labels[kubernetes.LabelSandbox] != sb.ID || *pod.Spec.RuntimeClassName != "runc" {
		t.Fatalf("the sandbox's pod: %v %+v", err, pod)
	}
	res, err := c.Exec(ctx, sb.ID, apiExec("sh", "-c", "echo hello $(id -u) > /workspace/a.txt && cat /workspace/a.txt"), nil)
	if err != nil || res.ExitCode != 0 || res.Stdout != "hello 1000\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/workspace/b.txt", 0o644, strings.NewReader("uploaded")); err != nil {
		t.Fatalf("write file: %v", err)
	}
	rc, _, err := c.ReadFile(ctx, sb.ID, "/workspace/b.txt", 0, -1)
	if err != nil {
		t.Fatalf("read file: %v", err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "uploaded" {
		t.Fatalf("read back %q", b)
	}
	// Kernel isolation asked for: the gVisor class.
	gv, err := c.Create(ctx, wire.CreateRequest{Requirements: wire.Requirements{Isolation: "kernel"}})
	if err != nil {
		t.Fatalf("create with kernel isolation: %v", err)
	}
	if gv.Runtime != kubernetes.NameKernel || gv.Isolation != "kernel" {
		t.Fatalf("kernel create: %+v", gv)
	}
	if res, err := c.Exec(ctx, gv.ID, apiExec("uname", "-n"), nil); err != nil || strings.TrimSpace(res.Stdout) != gv.ID {
		t.Fatalf("exec under gVisor: %+v %v", res, err)
	}
	for _, id := range []string{sb.ID, gv.ID} {
		if _, err := c.Destroy(ctx, id); err != nil {
			t.Fatalf("destroy %s: %v", id, err)
		}
		waitPodGone(t, lab, ns, id)
	}
	// An OCI image reference passes through to the cluster (no local pull): one the node lacks
	// fails the create (the kubelet's reason in the server's log), and leaves no pod.
	began := time.Now()
	if _, err = c.Create(ctx, wire.CreateRequest{Image: "localhost/agentbox-absent:1"}); err == nil {
		t.Fatal("create of an image the node lacks succeeded")
	} else if !strings.Contains(err.Error(), "ErrImage") && !strings.Contains(err.Error(), "ImagePullBackOff") {
		t.Errorf("the create's error does not say why the pod did not start: %v", err)
	}
	// The kubelet's reason ends the create's wait for the agent at once (the server's ready
	// timeout on this runtime is minutes, for real pulls).
	if took := time.Since(began); took > time.Minute {
		t.Errorf("the failed create took %v", took)
	} else {
		t.Logf("the create of an absent image failed in %v: %v", took.Round(time.Millisecond), err)
	}
	if logs := s.Logs.String(); !strings.Contains(logs, "ErrImage") && !strings.Contains(logs, "ImagePullBackOff") {
		t.Errorf("the server's log does not say why the pod did not start:\n%s", logs)
	}
	pods, _ := lab.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelRuntime})
	if len(pods.Items) != 0 {
		t.Fatalf("pods left after the destroys and a failed create: %d", len(pods.Items))
	}
}

// TestKubeReconcile: a pod deleted behind the server's back makes its sandbox lost; after a
// SIGKILL of the server and a restart, the running sandbox is adopted and answers, and a pod
// of agentbox's with no record is deleted.
func TestKubeReconcile(t *testing.T) {
	lab, ns, start := kubeServer(t)
	dir := testenv.ShortTempDir(t, "abkube")
	s := start(dir)
	ctx := context.Background()
	c := s.client()
	gone, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, s.Logs)
	}
	kept, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	zero := int64(0)
	if err := lab.Client.CoreV1().Pods(ns).Delete(ctx, gone.ID, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, gone.ID, wire.StateLost, 30*time.Second)

	if _, err := c.Exec(ctx, kept.ID, apiExec("sh", "-c", "echo kept > /workspace/state.txt"), nil); err != nil {
		t.Fatal(err)
	}
	s.kill()
	// A pod of agentbox's that no record names (a create whose record was lost).
	orphan := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sb-0000000000aa", Labels: map[string]string{
		kubernetes.LabelManagedBy: "agentbox", kubernetes.LabelRole: "sandbox", kubernetes.LabelSandbox: "sb-0000000000aa",
		kubernetes.LabelRuntime: kubernetes.NameProcess}},
		Spec: corev1.PodSpec{AutomountServiceAccountToken: new(bool), Containers: []corev1.Container{{Name: "sandbox", Image: lab.HostImage,
			ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"}}}}}
	if _, err := lab.Client.CoreV1().Pods(ns).Create(ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s2 := start(dir)
	c2 := s2.client()
	if sb, err := c2.Get(ctx, kept.ID); err != nil || sb.State != wire.StateRunning {
		t.Fatalf("after restart: %+v %v\n%s", sb, err, s2.Logs)
	}
	if res, err := c2.Exec(ctx, kept.ID, apiExec("cat", "/workspace/state.txt"), nil); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("exec after restart: %+v %v", res, err)
	}
	waitPodGone(t, lab, ns, orphan.Name)
	if _, err := c2.Destroy(ctx, kept.ID); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, lab, ns, kept.ID)
}

func waitState(t *testing.T, c *client.Client, id string, want wire.State, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		sb, err := c.Get(context.Background(), id)
		if err == nil && sb.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: %+v %v, want state %s within %s", id, sb, err, want, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitPodGone(t *testing.T, lab *kubetest.Lab, ns, name string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := lab.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s still there after 60 s (%v)", ns, name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestKubeCLI: the README's CLI loop against `serve --runtime kubernetes`: create, exec with
// stdin, as root, cp in and out, ls, rm; a snapshot is UNSUPPORTED_OPERATION saying why.
func TestKubeCLI(t *testing.T) {
	_, _, start := kubeServer(t)
	s := start(testenv.ShortTempDir(t, "abkube"))
	out, errOut, code := s.cli("", "sandbox", "create")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sb-") {
		t.Fatalf("create: %d %q %q\n%s", code, out, errOut, s.Logs)
	}
	if out, errOut, code := s.cli("hello\n", "exec", id, "--", "cat"); code != 0 || out != "hello\n" {
		t.Fatalf("exec with stdin: %d %q %q", code, out, errOut)
	}
	if out, _, code := s.cli("", "exec", "--user", "root", id, "--", "id", "-un"); code != 0 || out != "root\n" {
		t.Fatalf("exec as root: %d %q", code, out)
	}
	if out, _, code := s.cli("", "exec", id, "--", "sh", "-c", "exit 3"); code != 3 {
		t.Fatalf("exit code: %d %q", code, out)
	}
	dir := t.TempDir()
	local := dir + "/notes.txt"
	if err := os.WriteFile(local, []byte("twelve bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := s.cli("", "cp", local, id+":/workspace/notes.txt"); code != 0 {
		t.Fatalf("cp in: %d %q", code, errOut)
	}
	if _, errOut, code := s.cli("", "exec", id, "--", "sh", "-c", "wc -c < notes.txt > out.txt"); code != 0 {
		t.Fatalf("exec: %d %q", code, errOut)
	}
	if _, errOut, code := s.cli("", "cp", id+":/workspace/out.txt", dir+"/out.txt"); code != 0 {
		t.Fatalf("cp out: %d %q", code, errOut)
	}
	if b, _ := os.ReadFile(dir + "/out.txt"); strings.TrimSpace(string(b)) != "12" {
		t.Fatalf("out.txt %q", b)
	}
	if out, _, code := s.cli("", "sandbox", "ls"); code != 0 || !strings.Contains(out, id) {
		t.Fatalf("ls: %d %q", code, out)
	}
	if _, errOut, code := s.cli("", "snapshot", id); code == 0 || !strings.Contains(errOut, "UNSUPPORTED_OPERATION") {
		t.Fatalf("snapshot on kubernetes: %d %q, want UNSUPPORTED_OPERATION", code, errOut)
	}
	if _, errOut, code := s.cli("", "sandbox", "rm", id); code != 0 {
		t.Fatalf("rm: %d %q", code, errOut)
	}
}
