package mcpserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/jobmodel"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// JobBackend is what the job tools need of the control plane (part of Backend).
type JobBackend interface {
	StartJob(ctx context.Context, id string, req sandbox.JobStartRequest) (sandbox.Job, error)
	ListJobs(ctx context.Context, id string, limit int) (sandbox.JobList, error)
	JobStatus(ctx context.Context, id, jobID string) (sandbox.Job, error)
	JobLogs(ctx context.Context, id, jobID string, req sandbox.JobLogsRequest) (sandbox.JobLogs, error)
	WaitJob(ctx context.Context, id, jobID string, timeout time.Duration) (sandbox.Job, error)
	CancelJob(ctx context.Context, id, jobID string, grace *time.Duration) (sandbox.Job, error)
}

// JobStartIn are job_start's arguments: the command as exec's.
type JobStartIn struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab."`
	Command   []string          `json:"command" jsonschema:"The argv to run, e.g. [\"make\", \"-j4\"]. Not a shell: use [\"sh\", \"-c\", \"...\"] for shell syntax."`
	Env       map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables for the job (their values are never echoed back)."`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"Working directory; default /workspace."`
	User      string            `json:"user,omitempty" jsonschema:"Omit for the unprivileged user agent, or \"root\"."`
}

// JobIn names one job.
type JobIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id."`
	JobID     string `json:"job_id" jsonschema:"The job's id (job- and 12 hex digits), from job_start or job_list."`
}

// JobListIn are job_list's arguments.
type JobListIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id."`
	Limit     *int64 `json:"limit,omitempty" jsonschema:"Return the newest N jobs (1-1000, default 20); the reply says how many were omitted."`
}

// JobLogsIn are job_logs's arguments.
type JobLogsIn struct {
	SandboxID   string `json:"sandbox_id" jsonschema:"The sandbox's id."`
	JobID       string `json:"job_id" jsonschema:"The job's id."`
	Stream      string `json:"stream,omitempty" jsonschema:"all (default: stdout and stderr interleaved as written), stdout or stderr."`
	OffsetBytes *int64 `json:"offset_bytes,omitempty" jsonschema:"Page by byte from this offset (>= 0); continue from the reply's next_offset."`
	MaxBytes    *int64 `json:"max_bytes,omitempty" jsonschema:"Bytes per page, 1-262144 (default 65536)."`
	TailLines   *int64 `json:"tail_lines,omitempty" jsonschema:"The last N lines (1-10000). Default when no offset is given: the last 200 lines."`
}

// JobWaitIn are job_wait's arguments.
type JobWaitIn struct {
	SandboxID      string   `json:"sandbox_id" jsonschema:"The sandbox's id."`
	JobID          string   `json:"job_id" jsonschema:"The job's id."`
	TimeoutSeconds *float64 `json:"timeout_seconds,omitempty" jsonschema:"Wait at most this long, 0-3600 (default 30). A wait that times out is not an error: it returns state running."`
}

// JobCancelIn are job_cancel's arguments.
type JobCancelIn struct {
	SandboxID    string   `json:"sandbox_id" jsonschema:"The sandbox's id."`
	JobID        string   `json:"job_id" jsonschema:"The job's id."`
	GraceSeconds *float64 `json:"grace_seconds,omitempty" jsonschema:"Seconds between SIGTERM and SIGKILL, 0-600 (default 10)."`
}

