package e2e

import "github.com/agentbox/agentbox/internal/wire"

func apiExec(argv ...string) wire.ExecRequest { return wire.ExecRequest{Command: argv} }
