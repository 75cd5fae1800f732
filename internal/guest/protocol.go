// Package guest is the in-sandbox agent and its protocol: HTTP/1.1 over a byte stream (a unix
// socket for OCI runtimes), versioned under /v1, JSON bodies, newline-delimited JSON frames for
// streams. Server runs inside the sandbox as PID 1 (`agentbox guest`); Client is the host side.
//
// Endpoints (all under /v1; errors are {"code": "...", "message": "...", "details": {...}} with
// an HTTP status matching the code):
//
//	GET    /v1/health                  → Health
//	POST   /v1/exec                    ExecRequest → ExecResult, or (stream=true) NDJSON Frames
//	PUT    /v1/files?path=P&mode=0644  raw body → FileInfo   (atomic: temp file, then rename)
//	GET    /v1/files?path=P&offset=N&length=N&limit=N → raw body; header X-Agentbox-File-Size
//	GET    /v1/files/stat?path=P       → FileInfo
//	GET    /v1/files/list?path=P       → DirList
//	POST   /v1/files/mkdir             MkdirRequest → FileInfo
//	DELETE /v1/files?path=P&recursive=true → 204
//	POST   /v1/jobs                    JobStartRequest → JobInfo (running), at once; the job is
//	                                   detached (jobs.go): it outlives the request and the caller
//	GET    /v1/jobs                    → JobList, newest first, at most MaxJobList
//	GET    /v1/jobs/{id}               → JobInfo (JOB_NOT_FOUND if unknown)
//	GET    /v1/jobs/{id}/logs?stream=all|stdout|stderr&offset=N&max=M → JobLogs
//	GET    /v1/jobs/{id}/logs?…&offset=N&wait_ms=W → JobLogs, held up to W ms (≤ 30000) while
//	                                   nothing is past N and the job runs (a long poll)
//	GET    /v1/jobs/{id}/logs?stream=…&tail_lines=N&max=M            → JobLogs of the last N lines
//	GET    /v1/jobs/{id}/wait?timeout_ms=N → JobInfo once the job ended, or still running after N ms
//	POST   /v1/jobs/{id}/cancel        JobCancelRequest → JobInfo: SIGTERM to its tree, SIGKILL
//	                                   after grace_ms, state canceled (a finished job: as it is)
//	POST   /v1/pty (Upgrade: agentbox-pty/1) PTYRequest → 101, then PTY frames (pty.go)
//	POST   /v1/exec/stdin (Upgrade: agentbox-stdin/1) ExecRequest → 101, then frames: a
//	                                   command whose stdin stays open to the host (stdin.go)
package guest

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/peerreply"
)

// Version is the guest protocol version (the URL prefix).
const Version = "v1"

// Defaults and bounds of the protocol.
const (
	DefaultTimeout        = 300 * time.Second
	DefaultMaxOutputBytes = 1 << 20 // kept per stream
	MaxMaxOutputBytes     = 16 << 20
	MaxStdinBytes         = 16 << 20
	DefaultReadLimit      = 64 << 20 // largest range one read may return unless limit says otherwise
	MaxListEntries        = 10000
	// DefaultWorkdir is the working directory of commands and the base of relative paths.
	DefaultWorkdir = "/workspace"
	// SizeHeader carries a file's total size on reads.
	SizeHeader = "X-Agentbox-File-Size"
)

// Health is the agent's liveness reply.
type Health struct {
	OK      bool   `json:"ok"`
	Version string `json:"version"`
	PID     int    `json:"pid"`
}

// ExecRequest runs one command. Argv is never interpreted by a shell.
type ExecRequest struct {
	Argv []string `json:"argv"`
	// Env is added to the agent's environment (which holds the sandbox's env).
	Env map[string]string `json:"env,omitempty"`
	// Cwd defaults to /workspace.
	Cwd   string `json:"cwd,omitempty"`
	Stdin []byte `json:"stdin,omitempty"`
	// TimeoutMs defaults to 300000. On expiry the command's whole process group is killed
	// (SIGKILL) and the result says timed_out.
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// MaxOutputBytes is how much of each stream is kept (default 1 MiB, at most 16 MiB);
	// the rest is counted, not kept, and the result says truncated.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
	// User is "" (the sandbox default) or "root".
	User string `json:"user,omitempty"`
	// Stream asks for NDJSON frames: output as it happens, then the result.
	Stream bool `json:"stream,omitempty"`
}

