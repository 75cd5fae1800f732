//go:build !linux

package main

import (
	"fmt"
	"os"
	goruntime "runtime"
)

// The server side — serve, mcp (which runs the control plane in its own process) and doctor —
// needs Linux (namespaces, cgroups, runc/crun/gVisor). Elsewhere the binary is the CLI of a
// server on another host and `agentbox join` (a joined machine).

func cmdServe([]string) int { return serverOnly("serve") }

func cmdMCP([]string) int { return serverOnly("mcp") }

func cmdDoctor([]string) int { return serverOnly("doctor") }

func serverOnly(cmd string) int {
	fmt.Fprintf(os.Stderr, "agentbox %s runs on Linux only (this is %s/%s): run the server on a Linux host, and use this binary as its CLI (AGENTBOX_URL, AGENTBOX_TOKEN) or join this machine to it with `agentbox join`\n",
		cmd, goruntime.GOOS, goruntime.GOARCH)
	return 2
}
