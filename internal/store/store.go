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
	auth.Store        // API keys
	audit.Store       // the audit log
	sqlquery.Querier  // execute_sql over the published views
	approval.Store    // approvals
	MachineStore      // joined machines and join tokens (machines.go)
	RemoteJobStore    // remote jobs (remotejobs.go)
	BlobStore         // the file relay (blobs.go)
	Leases            // leases of lifecycle work across replicas (leases.go)
	ConversationStore // conversations of agentbox chat (conversations.go)
	Close() error
}
