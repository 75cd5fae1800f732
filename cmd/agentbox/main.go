// Command agentbox is the whole product in one static binary: the server (serve, mcp), the CLI,
// and — bind-mounted read-only into each sandbox — the in-sandbox agent (guest).
package main

import (
	"fmt"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "guest":
		return cmdGuest(args[1:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return 0
	}
	fmt.Fprintf(os.Stderr, "agentbox: unknown command %q\n\n%s", args[0], usage)
	return 2
}

const usage = `agentbox — disposable Linux computers for AI agents

Usage:
  agentbox guest --socket PATH   the in-sandbox agent (internal)
`
