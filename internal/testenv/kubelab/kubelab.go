// Package kubelab gives tests the real single-node Kubernetes cluster that hack/k8s/cluster-up.sh
// starts (make test starts it and names its kubeconfig in AGENTBOX_TEST_KUBECONFIG): a client-go
// client, a namespace of the test's own that is deleted (and waited for) when the test ends, busybox
// pods on a RuntimeClass, exec over the WebSocket protocol with exit codes, and image import into
// the node (no registry). Tests using it skip only when AGENTBOX_TEST_KUBECONFIG is unset; a
// cluster that is named but unreachable fails them.
package kubelab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

// EnvKubeconfig names the environment variable holding the test cluster's kubeconfig path.
const EnvKubeconfig = "AGENTBOX_TEST_KUBECONFIG"

// What cluster-up.sh puts on the node.
const (
	// BusyboxImage is Debian's static busybox with its applets (imagePullPolicy Never).
	BusyboxImage = "localhost/busybox:local"
	// RuntimeClassRunc runs pods with runc (handler runc).
	RuntimeClassRunc = "runc"
	// RuntimeClassGVisor runs pods in gVisor with its own netstack (handler runsc).
	RuntimeClassGVisor = "gvisor"
	// RuntimeClassGVisorHostnet runs pods in gVisor with network=host: sockets live in the pod's
	// Linux network namespace, which pods/portforward needs (handler runsc-hostnet).
	RuntimeClassGVisorHostnet = "gvisor-hostnet"
	// LabelTest marks the namespaces kubelab creates.
	LabelTest = "agentbox.dev/kubelab"
)

// Bounds on what the lab waits for and keeps.
const (
	podStartTimeout = 2 * time.Minute
	nsDeleteTimeout = 2 * time.Minute
	// MaxExecOutput bounds each of an exec's stdout and stderr.
	MaxExecOutput = 4 << 20
)

// Lab is a connection to the test cluster and one namespace of the test's own.
type Lab struct {
	t          testing.TB
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
	Namespace  string
}

// Kubeconfig returns the test cluster's kubeconfig path, or "" when none is configured.
func Kubeconfig() string { return os.Getenv(EnvKubeconfig) }

// New connects to the test cluster and creates a namespace for the test (deleted, and waited for,
// by t.Cleanup). It skips when AGENTBOX_TEST_KUBECONFIG is unset and fails when the cluster named
// there does not answer.
func New(t testing.TB) *Lab {
	t.Helper()
	path := Kubeconfig()
	if path == "" {
		t.Skipf("%s is unset: no test cluster (make test starts one with hack/k8s/cluster-up.sh)", EnvKubeconfig)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("kubelab: %s=%s: %v", EnvKubeconfig, path, err)
	}
	cfg.Timeout = 30 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("kubelab: client: %v", err)
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Fatalf("kubelab: the cluster in %s does not answer: %v", path, err)
	}
	l := &Lab{t: t, Kubeconfig: path, Config: cfg, Client: cs}
	l.Namespace = l.CreateNamespace("kubelab")
	return l
}

// CreateNamespace creates a namespace named prefix-<random> labelled LabelTest and deletes it
// (waiting until it is gone, which removes its pods) when the test ends.
func (l *Lab) CreateNamespace(prefix string) string {
	l.t.Helper()
	var b [4]byte
	rand.Read(b[:])
	name := prefix + "-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelTest: "1"}}}
	if _, err := l.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		l.t.Fatalf("kubelab: create namespace %s: %v", name, err)
	}
	l.t.Cleanup(func() {
		if err := l.DeleteNamespace(name); err != nil {
			l.t.Error(err)
		}
	})
	return name
}

// DeleteNamespace deletes a namespace's pods at once (grace 0), then the namespace, and waits
// (bounded) until it is gone.
func (l *Lab) DeleteNamespace(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), nsDeleteTimeout)
	defer cancel()
	zero := int64(0)
	pods := l.Client.CoreV1().Pods(name)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubelab: delete the pods of %s: %w", name, err)
	}
	if err := l.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubelab: delete namespace %s: %w", name, err)
	}
	for {
		_, err := l.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubelab: namespace %s still exists after %v (last error %v)", name, nsDeleteTimeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// BusyboxPod returns a pod that runs `sleep 3600` from BusyboxImage on runtimeClass, with no
// service-account token, imagePullPolicy Never and a grace period of 0.
func BusyboxPod(name, runtimeClass string) *corev1.Pod {
	zero := int64(0)
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RuntimeClassName:              &runtimeClass,
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &zero,
			RestartPolicy:                 corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           BusyboxImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sleep", "3600"},
			}},
		},
	}
}

