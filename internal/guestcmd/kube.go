package guestcmd

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

	"github.com/agentbox/agentbox/internal/runtime/kubernetes/podpath"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes/tunnel"
)

// Tunnel (guest-tunnel) is the pod side of the kubernetes runtime's agent tunnel: exec'd in a
// sandbox's container, it serves a yamux session on stdin and stdout and bridges each stream to
// the agent's socket, refusing a socket whose peer is not the agent (PID 1).
func Tunnel(args []string) int {
	fs := flag.NewFlagSet("guest-tunnel", flag.ContinueOnError)
	socket := fs.String("socket", podpath.Socket, "the agent's unix socket")
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

// Install (guest-install) is the kubernetes runtime's init container: it copies this binary
// (the guest image's: the lean agent) to --binary (the volume the sandbox's container runs it
// from) and makes the sandbox's disk directories with the owners and modes the local runtimes
// give them.
func Install(args []string) int {
	fs := flag.NewFlagSet("guest-install", flag.ContinueOnError)
	dst := fs.String("binary", podpath.Binary, "where to copy the agent binary")
	disk := fs.String("disk", "", "the disk volume: run, root, workspace and home are made in it")
	uid := fs.Int("uid", podpath.AgentUID, "the agent user's uid (and gid): owner of workspace and home")
	tmp := fs.String("tmp", "", "a /tmp volume to make world-writable and sticky")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := install(*dst, *disk, *tmp, *uid); err != nil {
		fmt.Fprintln(os.Stderr, "agentbox guest-install:", err)
		return 1
	}
	return 0
}

func install(dst, disk, tmp string, uid int) error {
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

// Kube (guest-kube) is the entrypoint of a sandbox pod whose agent comes from an image volume:
// as root, it gives the disk's directories (mounted by the kubelet, root's) the owners and
// modes the local runtimes give them, then execs the agent with the arguments after "--" (so
// the agent stays PID 1).
func Kube(args []string) int {
	fs := flag.NewFlagSet("guest-kube", flag.ContinueOnError)
	uid := fs.Int("uid", podpath.AgentUID, "the agent user's uid (and gid): owner of /workspace and /home/agent")
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
		{podpath.RunDir, 0o700, 0, 0}, {"/root", 0o700, 0, 0},
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
