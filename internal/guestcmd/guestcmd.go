// Package guestcmd is the agent's side of the binary: the commands that run inside a sandbox
// (guest, the agent itself; and in kubernetes pods guest-install, guest-kube and
// guest-tunnel). The lean agentbox-guest binary (cmd/agentbox-guest) is these commands and
// nothing else, so that every sandbox's agent links only what it uses; the full agentbox binary
// keeps them under the same names.
package guestcmd

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime/microvm/vminit"
)

// Commands maps each in-sandbox verb to its command.
func Commands() map[string]func([]string) int {
	return map[string]func([]string) int{
		"guest": Guest,
		// the kubernetes runtime's: the init container's install, the image volume's
		// entrypoint and the agent tunnel (kube.go)
		"guest-install": Install, "guest-kube": Kube, "guest-tunnel": Tunnel,
		// the vm runtime's: PID 1 of a microVM (internal/runtime/microvm/vminit)
		vminit.Command: vminit.Main,
	}
}

// Guest runs the agent: PID 1 of a sandbox, serving exec, files, jobs, terminals and the
// network session on a unix socket.
func Guest(args []string) int {
	fs := flag.NewFlagSet("guest", flag.ContinueOnError)
	socket := fs.String("socket", "/.agentbox/run/agent.sock", "unix socket to listen on")
	workdir := fs.String("workdir", guest.DefaultWorkdir, "default working directory")
	user := fs.String("user", "agent", `user that runs commands naming none, and owns files the agent creates, when the agent runs as root: a name, a uid or uid:gid (also NAME:GROUP); "" = the agent itself`)
	fsizeMB := fs.Int64("fsize-mb", 0, "cap RLIMIT_FSIZE (soft and hard) of the agent and every command at this many MiB, before serving (0: leave it as the runtime set it; the kubernetes runtime passes the sandbox's disk_mb)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *fsizeMB < 0 {
		fmt.Fprintln(os.Stderr, "agentbox guest: --fsize-mb must be 0 or more")
		return 2
	}
	if *fsizeMB > 0 {
		if err := guest.LimitFileSize(*fsizeMB << 20); err != nil {
			fmt.Fprintln(os.Stderr, "agentbox guest:", err)
			return 1
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// What the binary's package inits allocated and dropped goes back to the host now, not
	// when the heap first reaches its GC goal: an idle agent holds less.
	debug.FreeOSMemory()
	var defaultUser *guest.User
	if *user != "" && os.Geteuid() == 0 {
		u, err := guest.ParseUser(*user)
		if err != nil {
			fmt.Fprintln(os.Stderr, "agentbox guest:", err)
			return 1
		}
		defaultUser = &u
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	guest.ReservePids(log)
	if err := guest.Run(ctx, guest.ServerConfig{Socket: *socket, Workdir: *workdir, Logger: log, DefaultUser: defaultUser}); err != nil {
		fmt.Fprintln(os.Stderr, "agentbox guest:", err)
		return 1
	}
	return 0
}
