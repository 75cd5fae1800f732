// Package store is the contract for agentbox's durable state: one interface in domain terms,
// composed of what each control-plane service needs, with a shared test suite (storetest) that
// every driver (sqlite, postgres) must pass.
package store

import (
	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sqlquery"
)

// Store is the full durable-state contract.
type Store interface {
	// sandbox.Store is the sandbox service's and its features' (pruning, wake admission,
	// jobs, network records, snapshots, warm pools): every part required.
	sandbox.Store
	runs.Store
	auth.Store       // API keys (issue 16)
	audit.Store      // the audit log (issue 16)
	sqlquery.Querier // execute_sql over the published views (issue 16)
	approval.Store   // approvals (issue 16)
	MachineStore     // joined machines and join tokens (issue 17, machines.go)
	RemoteJobStore   // remote jobs (issue 17, remotejobs.go)
	BlobStore        // the file relay (issue 17, blobs.go)
	Leases           // leases of lifecycle work across replicas (issue 18, leases.go)
	Close() error
}
