package wire

// ExecResult is the outcome of a command. A non-zero exit is an outcome, not an error.
type ExecResult struct {
	// ExitCode is the exit status, or 128+signal number when killed by a signal.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the command ("SIGKILL"), or "".
	Signal string `json:"signal,omitempty"`
	// Stdout and Stderr are the kept output as UTF-8 text; bytes that are not UTF-8 are
	// replaced by U+FFFD.
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// StdoutBase64 and StderrBase64 hold the exact kept bytes (standard base64) when they are
	// not valid UTF-8, and are empty otherwise.
	StdoutBase64 string `json:"stdout_base64,omitempty"`
	StderrBase64 string `json:"stderr_base64,omitempty"`
	Truncated    bool   `json:"truncated"`
	StdoutBytes  int64  `json:"stdout_bytes"`
	StderrBytes  int64  `json:"stderr_bytes"`
	DurationMs   int64  `json:"duration_ms"`
	TimedOut     bool   `json:"timed_out"`
	// OOMKilled: the sandbox ran out of memory (memory_mb) and the command was killed for it.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// Changes (exec with changes) are the paths the command changed, at most MaxExecChanges;
	// ChangesTruncated says more changed. SnapshotID (exec with checkpoint) is the snapshot
	// taken after the command; CheckpointError says why none was.
	Changes          []DiffChange `json:"changes,omitempty"`
	ChangesTruncated bool         `json:"changes_truncated,omitempty"`
	SnapshotID       string       `json:"snapshot_id,omitempty"`
	CheckpointError  string       `json:"checkpoint_error,omitempty"`
}
