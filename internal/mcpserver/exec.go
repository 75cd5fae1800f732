package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// ExecIn are exec's arguments.
type ExecIn struct {
	SandboxID      string            `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab (from sandbox_create or sandbox_list)."`
	Command        []string          `json:"command" jsonschema:"The argv to run, e.g. [\"ls\", \"-la\"]. It is not run through a shell: use [\"sh\", \"-c\", \"cd src && make 2>&1\"] for pipes, redirection, && or globs."`
	Env            map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables for this command."`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"Working directory; default /workspace."`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"Text given to the command on standard input (at most 16 MiB)."`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" jsonschema:"Kill the command (its whole process group) after this many seconds; default 300, at most 86400."`
	MaxOutputBytes int64             `json:"max_output_bytes,omitempty" jsonschema:"Output kept per stream; default 1048576 (1 MiB), at most 16777216. The rest is counted, not kept."`
	User           string            `json:"user,omitempty" jsonschema:"Who runs the command: omit for the sandbox's unprivileged user agent (uid 1000, home /home/agent), or \"root\" for package installs and other system changes inside the sandbox."`
	Background     bool              `json:"background,omitempty" jsonschema:"Start the command as a detached job (as job_start) and return at once with {job_id, sandbox_id, state, started_at, argv}; stdin, timeout_seconds and max_output_bytes do not apply."`
	// snapshots, diff (snapshots.go)
	Changes    bool `json:"changes,omitempty" jsonschema:"Also return the paths the command changed in the sandbox's files (changes: [{path, change: added|modified|deleted, type, size, mode}], at most 1000; changes_truncated when more did). Not with background."`
	Checkpoint bool `json:"checkpoint,omitempty" jsonschema:"Snapshot the sandbox after the command (snapshot_id in the reply; checkpoint_error, with the command's result kept, if it could not be taken): a point to fork from or diff against. Not with background."`
}

// ExecOut is exec's reply. A non-zero exit_code is a normal result.
type ExecOut struct {
	ExitCode     int    `json:"exit_code" jsonschema:"The command's exit status; 128+n when signal n killed it."`
	Signal       string `json:"signal" jsonschema:"Name of the signal that killed the command (e.g. SIGKILL), or empty."`
	Stdout       string `json:"stdout" jsonschema:"Standard output (as much as was kept), as UTF-8 text: bytes that are not UTF-8 are replaced by U+FFFD."`
	Stderr       string `json:"stderr" jsonschema:"Standard error (as much as was kept), as UTF-8 text: bytes that are not UTF-8 are replaced by U+FFFD."`
	StdoutBase64 string `json:"stdout_base64,omitempty" jsonschema:"The exact kept stdout bytes in standard base64; present only when they are not valid UTF-8."`
	StderrBase64 string `json:"stderr_base64,omitempty" jsonschema:"The exact kept stderr bytes in standard base64; present only when they are not valid UTF-8."`
	Truncated    bool   `json:"truncated" jsonschema:"True when stdout or stderr was longer than max_output_bytes and was cut."`
	StdoutBytes  int64  `json:"stdout_bytes" jsonschema:"Total bytes the command wrote to stdout."`
	StderrBytes  int64  `json:"stderr_bytes" jsonschema:"Total bytes the command wrote to stderr."`
	DurationMs   int64  `json:"duration_ms" jsonschema:"Wall time in milliseconds."`
	TimedOut     bool   `json:"timed_out" jsonschema:"True when timeout_seconds passed and the command was killed."`
	OOMKilled    bool   `json:"oom_killed,omitempty" jsonschema:"True when the sandbox ran out of memory (memory_mb) and the command was killed for it."`
	// With changes or checkpoint.
	Changes          []ChangeOut `json:"changes,omitempty" jsonschema:"With changes: the paths the command changed."`
	ChangesTruncated bool        `json:"changes_truncated,omitempty" jsonschema:"With changes: more paths changed than are listed; sandbox_diff against a snapshot lists them all."`
	SnapshotID       string      `json:"snapshot_id,omitempty" jsonschema:"With checkpoint: the snapshot taken after the command."`
	CheckpointError  string      `json:"checkpoint_error,omitempty" jsonschema:"With checkpoint: why no snapshot was taken (the command's result stands)."`
	// With background: true the reply is job_start's instead (MarshalJSON).
	JobID     string     `json:"job_id,omitempty" jsonschema:"With background: the job's id; then only job_id, sandbox_id, state, started_at and argv are present."`
	SandboxID string     `json:"sandbox_id,omitempty" jsonschema:"With background: the sandbox the job runs in."`
	State     string     `json:"state,omitempty" jsonschema:"With background: the job's state (running)."`
	StartedAt *time.Time `json:"started_at,omitempty" jsonschema:"With background: when the job started."`
	Argv      []string   `json:"argv,omitempty" jsonschema:"With background: the command."`
}

// MarshalJSON writes a background start as job_start's reply, without the fields of a
// finished command (an exit_code 0 would claim what nobody knows yet).
func (o ExecOut) MarshalJSON() ([]byte, error) {
	if o.JobID != "" {
		return json.Marshal(struct {
			JobID     string     `json:"job_id"`
			SandboxID string     `json:"sandbox_id"`
			State     string     `json:"state"`
			StartedAt *time.Time `json:"started_at"`
			Argv      []string   `json:"argv"`
		}{o.JobID, o.SandboxID, o.State, o.StartedAt, o.Argv})
	}
	type plain ExecOut
	return json.Marshal(plain(o))
}

// outputAlternatives: a background exec's reply has job_start's required fields instead.
func (ExecOut) outputAlternatives() [][]string {
	return [][]string{{"job_id", "sandbox_id", "state", "started_at", "argv"}}
}

func (s *Server) addExecTool() {
	addTool(s, &mcp.Tool{
		Name:  "exec",
		Title: "Run a command in a sandbox",
		Description: `Run a command in a running sandbox and wait for it to finish.
Arguments: sandbox_id (required), command (required: an argv array such as ["python3", "test.py"]; it is NOT a shell string — use ["sh", "-c", "make 2>&1 | tail -50"] for shell syntax), env, cwd (default /workspace), stdin (text), timeout_seconds (default 300, max 86400), max_output_bytes (default 1 MiB per stream), user (omit for the unprivileged user "agent"; "root" to install packages or change the system inside the sandbox).
Reply: {exit_code, signal, stdout, stderr, truncated, stdout_bytes, stderr_bytes, duration_ms, timed_out, oom_killed}. changes: true adds the paths the command changed ({changes: [{path, change, type, size, mode}], changes_truncated}: use it to see what a command did); checkpoint: true snapshots the sandbox after the command (snapshot_id, or checkpoint_error) so you can fork from that point or diff against it later. A non-zero exit_code is a normal result (read stderr), not an error. timed_out means the command was killed at timeout_seconds. oom_killed means the sandbox ran out of memory and the command was killed (SIGKILL): use less memory or create a sandbox with more memory_mb. truncated means output was cut: redirect it to a file and page through it with file_read, or filter it (grep, tail).
If the call carries a progressToken, output is streamed as progress notifications while the command runs. Cancelling the call kills the command.
Many clients give up on a call after about a minute: run longer jobs in the background, e.g. ["sh", "-c", "nohup make test > /workspace/test.log 2>&1 &"], then poll with exec (tail, test -e) or file_read.
` + errorsDoc(errNotFound, errNotRunning, errInvalid, "COMMAND_TIMEOUT (the sandbox stopped answering: retry once, then destroy it and use a new one)", "OUTPUT_LIMIT_EXCEEDED (ask for less max_output_bytes)"),
		Annotations: &mcp.ToolAnnotations{Title: "Run a command in a sandbox", DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["command"].MinItems = ptr(1)
	}, s.exec)
}

func (s *Server) exec(ctx context.Context, req *mcp.CallToolRequest, in ExecIn) (ExecOut, string, error) {
	if in.Background {
		if in.Changes || in.Checkpoint {
			return ExecOut{}, "", errcode.New(errcode.InvalidArgument, "changes and checkpoint apply to a blocking exec, not background: after a job, use sandbox_snapshot and sandbox_diff yourself")
		}
		if in.Stdin != "" || in.TimeoutSeconds != 0 || in.MaxOutputBytes != 0 {
			return ExecOut{}, "", errcode.New(errcode.InvalidArgument, "with background: true the command runs as a job: stdin, timeout_seconds and max_output_bytes do not apply (a job runs until it ends or job_cancel; its whole output is kept for job_logs)")
		}
		j, err := s.b.StartJob(ctx, in.SandboxID, sandbox.JobStartRequest{Argv: in.Command, Env: in.Env, Cwd: in.Cwd, User: in.User})
		if err != nil {
			return ExecOut{}, "", err
		}
		jo := jobOut(j)
		return ExecOut{JobID: j.ID, SandboxID: j.SandboxID, State: string(j.State), StartedAt: &j.StartedAt, Argv: jo.Argv}, renderJob(jo), nil
	}
	if math.IsNaN(in.TimeoutSeconds) || in.TimeoutSeconds < 0 || in.TimeoutSeconds > 86400 {
		return ExecOut{}, "", errcode.New(errcode.InvalidArgument, "timeout_seconds must be between 0.001 and 86400; got %g", in.TimeoutSeconds)
	}
	r := sandbox.ExecRequest{Argv: in.Command, Env: in.Env, Cwd: in.Cwd, Stdin: []byte(in.Stdin),
		Timeout: time.Duration(in.TimeoutSeconds * float64(time.Second)), MaxOutputBytes: in.MaxOutputBytes, User: in.User,
		Changes: in.Changes, Checkpoint: in.Checkpoint}
	if in.TimeoutSeconds > 0 && r.Timeout < time.Millisecond {
		r.Timeout = time.Millisecond
	}
	var p *progress
	var onOutput sandbox.OutputFunc
	if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
		p = &progress{notify: func(msg string, sent int64) {
			err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(sent), Message: msg})
			if err != nil && ctx.Err() == nil {
				s.log.Debug("progress notification failed", "err", err)
			}
		}}
		onOutput = p.output
	}
	res, err := s.b.Exec(ctx, in.SandboxID, r, onOutput)
	if p != nil {
		p.finish() // every notification is sent before the result
	}
	if err != nil {
		return ExecOut{}, "", err
	}
	out := ExecOut{ExitCode: res.ExitCode, Signal: res.Signal, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutBase64: res.StdoutBase64, StderrBase64: res.StderrBase64, Truncated: res.Truncated, StdoutBytes: res.StdoutBytes, StderrBytes: res.StderrBytes,
		DurationMs: res.DurationMs, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
		ChangesTruncated: res.ChangesTruncated, SnapshotID: res.SnapshotID, CheckpointError: res.CheckpointError}
	text := renderExec(out, r.MaxOutputBytes)
	if in.Changes {
		out.Changes = changesOut(res.Changes)
		text += renderChanges(out.Changes, out.ChangesTruncated)
	}
	if out.SnapshotID != "" {
		text += fmt.Sprintf("\ncheckpoint: snapshot %s (fork from it with sandbox_fork snapshot_id, diff against it with sandbox_diff snapshot_id)", out.SnapshotID)
	} else if out.CheckpointError != "" {
		text += "\ncheckpoint failed: " + out.CheckpointError
	}
	return out, text, nil
}

// progress forwards a command's output as notifications/progress: message = the text, progress
// = bytes so far. Chunks are cut at UTF-8 boundaries; the total is bounded by MaxProgressBytes.
type progress struct {
	notify  func(msg string, sent int64)
	sent    int64
	carry   map[string][]byte // an incomplete UTF-8 sequence at the end of the last chunk, per stream
	stopped bool
}

func (p *progress) output(stream string, data []byte) {
	if p.stopped {
		return
	}
	if p.carry == nil {
		p.carry = map[string][]byte{}
	}
	buf := append(p.carry[stream], data...)
	cut := len(buf)
	// Hold back a trailing incomplete rune (at most 3 bytes) for the next chunk.
	for i := 1; i <= 3 && i <= len(buf); i++ {
		c := buf[len(buf)-i]
		if utf8.RuneStart(c) {
			if !utf8.FullRune(buf[len(buf)-i:]) {
				cut = len(buf) - i
			}
			break
		}
	}
	p.carry[stream] = append([]byte(nil), buf[cut:]...)
	p.send(buf[:cut])
}

func (p *progress) send(b []byte) {
	if len(b) == 0 || p.stopped {
		return
	}
	msg := string(b)
	if p.sent+int64(len(b)) > MaxProgressBytes {
		p.stopped = true
		msg = fmt.Sprintf("[agentbox: %d bytes of output streamed; further output is not streamed — see the result]", p.sent)
	}
	p.sent += int64(len(b))
	p.notify(strings.ToValidUTF8(msg, "\uFFFD"), p.sent)
}

// finish flushes what is held back.
func (p *progress) finish() {
	for _, stream := range []string{"stdout", "stderr"} {
		if b := p.carry[stream]; len(b) > 0 {
			p.carry[stream] = nil
			p.send(b)
		}
	}
}
