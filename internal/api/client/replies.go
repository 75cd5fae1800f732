package client

import (
	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// The bodies of the REST replies and requests whose items are still the server's domain types
// (they become wire types as those move to internal/wire). Each has the JSON of the server's
// type of the same name in internal/api; TestClientReplyBytes (internal/api) holds them to it.

// PoolList is the reply of GET /v1/pools.
type PoolList struct {
	Pools []sandbox.PoolStatus `json:"pools"`
	Count int                  `json:"count"`
	// MaxPooled bounds the sum of the pools' sizes.
	MaxPooled int `json:"max_pooled"`
}

// SnapshotList is the reply of GET /v1/snapshots and GET /v1/sandboxes/{id}/snapshots.
type SnapshotList struct {
	Snapshots []sandbox.Snapshot `json:"snapshots"`
	Count     int                `json:"count"`
	// NextCursor, when set, continues the listing (?cursor=): the page was full.
	NextCursor string `json:"next_cursor,omitempty"`
}

// execFrame is one line of POST /v1/sandboxes/{id}/exec's NDJSON stream.
type execFrame struct {
	Stream string              `json:"stream,omitempty"` // "stdout" or "stderr"
	Data   []byte              `json:"data,omitempty"`
	Result *sandbox.ExecResult `json:"result,omitempty"`
	Error  *wire.ErrorDetail   `json:"error,omitempty"`
}

// approvalList is the reply of GET /v1/approvals.
type approvalList struct {
	Approvals []approval.Approval `json:"approvals"`
}

// imageList is the reply of GET /v1/images.
type imageList struct {
	Images []image.Image `json:"images"`
	Count  int           `json:"count"`
	Usage  *image.Usage  `json:"usage,omitempty"`
}

// importResult is the reply of POST /v1/images/import.
type importResult struct {
	Images []image.Image `json:"images"`
}

// exposureList is the reply of GET /v1/sandboxes/{id}/exposures.
type exposureList struct {
	SandboxID string             `json:"sandbox_id"`
	Exposures []sandbox.Exposure `json:"exposures"`
}

// The bodies that start a run or a batch: the spec and, beside it, whether to wait.
type (
	runRequest struct {
		runs.Spec
		wire.WaitOptions
	}
	batchStartRequest struct {
		runs.BatchRequest
		wire.WaitOptions
	}
	matrixStartRequest struct {
		runs.MatrixRequest
		wire.WaitOptions
	}
	compareStartRequest struct {
		runs.CompareRequest
		wire.WaitOptions
	}
)
