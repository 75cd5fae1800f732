package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/machine/agent"
)

// exitRemoved is join's exit status when the server says this machine was removed (the
// systemd unit does not restart on it).
const exitRemoved = 3

// defaultMachineStateDir is where a joined machine keeps its identity.
func defaultMachineStateDir() string {
	if runtime.GOOS == "linux" && os.Geteuid() == 0 {
		return "/var/lib/agentbox-machine"
	}
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "agentbox", "machine")
	}
	return ".agentbox-machine"
}

// cmdJoin is `agentbox join URL --token T [--name N] [--install]`: run on the
// machine, it enrolls with the join token (the first time), then keeps connected to the server
// forever, reconnecting with backoff.
func cmdJoin(args []string) int {
	fs := flag.NewFlagSet("join", flag.ContinueOnError)
	token := fs.String("token", os.Getenv("AGENTBOX_JOIN_TOKEN"), "the join token (`agentbox machine token create` on the server prints one); needed the first time only (default $AGENTBOX_JOIN_TOKEN)")
	name := fs.String("name", "", "the machine's name on the server (default: its host name)")
	stateDir := fs.String("state-dir", defaultMachineStateDir(), "where the machine's identity (its private key, 0600) is kept")
	install := fs.Bool("install", false, "enroll, then install and start a system service that keeps the machine connected (systemd on Linux)")
	unitDir := fs.String("unit-dir", "/etc/systemd/system", "where --install writes the systemd unit")
	caCert := fs.String("ca-cert", "", "trust an https server whose certificate chains to this PEM file")
	fingerprint := fs.String("fingerprint", "", "pin the https server's certificate by its SHA-256 fingerprint (`agentbox serve` prints it)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: agentbox join URL [--token T] [--name N] [--install] [--state-dir D] [--ca-cert F | --fingerprint SHA256]")
		fs.PrintDefaults()
	}
	// The URL may come before or after the flags.
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != 1 {
		fs.Usage()
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "agentbox join: --log-level %q: use debug, info, warn or error\n", *logLevel)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	url := strings.TrimRight(pos[0], "/")
	hc := &http.Client{}
	if strings.HasPrefix(url, "https://") && (*caCert != "" || *fingerprint != "") {
		tc, err := client.TLS{CACert: *caCert, Fingerprint: *fingerprint}.Config()
		if err != nil {
			return fail(err)
		}
		hc.Transport = &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}
	}
	dir, err := filepath.Abs(*stateDir)
	if err != nil {
		return fail(err)
	}
	cfg := agent.Config{ServerURL: url, StateDir: dir, HTTPClient: hc, Logger: log}
	ctx, cancel := signalContext()
	defer cancel()
	st, err := agent.LoadState(dir)
	switch {
	case err == nil && *token != "":
		fmt.Fprintf(os.Stderr, "agentbox join: %s already holds machine %s (%s) of %s; ignoring --token (remove the state file to join afresh)\n", filepath.Join(dir, agent.StateFile), st.Name, st.MachineID, st.ServerURL)
	case err == nil:
	case errors.Is(err, os.ErrNotExist):
		if *token == "" {
			fmt.Fprintf(os.Stderr, "agentbox join: this machine has not joined yet (no %s): pass --token (create one on the server with `agentbox machine token create`)\n", filepath.Join(dir, agent.StateFile))
			return 2
		}
		st, err = agent.Enroll(ctx, cfg, *token, *name)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(os.Stderr, "agentbox join: joined %s as machine %s (%s); identity in %s\n", url, st.Name, st.MachineID, filepath.Join(dir, agent.StateFile))
	default:
		return fail(err)
	}
	if st.ServerURL != url {
		fmt.Fprintf(os.Stderr, "agentbox join: %s belongs to server %s, not %s; use another --state-dir to join a second server\n", filepath.Join(dir, agent.StateFile), st.ServerURL, url)
		return 2
	}
	if *install {
		exe, err := os.Executable()
		if err != nil {
			return fail(err)
		}
		argv := []string{exe, "join", url, "--state-dir", dir}
		if *caCert != "" {
			ca, _ := filepath.Abs(*caCert)
			argv = append(argv, "--ca-cert", ca)
		}
		if *fingerprint != "" {
			argv = append(argv, "--fingerprint", *fingerprint)
		}
		if err := installService(ctx, *unitDir, argv); err != nil {
			return fail(err)
		}
		return 0
	}
	err = agent.Run(ctx, cfg, st)
	if errors.Is(err, agent.ErrRemoved) {
		fmt.Fprintf(os.Stderr, "agentbox join: %v\n", err)
		return exitRemoved
	}
	if errors.Is(err, context.Canceled) {
		return 0
	}
	return fail(err)
}
