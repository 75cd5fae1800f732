//go:build linux

// Package kubetest is the kubernetes runtime's test cluster as tests and the bench see it: the
// cluster AGENTBOX_TEST_KUBECONFIG names (make test brings up hack/k8s's), its node's
// containerd (images reach the node without a registry: ctr imports them), a namespace of a
// test's own, and a way to kill a sandbox's container behind the runtime's back. The node's
// containerd socket and ctr come from the env file beside the kubeconfig (hack/k8s's
// cluster-up.sh writes CONTAINERD_ADDRESS and BIN there), or AGENTBOX_TEST_CONTAINERD_ADDRESS and
// AGENTBOX_TEST_CTR.
package kubetest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes"
)

// EnvKubeconfig names the test cluster's kubeconfig.
const EnvKubeconfig = "AGENTBOX_TEST_KUBECONFIG"

// Lab is the test cluster with the test images imported into its node.
type Lab struct {
	Kubeconfig string
	REST       *rest.Config
	Client     k8s.Interface
	Containerd string // the node's containerd socket
	Ctr        string // the ctr binary
	// GuestImage is the agent (the agentbox binary the lab was opened with); HostImage a
	// busybox image with root and the agent user (uid 1000) that image "host" runs in tests.
	GuestImage, HostImage string
	http                  *http.Client
}

// Close closes the lab's idle connections to the API server (a leak check then finds none).
func (l *Lab) Close() { utilnet.CloseIdleConnectionsFor(l.http.Transport) }

// Open finds the cluster of kubeconfig and imports the guest image of the agent binary bin (agentbox-guest) and
// the busybox host image into its node.
func Open(kubeconfig, bin string) (*Lab, error) {
	l := &Lab{Kubeconfig: kubeconfig, Containerd: os.Getenv("AGENTBOX_TEST_CONTAINERD_ADDRESS"), Ctr: os.Getenv("AGENTBOX_TEST_CTR")}
	envFile := filepath.Join(filepath.Dir(kubeconfig), "env")
	if f, err := os.Open(envFile); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), "=")
			v = strings.Trim(v, `"'`)
			switch {
			case k == "CONTAINERD_ADDRESS" && l.Containerd == "":
				l.Containerd = v
			case k == "BIN" && l.Ctr == "":
				l.Ctr = filepath.Join(v, "ctr")
			}
		}
		f.Close()
	}
	if l.Containerd == "" || l.Ctr == "" {
		return nil, fmt.Errorf("no containerd socket or ctr for the cluster of %s: write CONTAINERD_ADDRESS and BIN to %s, or set AGENTBOX_TEST_CONTAINERD_ADDRESS and AGENTBOX_TEST_CTR", kubeconfig, envFile)
	}
	var err error
	if l.REST, err = kubernetes.RESTConfigFor(kubeconfig, ""); err != nil {
		return nil, err
	}
	if l.http, err = rest.HTTPClientFor(l.REST); err != nil {
		return nil, err
	}
	if l.Client, err = k8s.NewForConfigAndClient(l.REST, l.http); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "agentbox-kubetest-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if l.GuestImage, err = kubernetes.GuestImageTag("test", bin); err != nil {
		return nil, err
	}
	guestTar := filepath.Join(dir, "guest.tar")
	if err := kubernetes.WriteGuestImage(bin, l.GuestImage, guestTar); err != nil {
		return nil, err
	}
	l.HostImage = "localhost/agentbox-test-host:1"
	hostTar := filepath.Join(dir, "host.tar")
	if err := writeHostImage(dir, l.HostImage, hostTar); err != nil {
		return nil, err
	}
	for _, tar := range []string{guestTar, hostTar} {
		if err := l.Import(tar); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Import imports an image tarball into the node.
func (l *Lab) Import(tar string) error {
	if out, err := exec.Command(l.Ctr, "-a", l.Containerd, "-n", "k8s.io", "images", "import", tar).CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images import %s: %v: %s", tar, err, out)
	}
	return nil
}

// writeHostImage writes a busybox image: /bin/busybox and its applets, root and the agent user.
func writeHostImage(dir, tag, out string) error {
	bb := "/bin/busybox"
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list (apt-get install busybox-static): %v", err)
	}
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(group, []byte("root:x:0:\nagent:x:1000:\n"), 0o644); err != nil {
		return err
	}
	files := []kubernetes.ImageFile{{Path: "/bin/busybox", Source: bb, Mode: 0o755},
		{Path: "/etc/passwd", Source: passwd, Mode: 0o644}, {Path: "/etc/group", Source: group, Mode: 0o644}}
	for _, a := range strings.Fields(string(list)) {
		if a != "busybox" {
			files = append(files, kubernetes.ImageFile{Path: "/bin/" + a, Link: "busybox"})
		}
	}
	return kubernetes.WriteImage(out, tag, files, []string{"/bin/sh"})
}

// Namespace makes namespace prefix-<hex>, waits for its default service account (pods need
// it), and returns it with a function that deletes it and everything in it.
func (l *Lab) Namespace(ctx context.Context, prefix string) (string, func() error, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	ns := prefix + "-" + hex.EncodeToString(b[:])
	if _, err := l.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return "", nil, fmt.Errorf("create namespace %s: %w", ns, err)
	}
	del := func() error {
		zero := int64(0)
		err := l.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := l.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return ns, del, nil
		}
		if time.Now().After(deadline) {
			_ = del()
			return "", nil, fmt.Errorf("namespace %s has no default service account after 30 s: %w", ns, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Runtime makes a kubernetes runtime on namespace ns with the lab's images.
func (l *Lab) Runtime(ctx context.Context, ns string, isolation runtime.Isolation, class string) (*kubernetes.Runtime, error) {
	return l.RuntimeWith(ctx, l.Config(ns, isolation, class))
}

// Config is the configuration Runtime uses, for a test to change before RuntimeWith.
func (l *Lab) Config(ns string, isolation runtime.Isolation, class string) kubernetes.Config {
	return kubernetes.Config{RESTConfig: l.REST, Namespace: ns, Isolation: isolation, RuntimeClass: class,
		GuestImage: l.GuestImage, HostImage: l.HostImage, PullNever: true, Version: "test"}
}

// RuntimeWith makes a runtime of cfg and checks that it is available.
func (l *Lab) RuntimeWith(ctx context.Context, cfg kubernetes.Config) (*kubernetes.Runtime, error) {
	ns := cfg.Namespace
	rt, err := kubernetes.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if caps := rt.Capabilities(); !caps.Available {
		return nil, fmt.Errorf("runtime %s on %s is not available: %s", rt.Name(), ns, caps.Reason)
	}
	return rt, nil
}

// Kill SIGKILLs the sandbox container of pod id in ns through the node's containerd, as a crash
// would.
func (l *Lab) Kill(ctx context.Context, ns, id string) error {
	p, err := l.Client.CoreV1().Pods(ns).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		return err
	}
	cid := ""
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == kubernetes.ContainerName {
			_, cid, _ = strings.Cut(cs.ContainerID, "://")
		}
	}
	if cid == "" {
		return fmt.Errorf("pod %s/%s: its container has no id yet", ns, id)
	}
	if out, err := exec.Command(l.Ctr, "-a", l.Containerd, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", cid).CombinedOutput(); err != nil {
		return fmt.Errorf("ctr tasks kill %s: %v: %s", cid, err, out)
	}
	return nil
}