// ExecResult is the outcome of a command. A non-zero exit is an outcome, not an error.
type ExecResult struct {
	// ExitCode is the exit status, or 128+signal number when killed by a signal.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the command ("SIGKILL"), or "".
	Signal string `json:"signal,omitempty"`
	// Stdout and Stderr are the kept output, exactly as the command wrote it (base64 on the
	// wire, with "output_encoding": "base64"; see MarshalJSON).
	Stdout      []byte `json:"stdout"`
	Stderr      []byte `json:"stderr"`
	Truncated   bool   `json:"truncated"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	DurationMs  int64  `json:"duration_ms"`
	TimedOut    bool   `json:"timed_out"`
	// OOMKilled: the sandbox ran out of memory (memory_mb) and the command was killed for it,
	// by the kernel's OOM killer (runc, crun) or by the host's OOM guard (gVisor).
	OOMKilled bool `json:"oom_killed,omitempty"`
}

// OutputEncoding is the value of "output_encoding" in an ExecResult on the wire: stdout and
// stderr are base64 of the exact bytes. An agent older than this field sent them as JSON strings
// (invalid UTF-8 already replaced), which UnmarshalJSON still accepts: a server adopts sandboxes
// whose agent is the binary of the build that started them.
const OutputEncoding = "base64"

// execResultFields is ExecResult without its JSON methods.
type execResultFields ExecResult

// MarshalJSON writes the result with "output_encoding": "base64", so that a reader can tell
// the shape apart from an older agent's strings.
func (r ExecResult) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		execResultFields
		OutputEncoding string `json:"output_encoding"`
	}{execResultFields(r), OutputEncoding})
}

// UnmarshalJSON reads both shapes: base64 output under "output_encoding": "base64", and an
// older agent's output as strings (no "output_encoding"). Any other encoding is an error that
// names it.
func (r *ExecResult) UnmarshalJSON(b []byte) error {
	var w struct {
		execResultFields
		Stdout         json.RawMessage `json:"stdout"`
		Stderr         json.RawMessage `json:"stderr"`
		OutputEncoding string          `json:"output_encoding"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = ExecResult(w.execResultFields)
	var err error
	switch w.OutputEncoding {
	case OutputEncoding:
		if r.Stdout, err = rawBytes(w.Stdout); err == nil {
			r.Stderr, err = rawBytes(w.Stderr)
		}
	case "": // an older agent: UTF-8 strings
		if r.Stdout, err = rawString(w.Stdout); err == nil {
			r.Stderr, err = rawString(w.Stderr)
		}
	default:
		return fmt.Errorf("exec result has output_encoding %q, which this agentbox does not know (the sandbox's agent is from a newer build; recreate the sandbox)", w.OutputEncoding)
	}
	if err != nil {
		return fmt.Errorf("exec result output: %w", err)
	}
	return nil
}

func rawBytes(m json.RawMessage) ([]byte, error) {
	var b []byte
	if len(m) == 0 {
		return nil, nil
	}
	err := json.Unmarshal(m, &b)
	return b, err
}

func rawString(m json.RawMessage) ([]byte, error) {
	var s *string
	if len(m) == 0 {
		return nil, nil
	}
	if err := json.Unmarshal(m, &s); err != nil || s == nil {
		return nil, err
	}
	return []byte(*s), nil
}

// Frame is one line of a streamed exec: output (Stream+Data), then exactly one Result or Error.
type Frame struct {
	Stream string      `json:"stream,omitempty"` // "stdout" or "stderr"
	Data   []byte      `json:"data,omitempty"`
	Result *ExecResult `json:"result,omitempty"`
	Error  *ErrorBody  `json:"error,omitempty"`
}

// ErrorBody is the wire form of an errcode.Error.
type ErrorBody = peerreply.ErrorBody

// FileInfo describes one file inside the sandbox.
type FileInfo struct {
	Path string `json:"path"`
	Name string `json:"name"`
	// Type is "file", "dir", "symlink" or "other".
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is the permission bits in octal, e.g. "0644".
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"mod_time"`
	// LinkTarget is set for symlinks.
	LinkTarget string `json:"link_target,omitempty"`
}

// DirList is a bounded directory listing, sorted by name.
type DirList struct {
	Path      string     `json:"path"`
	Entries   []FileInfo `json:"entries"`
	Truncated bool       `json:"truncated"`
	Total     int        `json:"total"`
}

// MkdirRequest creates a directory.
type MkdirRequest struct {
	Path    string `json:"path"`
	Mode    string `json:"mode,omitempty"` // default "0755"
	Parents bool   `json:"parents,omitempty"`
}

// OOMKillResult says what the agent killed.
type OOMKillResult struct {
	// Killed is how many of the command's processes the agent found and signalled (a fork bomb's
	// later children go too, uncounted); 0 when there was nothing to kill.
	Killed int `json:"killed"`
	// RSSBytes is the resident memory of the processes killed, as the sandbox's kernel counts it.
	RSSBytes int64 `json:"rss_bytes"`
	// Command is the name of the largest process killed.
	Command string `json:"command,omitempty"`
}