// JobOut is a job as the tools report it.
type JobOut struct {
	JobID        string     `json:"job_id" jsonschema:"The job's id; pass it as job_id to the other job tools."`
	SandboxID    string     `json:"sandbox_id" jsonschema:"The sandbox the job runs in."`
	State        string     `json:"state" jsonschema:"starting, running, exited (see exit_code), killed (see signal, oom_killed), canceled, failed (never started) or unknown (the sandbox was lost: the outcome is NOT known, never a success)."`
	Success      bool       `json:"success" jsonschema:"True only when the job exited with code 0."`
	Message      string     `json:"message" jsonschema:"What the state means, in words."`
	Argv         []string   `json:"argv" jsonschema:"The command."`
	ExitCode     *int       `json:"exit_code,omitempty" jsonschema:"Exit status, once the job exited."`
	Signal       string     `json:"signal,omitempty" jsonschema:"The signal that ended a killed job."`
	OOMKilled    bool       `json:"oom_killed" jsonschema:"True when the sandbox's memory limit killed the job."`
	StartedAt    time.Time  `json:"started_at" jsonschema:"When the job started (RFC 3339)."`
	FinishedAt   *time.Time `json:"finished_at,omitempty" jsonschema:"When it ended (RFC 3339)."`
	LogBytes     int64      `json:"log_bytes" jsonschema:"Bytes of output so far (stdout and stderr)."`
	LogTruncated bool       `json:"log_truncated,omitempty" jsonschema:"The log stopped being written (the sandbox's disk filled); the job itself was not stopped by it."`
	CPUSeconds   float64    `json:"cpu_seconds" jsonschema:"CPU time (user + system) the job has used, in seconds: while it runs, that of its processes so far; once it ended, its whole tree's."`
	Error        string     `json:"error,omitempty" jsonschema:"Why it failed to start, was canceled by the sandbox's end, or is unknown."`
	EnvNames     []string   `json:"env_names,omitempty" jsonschema:"Names of the environment variables given."`
	Cwd          string     `json:"cwd,omitempty" jsonschema:"Working directory given."`
	User         string     `json:"user,omitempty" jsonschema:"User given."`
}

func jobOut(j sandbox.Job) JobOut {
	return JobOut{JobID: j.ID, SandboxID: j.SandboxID, State: string(j.State), Success: j.Success, Message: j.Message,
		Argv: nonNil(j.Argv), ExitCode: j.ExitCode, Signal: j.Signal, OOMKilled: j.OOMKilled, StartedAt: j.StartedAt,
		FinishedAt: j.FinishedAt, LogBytes: j.LogBytes, LogTruncated: j.LogTruncated, CPUSeconds: j.CPUSeconds, Error: j.Error,
		EnvNames: j.EnvNames, Cwd: j.Cwd, User: j.User}
}

func renderJob(j JobOut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s in %s: %s — %s\n", j.JobID, j.SandboxID, j.State, j.Message)
	fmt.Fprintf(&b, "argv: %q\nstarted_at: %s, log_bytes: %d", j.Argv, j.StartedAt.Format(time.RFC3339), j.LogBytes)
	if j.FinishedAt != nil {
		fmt.Fprintf(&b, ", finished_at: %s", j.FinishedAt.Format(time.RFC3339))
	}
	return b.String()
}

// JobListOut is job_list's reply.
type JobListOut struct {
	Jobs    []JobOut `json:"jobs" jsonschema:"The newest jobs first: running ones and finished ones still kept."`
	Omitted int      `json:"omitted" jsonschema:"How many older jobs the limit left out."`
}

// LogDataOut is the text of a page of a job's log, as job_logs and remote_job_logs reply it.
type LogDataOut struct {
	JobID      string `json:"job_id" jsonschema:"The job's id."`
	Data       string `json:"data" jsonschema:"The output slice as UTF-8 text (bytes that are not UTF-8 are replaced by U+FFFD; data_base64 then has the exact bytes)."`
	DataBase64 string `json:"data_base64,omitempty" jsonschema:"The exact bytes in standard base64; present only when they are not valid UTF-8."`
}

// logData is the page data of job id as text, with the exact bytes when they are not UTF-8.
func logData(id string, data []byte) LogDataOut {
	out := LogDataOut{JobID: id, Data: strings.ToValidUTF8(string(data), "\uFFFD")}
	if !utf8.Valid(data) {
		out.DataBase64 = base64.StdEncoding.EncodeToString(data)
	}
	return out
}

