package remoteops

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/remoteexec"
)

// Grace is how long past a request's timeout the server waits for the machine's result frame
// (the machine kills the command at the timeout, then reports) before it returns what it
// received, partial.
const Grace = 15 * time.Second

// Exec runs remote_exec on joined machines; the REST, MCP and CLI surfaces call it.
type Exec struct{ machines Machines }

// NewExec returns an Exec over machines.
func NewExec(machines Machines) *Exec { return &Exec{machines: machines} }

// Exec runs req on the machine ref names (id, name or alias). The request is checked before
// the machine is looked up, and again against the machine's platform (its shells, its paths).
func (s *Exec) Exec(ctx context.Context, ref string, req remoteexec.Request) (*remoteexec.Result, error) {
	if err := req.Validate(""); err != nil {
		return nil, err
	}
	hc, m, err := s.machines.Client(ctx, ref)
	if err != nil {
		return nil, err
	}
	if m.Platform != "" {
		if err := req.Validate(m.Platform); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(req.Timeout())*time.Millisecond+Grace)
	defer cancel()
	return remoteexec.NewClient(hc).Exec(ctx, req)
}
