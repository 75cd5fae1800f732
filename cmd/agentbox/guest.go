package main

import "github.com/agentbox/agentbox/internal/guest"

func guestExec(argv ...string) guest.ExecRequest {
	return guest.ExecRequest{Argv: argv, TimeoutMs: 10000}
}