// LogRangeOut is where a page of a job's log lies (jobmodel.Slice), as job_logs and
// remote_job_logs reply it.
type LogRangeOut struct {
	Offset     int64 `json:"offset" jsonschema:"Where the slice starts in the log."`
	NextOffset int64 `json:"next_offset" jsonschema:"Pass as offset_bytes to read on."`
	TotalBytes int64 `json:"total_bytes" jsonschema:"The log's size now; next_offset == total_bytes means you have read it all so far."`
}

// JobLogsOut is job_logs's reply.
type JobLogsOut struct {
	LogDataOut
	Stream string `json:"stream" jsonschema:"all, stdout or stderr."`
	LogRangeOut
	Truncated bool   `json:"truncated" jsonschema:"The log stopped being written (the sandbox's disk filled); the job was not stopped by it."`
	State     string `json:"state" jsonschema:"The job's state as recorded."`
	Source    string `json:"source" jsonschema:"agent (the whole log, on the sandbox's disk) or record (the sandbox is gone: only the last 64 KiB were kept)."`
	Message   string `json:"message,omitempty" jsonschema:"A note, e.g. that earlier bytes are gone with the sandbox."`
}

const jobErrs = "JOB_NOT_FOUND (wrong job_id: check job_list)"

func (s *Server) addJobTools() {
	addTool(s, &mcp.Tool{
		Name:  "job_start",
		Title: "Start a detached job",
		Description: `Start a command as a detached job in a running sandbox and return at once. The job keeps running when this call, the conversation or the MCP client ends, and when the server restarts; only its own end, job_cancel, or the sandbox's end (destroy, TTL) stops it. Use it for builds, test suites, training runs: anything longer than a minute.
Arguments: sandbox_id, command (argv, as exec's), env, cwd, user.
Reply: {job_id, sandbox_id, state: "running", started_at, argv, …}. Then job_wait (block for its end), job_status, job_logs (its output, kept whole on the sandbox's disk), job_cancel.
At most 64 jobs run at once per sandbox.
` + errorsDoc(errNotFound, errNotRunning, errInvalid, "JOB_LIMIT_EXCEEDED (64 jobs already run in this sandbox: wait for one or cancel one)"),
		Annotations: &mcp.ToolAnnotations{Title: "Start a detached job", DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["command"].MinItems = ptr(1)
	}, s.jobStart)

	addTool(s, &mcp.Tool{
		Name:  "job_list",
		Title: "List a sandbox's jobs",
		Description: `List a sandbox's jobs, newest first: running ones and finished ones still kept (records outlive the sandbox for 7 days). Arguments: sandbox_id, limit (1-1000, default 20).
Reply: {jobs: [{job_id, state, exit_code, started_at, finished_at, argv, …}], omitted (older jobs left out)}.
` + errorsDoc(errNotFound, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "List a sandbox's jobs", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["limit"].Minimum, in.Properties["limit"].Maximum = ptr(1.0), ptr(float64(sandbox.MaxList))
	}, s.jobList)

	addTool(s, &mcp.Tool{
		Name:  "job_status",
		Title: "A job's status",
		Description: `Get a job's status. Arguments: sandbox_id, job_id.
Reply: {job_id, state, success, message, exit_code, signal, oom_killed, started_at, finished_at, log_bytes, log_truncated, cpu_seconds, …}. state is running, exited (exit_code), killed (signal; oom_killed when the memory limit did it), canceled, failed (never started) or unknown (the sandbox was lost: the outcome is not known — never treat it as success). It answers after the sandbox is gone too.
` + errorsDoc(errNotFound, jobErrs, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "A job's status", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.jobStatus)

	addTool(s, &mcp.Tool{
		Name:  "job_logs",
		Title: "Read a job's output",
		Description: `Read a bounded slice of a job's output (stdout and stderr interleaved as written, or one stream). Arguments: sandbox_id, job_id, stream (all|stdout|stderr), and either tail_lines (1-10000; the default is the last 200 lines) or offset_bytes (>= 0) with max_bytes (1-262144, default 65536) to page.
Reply: {data, next_offset, total_bytes, truncated, offset, state, source, …}. Page to the end by passing next_offset as offset_bytes until next_offset == total_bytes. After the sandbox is gone only the last 64 KiB are kept (source "record").
` + errorsDoc(errNotFound, jobErrs, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Read a job's output", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["stream"].Enum = []any{"all", "stdout", "stderr"}
		in.Properties["offset_bytes"].Minimum = ptr(0.0)
		in.Properties["max_bytes"].Minimum, in.Properties["max_bytes"].Maximum = ptr(1.0), ptr(float64(jobmodel.MaxLogBytes))
		in.Properties["tail_lines"].Minimum, in.Properties["tail_lines"].Maximum = ptr(1.0), ptr(float64(jobmodel.MaxTailLines))
	}, s.jobLogs)

	addTool(s, &mcp.Tool{
		Name:  "job_wait",
		Title: "Wait for a job to end",
		Description: `Block until a job ends or timeout_seconds (0-3600, default 30) pass, and return its status (as job_status). A wait that times out is not an error: the reply says state "running"; call job_wait again. With a progressToken, progress notifications report the job's output size while it runs.
Arguments: sandbox_id, job_id, timeout_seconds.
` + errorsDoc(errNotFound, jobErrs, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Wait for a job to end", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["timeout_seconds"].Minimum, in.Properties["timeout_seconds"].Maximum = ptr(0.0), ptr(sandbox.MaxJobWait.Seconds())
	}, s.jobWait)

	addTool(s, &mcp.Tool{
		Name:  "job_cancel",
		Title: "Cancel a job",
		Description: `Cancel a job: SIGTERM to its whole process tree (daemons it started included), SIGKILL after grace_seconds (0-600, default 10). Arguments: sandbox_id, job_id, grace_seconds.
Reply: the job's status, state "canceled" (or how it ended, if it ended first).
` + errorsDoc(errNotFound, jobErrs, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Cancel a job", DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["grace_seconds"].Minimum, in.Properties["grace_seconds"].Maximum = ptr(0.0), ptr(jobmodel.MaxGrace.Seconds())
	}, s.jobCancel)
}

func (s *Server) jobStart(ctx context.Context, _ *mcp.CallToolRequest, in JobStartIn) (JobOut, string, error) {
	j, err := s.b.StartJob(ctx, in.SandboxID, sandbox.JobStartRequest{Argv: in.Command, Env: in.Env, Cwd: in.Cwd, User: in.User})
	if err != nil {
		return JobOut{}, "", err
	}
	out := jobOut(j)
	return out, renderJob(out), nil
}

func (s *Server) jobList(ctx context.Context, _ *mcp.CallToolRequest, in JobListIn) (JobListOut, string, error) {
	limit := 0
	if in.Limit != nil {
		if *in.Limit < 1 || *in.Limit > sandbox.MaxList {
			return JobListOut{}, "", errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", sandbox.MaxList, *in.Limit)
		}
		limit = int(*in.Limit)
	}
	l, err := s.b.ListJobs(ctx, in.SandboxID, limit)
	if err != nil {
		return JobListOut{}, "", err
	}
	out := JobListOut{Jobs: []JobOut{}, Omitted: l.Omitted}
	var b strings.Builder
	for _, j := range l.Jobs {
		o := jobOut(j)
		out.Jobs = append(out.Jobs, o)
		code := ""
		if o.ExitCode != nil {
			code = fmt.Sprintf(" %d", *o.ExitCode)
		}
		fmt.Fprintf(&b, "%s %s%s %q\n", o.JobID, o.State, code, o.Argv)
	}
	fmt.Fprintf(&b, "%d jobs, %d older omitted", len(out.Jobs), out.Omitted)
	return out, b.String(), nil
}

func (s *Server) jobStatus(ctx context.Context, _ *mcp.CallToolRequest, in JobIn) (JobOut, string, error) {
	j, err := s.b.JobStatus(ctx, in.SandboxID, in.JobID)
	if err != nil {
		return JobOut{}, "", err
	}
	out := jobOut(j)
	return out, renderJob(out), nil
}

func (s *Server) jobLogs(ctx context.Context, _ *mcp.CallToolRequest, in JobLogsIn) (JobLogsOut, string, error) {
	req := sandbox.JobLogsRequest{Stream: in.Stream, Offset: in.OffsetBytes, MaxBytes: in.MaxBytes}
	if in.TailLines != nil {
		if *in.TailLines < 1 || *in.TailLines > jobmodel.MaxTailLines {
			return JobLogsOut{}, "", errcode.New(errcode.InvalidArgument, "tail_lines must be between 1 and %d; got %d", jobmodel.MaxTailLines, *in.TailLines)
		}
		n := int(*in.TailLines)
		req.TailLines = &n
	}
	l, err := s.b.JobLogs(ctx, in.SandboxID, in.JobID, req)
	if err != nil {
		return JobLogsOut{}, "", err
	}
	out := JobLogsOut{LogDataOut: logData(l.JobID, l.Data), Stream: l.Stream,
		LogRangeOut: LogRangeOut{Offset: l.Offset, NextOffset: l.NextOffset, TotalBytes: l.TotalBytes},
		Truncated:   l.Truncated, State: string(l.State), Source: l.Source, Message: l.Message}
	text := out.Data + fmt.Sprintf("\n[job_logs: bytes %d-%d of %d; next_offset %d; job %s]", out.Offset, out.NextOffset, out.TotalBytes, out.NextOffset, out.State)
	return out, text, nil
}

// jobWaitSlice is how often job_wait reports progress while it waits.
const jobWaitSlice = 5 * time.Second

func (s *Server) jobWait(ctx context.Context, req *mcp.CallToolRequest, in JobWaitIn) (JobOut, string, error) {
	timeout := 30 * time.Second
	if t := in.TimeoutSeconds; t != nil {
		if math.IsNaN(*t) || *t < 0 || *t > sandbox.MaxJobWait.Seconds() {
			return JobOut{}, "", errcode.New(errcode.InvalidArgument, "timeout_seconds must be between 0 and %d; got %g", int(sandbox.MaxJobWait/time.Second), *t)
		}
		timeout = time.Duration(*t * float64(time.Second)).Round(time.Second)
	}
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		j, err := s.b.WaitJob(ctx, in.SandboxID, in.JobID, timeout)
		if err != nil {
			return JobOut{}, "", err
		}
		out := jobOut(j)
		return out, renderJob(out), nil
	}
	// With a progress token: wait in slices, reporting after each.
	deadline := time.Now().Add(timeout)
	start := time.Now()
	for {
		slice := min(jobWaitSlice, time.Until(deadline).Round(time.Second))
		if slice < 0 {
			slice = 0
		}
		j, err := s.b.WaitJob(ctx, in.SandboxID, in.JobID, slice)
		if err != nil {
			return JobOut{}, "", err
		}
		if !j.State.Active() || time.Until(deadline) <= 0 {
			out := jobOut(j)
			return out, renderJob(out), nil
		}
		msg := fmt.Sprintf("job %s %s for %s; %d bytes of output", j.ID, j.State, time.Since(start).Round(time.Second), j.LogBytes)
		if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok,
			Progress: time.Since(start).Seconds(), Total: timeout.Seconds(), Message: msg}); err != nil && ctx.Err() == nil {
			s.log.Debug("progress notification failed", "err", err)
		}
	}
}

func (s *Server) jobCancel(ctx context.Context, _ *mcp.CallToolRequest, in JobCancelIn) (JobOut, string, error) {
	var grace *time.Duration
	if g := in.GraceSeconds; g != nil {
		d, err := jobmodel.GraceSeconds(*g)
		if err != nil {
			return JobOut{}, "", err
		}
		grace = &d
	}
	j, err := s.b.CancelJob(ctx, in.SandboxID, in.JobID, grace)
	if err != nil {
		return JobOut{}, "", err
	}
	out := jobOut(j)
	return out, renderJob(out), nil
}
