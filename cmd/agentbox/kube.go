package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes/tunnel"
	"github.com/agentbox/agentbox/internal/version"
)

// cmdGuestTunnel (hidden) is the pod side of the kubernetes runtime's agent tunnel: exec'd in a
// sandbox's container, it serves a yamux session on stdin and stdout and bridges each stream to
// the agent's socket, refusing a socket whose peer is not the agent (PID 1).
func cmdGuestTunnel(args []string) int {
	fs := flag.NewFlagSet("guest-tunnel", flag.ContinueOnError)
	socket := fs.String("socket", kubernetes.GuestSocketPath, "the agent's unix socket")
	peer := fs.Int("peer-pid", 1, "the pid that must hold the socket's other end (0: any)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := tunnel.Serve(ctx, tunnel.StdioConn{In: os.Stdin, Out: os.Stdout}, tunnel.ServerConfig{Socket: *socket, PeerPID: int32(*peer), Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentbox guest-tunnel:", err)
		return 1
	}
	return 0
}

// cmdGuestInstall (hidden) is the kubernetes runtime's init container: it copies this binary to
// --binary (the volume the sandbox's container runs it from) and makes the sandbox's disk
// directories with the owners and modes the local runtimes give them.
func cmdGuestInstall(args []string) int {
	fs := flag.NewFlagSet("guest-install", flag.ContinueOnError)
	dst := fs.String("binary", kubernetes.GuestBinaryPath, "where to copy the agentbox binary")
	disk := fs.String("disk", "", "the disk volume: run, root, workspace and home are made in it")
	uid := fs.Int("uid", kubernetes.AgentUID, "the agent user's uid (and gid): owner of workspace and home")
	tmp := fs.String("tmp", "", "a /tmp volume to make world-writable and sticky")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := guestInstall(*dst, *disk, *tmp, *uid); err != nil {
		fmt.Fprintln(os.Stderr, "agentbox guest-install:", err)
		return 1
	}
	return 0
}

