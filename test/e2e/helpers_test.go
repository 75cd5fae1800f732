package e2e

import "github.com/agentbox/agentbox/internal/api"

func apiExec(argv ...string) api.ExecRequest { return api.ExecRequest{Command: argv} }
