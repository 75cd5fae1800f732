// Command agentbox-guest is the lean in-sandbox agent: the agentbox binary's in-sandbox
// commands (guest, and in kubernetes pods guest-install, guest-kube and guest-tunnel; package
// guestcmd) and nothing of the server, the CLI, the stores or the Kubernetes client. Every
// runtime runs it as PID 1 of each sandbox (bound read-only at the path the full binary had, so
// `agentbox guest` inside a sandbox names it); internal/deps_test.go keeps what it links to an
// allow-list. make build puts it beside bin/agentbox, where serve looks for it.
package main

import (
	"fmt"
	"os"
	goruntime "runtime"

	"github.com/agentbox/agentbox/internal/guestcmd"
	"github.com/agentbox/agentbox/internal/version"
)

const usage = `agentbox-guest — the agent inside every agentbox sandbox (run by the runtimes, not by hand)

  agentbox-guest guest [--socket PATH] [--workdir DIR] [--user USER] [--fsize-mb N]
                                        serve the agent's protocol on a unix socket (PID 1)
  agentbox-guest version                print the version
`

func main() {
	closeInheritedFDs()
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	if f, ok := guestcmd.Commands()[args[0]]; ok {
		return f(args[1:])
	}
	switch args[0] {
	case "version":
		fmt.Printf("agentbox-guest %s (%s, %s/%s)\n", version.Version, goruntime.Version(), goruntime.GOOS, goruntime.GOARCH)
		return 0
	case "-h", "--help", "help":
		fmt.Print(usage)
		return 0
	}
	fmt.Fprintf(os.Stderr, "agentbox-guest: unknown command %q\n\n%s", args[0], usage)
	return 2
}
