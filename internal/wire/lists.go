package wire

// The replies that wrap a list of items, and the bodies that start runs: the items' types are
// in the files of their features.

// ExecFrame is one line of a streamed exec (POST /v1/sandboxes/{id}/exec?stream=true, NDJSON):
// output chunks as they happen (Stream and Data, the exact bytes, base64 in JSON), then
// exactly one Result or Error.
type ExecFrame struct {
	Stream string       `json:"stream,omitempty"` // "stdout" or "stderr"
	Data   []byte       `json:"data,omitempty"`
	Result *ExecResult  `json:"result,omitempty"`
	Error  *ErrorDetail `json:"error,omitempty"`
}

// ImageList is the reply of GET /v1/images.
type ImageList struct {
	Images []Image `json:"images"`
	Count  int     `json:"count"`
	// Usage is the cache's size and budget (absent if the cache could not say).
	Usage *ImageUsage `json:"usage,omitempty"`
}

// ImportResult is the reply of POST /v1/images/import.
type ImportResult struct {
	Images []Image `json:"images"`
}

// ApprovalList is the reply of GET /v1/approvals.
type ApprovalList struct {
	Approvals []Approval `json:"approvals"`
}

// KeyList is the reply of GET /v1/keys.
type KeyList struct {
	Keys []APIKey `json:"keys"`
}

// ExposureList is the reply of GET /v1/sandboxes/{id}/expose.
type ExposureList struct {
	SandboxID string     `json:"sandbox_id"`
	Exposures []Exposure `json:"exposures"`
}

// PoolList is the reply of GET /v1/pools.
type PoolList struct {
	Pools []PoolStatus `json:"pools"`
	Count int          `json:"count"`
	// MaxPooled bounds the sum of the pools' sizes.
	MaxPooled int `json:"max_pooled"`
}

// SnapshotList is the reply of GET /v1/snapshots and GET /v1/sandboxes/{id}/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
	Count     int        `json:"count"`
	// NextCursor, when set, continues the listing (?cursor=): the page was full.
	NextCursor string `json:"next_cursor,omitempty"`
}

// The bodies that start a run or a batch: the spec and, beside it, whether to wait.
type (
	// RunRequest is the body of POST /v1/runs.
	RunRequest struct {
		RunSpec
		WaitOptions
	}
	// BatchStartRequest is the body of POST /v1/batches.
	BatchStartRequest struct {
		BatchRequest
		WaitOptions
	}
	// MatrixStartRequest is the body of POST /v1/batches/matrix.
	MatrixStartRequest struct {
		MatrixRequest
		WaitOptions
	}
	// CompareStartRequest is the body of POST /v1/batches/agent-compare and /agent-test.
	CompareStartRequest struct {
		CompareRequest
		WaitOptions
	}
)

// The query parameters of the paged listings, as the client takes them (zero values: the
// server's defaults).
type (
	// JobLogsRequest asks GET /v1/sandboxes/{id}/jobs/{job_id}/logs for a slice of a job's
	// output: Offset (≥ 0) with MaxBytes pages by byte, MaxBytes alone pages from 0, TailLines
	// asks for the last lines; Stream is "all" (the default), "stdout" or "stderr".
	JobLogsRequest struct {
		Stream    string
		Offset    *int64
		MaxBytes  *int64
		TailLines *int
	}
	// SnapshotFilter pages GET /v1/snapshots: SandboxID selects one sandbox's, After is the
	// previous page's next_cursor, Limit bounds the page.
	SnapshotFilter struct {
		SandboxID string
		After     string
		Limit     int
	}
	// RunFilter pages GET /v1/runs: only these states, this batch's runs, these labels; Before
	// is the previous page's next, Limit bounds the page.
	RunFilter struct {
		States  []RunState
		BatchID string
		Labels  map[string]string
		Before  string
		Limit   int
	}
	// RunLogsRequest asks GET /v1/runs/{id}/logs for a slice of one phase's output: Phase
	// (default the command), Stream ("stdout", the default, or "stderr"), Offset and MaxBytes.
	RunLogsRequest struct {
		Phase    string
		Stream   string
		Offset   int64
		MaxBytes int64
	}
)