func guestInstall(dst, disk, tmp string, uid int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	src, err := os.Open(self)
	if err != nil {
		return err
	}
	defer src.Close()
	part := dst + ".part"
	out, err := os.OpenFile(part, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o555)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		return fmt.Errorf("copy to %s: %w", part, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Rename(part, dst); err != nil {
		return err
	}
	if disk != "" {
		for _, d := range []struct {
			name     string
			mode     os.FileMode
			uid, gid int
		}{{"run", 0o700, 0, 0}, {"root", 0o700, 0, 0}, {"workspace", 0o755, uid, uid}, {"home", 0o755, uid, uid}} {
			p := filepath.Join(disk, d.name)
			if err := os.Mkdir(p, d.mode); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
			if err := os.Lchown(p, d.uid, d.gid); err != nil {
				return err
			}
			if err := os.Chmod(p, d.mode); err != nil {
				return err
			}
		}
	}
	if tmp != "" {
		if err := os.Chmod(tmp, 0o777|os.ModeSticky); err != nil {
			return err
		}
	}
	return nil
}

// cmdKubeGuestImage writes the guest image of this binary (what the kubernetes runtime's pods
// take the agent from) as a tarball to import into the cluster's nodes or push to a registry
// they reach, and prints its reference (serve's --kube-guest-image default for this binary).
func cmdKubeGuestImage(args []string) int {
	fs := flag.NewFlagSet("kube-guest-image", flag.ContinueOnError)
	out := fs.String("o", "agentbox-guest.tar", "the tarball to write")
	tag := fs.String("tag", "", "the image reference (default: "+kubernetes.GuestImageRepo+":<version>-<binary hash>)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	self, err := os.Executable()
	if err == nil && *tag == "" {
		*tag, err = kubernetes.GuestImageTag(version.Version, self)
	}
	if err == nil {
		err = kubernetes.WriteGuestImage(self, *tag, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentbox kube-guest-image:", err)
		return 1
	}
	fmt.Println(*tag)
	return 0
}

// registerKubeFlags adds serve's kubernetes runtime flags.
func registerKubeFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.StringVar(&cfg.KubeConfig, "kube-config", "", "kubeconfig of the cluster for --runtime kubernetes (default: the in-cluster config of a server in a pod)")
	fs.StringVar(&cfg.KubeContext, "kube-context", "", "the kubeconfig's context (default: its current one)")
	fs.StringVar(&cfg.KubeNamespace, "kube-namespace", cfg.KubeNamespace, "namespace of the sandboxes' pods")
	fs.StringVar(&cfg.KubeRuntimeClassProcess, "kube-runtime-class-process", cfg.KubeRuntimeClassProcess, `RuntimeClass of runtime kubernetes (process isolation; "" = the cluster's default handler)`)
	fs.StringVar(&cfg.KubeRuntimeClassKernel, "kube-runtime-class-kernel", cfg.KubeRuntimeClassKernel, `RuntimeClass of runtime kubernetes-gvisor (kernel isolation; "" = not offered)`)
	fs.StringVar(&cfg.KubeGuestImage, "kube-guest-image", "", "image the pods take the agentbox binary from (default: "+kubernetes.GuestImageRepo+":<version>-<hash of this binary>, as agentbox kube-guest-image writes it)")
	fs.StringVar(&cfg.KubeHostImage, "kube-host-image", "", `image that sandboxes of image "host" run on the cluster (default: image "host" is not offered there)`)
	fs.StringVar(&cfg.KubeNodeName, "kube-node-name", "", "pin sandbox pods to this node (default: the scheduler places them)")
	fs.StringVar(&cfg.KubeGuestDelivery, "kube-guest-delivery", kubernetes.DeliveryImageVolume, "how the agent gets into pods: image-volume (the guest image mounted read-only; Kubernetes ≥ 1.35, containerd ≥ 2.1) or init-container (copied into an emptyDir; any cluster)")
}

// cmdGuestKube (hidden) is the entrypoint of a sandbox pod whose agent comes from an image
// volume: as root, it gives the disk's directories (mounted by the kubelet, root's) the owners
// and modes the local runtimes give them, then execs the agent with the arguments after "--"
// (so the agent stays PID 1).
func cmdGuestKube(args []string) int {
	fs := flag.NewFlagSet("guest-kube", flag.ContinueOnError)
	uid := fs.Int("uid", kubernetes.AgentUID, "the agent user's uid (and gid): owner of /workspace and /home/agent")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rest := fs.Args()
	if len(rest) == 0 || rest[0] != "guest" {
		fmt.Fprintln(os.Stderr, "agentbox guest-kube: usage: guest-kube [--uid N] -- guest ARGS...")
		return 2
	}
	if err := prepareKubeDirs(*uid); err != nil {
		fmt.Fprintln(os.Stderr, "agentbox guest-kube:", err)
		return 1
	}
	self, err := os.Executable()
	if err == nil {
		err = syscall.Exec(self, append([]string{self}, rest...), os.Environ())
	}
	fmt.Fprintln(os.Stderr, "agentbox guest-kube: exec the agent:", err)
	return 1
}

// prepareKubeDirs sets the owners and modes of a sandbox pod's writable directories.
func prepareKubeDirs(uid int) error {
	for _, d := range []struct {
		path     string
		mode     os.FileMode
		uid, gid int
	}{
		{kubernetes.GuestRunDir, 0o700, 0, 0}, {"/root", 0o700, 0, 0},
		{"/workspace", 0o755, uid, uid}, {"/home/agent", 0o755, uid, uid},
		{"/tmp", 0o777 | os.ModeSticky, 0, 0},
	} {
		if err := os.Lchown(d.path, d.uid, d.gid); err != nil {
			return err
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return err
		}
	}
	return nil
}
