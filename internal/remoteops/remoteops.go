// Package remoteops is the server side of remote_exec and remote_screenshot: the
// services the REST, MCP and CLI surfaces call with a machine reference. They resolve the
// machine through Machines (*machine.Registry in the server), check the request against its
// platform and bound the call; the machine-side handlers and their clients are
// internal/remoteexec and internal/screenshot, which build for every platform the agent runs
// on (this package, which knows the store's types, need not).
package remoteops

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/internal/store"
)

// Machines resolves a machine reference (id, name or alias) to an *http.Client whose transport
// reaches its agent, and the machine's record (MACHINE_NOT_FOUND, MACHINE_OFFLINE otherwise).
// *machine.Registry is one.
type Machines interface {
	Client(ctx context.Context, ref string) (*http.Client, store.Machine, error)
}
