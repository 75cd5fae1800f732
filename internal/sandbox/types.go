package sandbox

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/guest"
)

// The public result types of the service. They are the REST and MCP replies' shapes, owned
// here and converted explicitly from the guest protocol's, so that the agent's wire format can
// change without the public contract changing with it.

// Bounds of exec that callers check before calling (the agent enforces them too).
const (
	MaxStdinBytes         = guest.MaxStdinBytes
	DefaultMaxOutputBytes = guest.DefaultMaxOutputBytes
	MaxMaxOutputBytes     = guest.MaxMaxOutputBytes
)

// OutputFunc receives a command's output as it is produced: stream is "stdout" or "stderr",
// data the exact bytes.
type OutputFunc func(stream string, data []byte)

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
	// taken after the command; CheckpointError says why none was (internal/sandbox/snapshots).
	Changes          []DiffChange `json:"changes,omitempty"`
	ChangesTruncated bool         `json:"changes_truncated,omitempty"`
	SnapshotID       string       `json:"snapshot_id,omitempty"`
	CheckpointError  string       `json:"checkpoint_error,omitempty"`
}

// execResultFrom converts the agent's result.
func execResultFrom(g guest.ExecResult) ExecResult {
	r := ExecResult{ExitCode: g.ExitCode, Signal: g.Signal, Truncated: g.Truncated, StdoutBytes: g.StdoutBytes,
		StderrBytes: g.StderrBytes, DurationMs: g.DurationMs, TimedOut: g.TimedOut, OOMKilled: g.OOMKilled}
	r.Stdout, r.StdoutBase64 = textAndExact(g.Stdout)
	r.Stderr, r.StderrBase64 = textAndExact(g.Stderr)
	return r
}

// textAndExact returns b as text (each byte that is not part of a UTF-8 character replaced by
// U+FFFD, as encoding/json does), and as base64 when the text is not exactly b.
func textAndExact(b []byte) (text, exact string) {
	if utf8.Valid(b) {
		return string(b), ""
	}
	var sb strings.Builder
	for p := b; len(p) > 0; {
		r, n := utf8.DecodeRune(p)
		if r == utf8.RuneError && n == 1 {
			sb.WriteRune(utf8.RuneError)
		} else {
			sb.Write(p[:n])
		}
		p = p[n:]
	}
	return sb.String(), base64.StdEncoding.EncodeToString(b)
}

// StdoutRaw returns the exact kept stdout bytes.
func (r ExecResult) StdoutRaw() []byte { return exact(r.Stdout, r.StdoutBase64) }

// StderrRaw returns the exact kept stderr bytes.
func (r ExecResult) StderrRaw() []byte { return exact(r.Stderr, r.StderrBase64) }

func exact(text, b64 string) []byte {
	if b64 != "" {
		if b, err := base64.StdEncoding.DecodeString(b64); err == nil {
			return b
		}
	}
	return []byte(text)
}

// FileInfo describes one file in a sandbox.
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

func fileInfoFrom(g guest.FileInfo) FileInfo {
	return FileInfo{Path: g.Path, Name: g.Name, Type: g.Type, Size: g.Size, Mode: g.Mode, ModTime: g.ModTime, LinkTarget: g.LinkTarget}
}

// DirList is a bounded directory listing, sorted by name.
type DirList struct {
	Path      string     `json:"path"`
	Entries   []FileInfo `json:"entries"`
	Truncated bool       `json:"truncated"`
	Total     int        `json:"total"`
}

func dirListFrom(g guest.DirList) DirList {
	d := DirList{Path: g.Path, Truncated: g.Truncated, Total: g.Total, Entries: make([]FileInfo, 0, len(g.Entries))}
	for _, e := range g.Entries {
		d.Entries = append(d.Entries, fileInfoFrom(e))
	}
	return d
}

// MkdirRequest creates a directory in a sandbox.
type MkdirRequest struct {
	Path    string `json:"path"`
	Mode    string `json:"mode,omitempty"` // default "0755"
	Parents bool   `json:"parents,omitempty"`
}

// EnvVarNames returns the names of the sandbox's environment variables, sorted: its Env's keys,
// or EnvNames when the record came from a reply (which never carries the values).
func (sb Sandbox) EnvVarNames() []string {
	if len(sb.Env) == 0 {
		return sb.EnvNames
	}
	names := make([]string, 0, len(sb.Env))
	for k := range sb.Env {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// SecretVarNames returns the names of the sandbox's secrets, sorted: its Secrets' names, or
// SecretNames when the record came from a reply.
func (sb Sandbox) SecretVarNames() []string {
	if len(sb.Secrets) == 0 {
		return sb.SecretNames
	}
	names := make([]string, 0, len(sb.Secrets))
	for _, sc := range sb.Secrets {
		names = append(names, sc.Name)
	}
	slices.Sort(names)
	return names
}

// MarshalJSON writes the record as every reply carries it: env_names (sorted) instead of the
// environment's values, which may hold credentials, and secret_names instead of the secrets
// (their placeholders are only in the sandbox's environment).
func (sb Sandbox) MarshalJSON() ([]byte, error) {
	type fields Sandbox // without this method
	sb.EnvNames = sb.EnvVarNames()
	sb.SecretNames = sb.SecretVarNames()
	return json.Marshal(fields(sb))
}