// RunPod creates pod in the lab's namespace and waits (bounded) until it runs.
func (l *Lab) RunPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	p, err := l.Client.CoreV1().Pods(l.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubelab: create pod %s: %w", pod.Name, err)
	}
	return l.WaitRunning(ctx, p.Name)
}

// WaitRunning waits (at most two minutes) until the pod's phase is Running, and fails early when
// it cannot get there (phase Failed/Succeeded, or a container waiting on an error such as
// ErrImageNeverPull or CreateContainerError).
func (l *Lab) WaitRunning(ctx context.Context, name string) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, podStartTimeout)
	defer cancel()
	var last *corev1.Pod
	for {
		p, err := l.Client.CoreV1().Pods(l.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			switch p.Status.Phase {
			case corev1.PodRunning:
				return p, nil
			case corev1.PodFailed, corev1.PodSucceeded:
				return nil, fmt.Errorf("kubelab: pod %s ended (%s): %s", name, p.Status.Phase, podSummary(p))
			}
			for _, cs := range p.Status.ContainerStatuses {
				if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
					return nil, fmt.Errorf("kubelab: pod %s cannot start: %s", name, podSummary(p))
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kubelab: pod %s not running: %w (last seen: %s)", name, ctx.Err(), podSummary(last))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func podSummary(p *corev1.Pod) string {
	if p == nil {
		return "never"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s", p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			fmt.Fprintf(&b, "; %s: %s", c.Type, c.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			fmt.Fprintf(&b, "; %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
		if x := cs.State.Terminated; x != nil {
			fmt.Fprintf(&b, "; %s terminated: %s exit %d %s", cs.Name, x.Reason, x.ExitCode, x.Message)
		}
	}
	return b.String()
}

// ExecResult is what one exec produced.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int
}

// Exec runs argv in the pod's container through the API server (pods/exec over WebSocket) with
// stdin when not nil, and returns its output (each stream at most MaxExecOutput) and exit code. A
// non-zero exit is a result, not an error.
func (l *Lab) Exec(ctx context.Context, pod, container string, argv []string, stdin io.Reader) (ExecResult, error) {
	req := l.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(l.Namespace).Name(pod).
		SubResource("exec").VersionedParams(&corev1.PodExecOptions{
		Container: container, Command: argv, Stdin: stdin != nil, Stdout: true, Stderr: true,
	}, scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(l.Config, "GET", req.URL().String())
	if err != nil {
		return ExecResult{}, fmt.Errorf("kubelab: exec %s: %w", pod, err)
	}
	stdout, stderr := &boundedBuffer{max: MaxExecOutput}, &boundedBuffer{max: MaxExecOutput}
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
	res := ExecResult{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	var code utilexec.CodeExitError
	switch {
	case errors.As(err, &code):
		res.ExitCode = code.Code
	case err != nil:
		return res, fmt.Errorf("kubelab: exec %v in %s: %w", argv, pod, err)
	}
	if stdout.over || stderr.over {
		return res, fmt.Errorf("kubelab: exec %v in %s: output over %d bytes", argv, pod, MaxExecOutput)
	}
	return res, nil
}

// boundedBuffer keeps the first max bytes written and notes that more came.
type boundedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.over = true
		b.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// Node says how to reach the node's containerd, from the env file cluster-up.sh writes beside
// the kubeconfig.
type Node struct {
	Ctr, ContainerdAddress string
}

// NodeAccess reads $STATE/env beside the kubeconfig; it fails when the kubeconfig is not one that
// hack/k8s/cluster-up.sh wrote on this machine.
func (l *Lab) NodeAccess() (Node, error) {
	path := filepath.Join(filepath.Dir(l.Kubeconfig), "env")
	f, err := os.Open(path)
	if err != nil {
		return Node{}, fmt.Errorf("kubelab: the node is not on this machine (no %s): %w", path, err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	n := Node{Ctr: filepath.Join(env["BIN"], "ctr"), ContainerdAddress: env["CONTAINERD_ADDRESS"]}
	if env["BIN"] == "" || n.ContainerdAddress == "" {
		return Node{}, fmt.Errorf("kubelab: %s lacks BIN or CONTAINERD_ADDRESS", path)
	}
	return n, nil
}

// ImportImage imports an image tarball (docker or OCI archive) into the node's containerd, in the
// k8s.io namespace the kubelet uses, so pods can run it with imagePullPolicy Never.
func (l *Lab) ImportImage(ctx context.Context, tarball string) error {
	n, err := l.NodeAccess()
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, n.Ctr, "-a", n.ContainerdAddress, "-n", "k8s.io", "images", "import", tarball).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubelab: ctr images import %s: %v: %s", tarball, err, bytes.TrimSpace(out))
	}
	return nil
}
