package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostjobs"
	"github.com/agentbox/agentbox/internal/jobmodel"
	"github.com/agentbox/agentbox/internal/remotejobs"
)

// Remote jobs: remote_job_start, remote_job_list, remote_job_status,
// remote_job_logs, remote_job_cancel.

// RemoteJobBackend is what the remote job tools need: *remotejobs.Service in process,
// client.RemoteJobsBackend over a running serve; nil: UNSUPPORTED_OPERATION.
type RemoteJobBackend interface {
	Start(ctx context.Context, machine string, req remotejobs.StartRequest) (remotejobs.Job, error)
	List(ctx context.Context, machine string, limit int) (remotejobs.List, error)
	Status(ctx context.Context, machine, id string) (remotejobs.Job, error)
	Logs(ctx context.Context, machine, id string, req remotejobs.LogsRequest) (remotejobs.Logs, error)
	Cancel(ctx context.Context, machine, id string, grace time.Duration) (remotejobs.Job, error)
}

// RemoteJobStartIn are remote_job_start's arguments.
type RemoteJobStartIn struct {
	Machine  string            `json:"machine" jsonschema:"The machine's id, name or alias (machine_list)."`
	Command  string            `json:"command" jsonschema:"The command line, as one string, in the shell's dialect."`
	Shell    string            `json:"shell,omitempty" jsonschema:"sh or bash on Linux and macOS, cmd or powershell on Windows; default: sh on POSIX, powershell on Windows. Check the machine's platform first."`
	Env      map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables (their values are never echoed back)."`
	Cwd      string            `json:"cwd,omitempty" jsonschema:"Absolute working directory on the machine (default: the agent's)."`
	GPUIndex *int              `json:"gpu_index,omitempty" jsonschema:"Reserve this GPU (its index in machine_status's gpus) for the job alone: CUDA_VISIBLE_DEVICES is set to it, and no other remote job gets it until this one ends or is canceled."`
}

// RemoteJobIn names one job.
type RemoteJobIn struct {
	Machine string `json:"machine" jsonschema:"The machine's id, name or alias."`
	JobID   string `json:"job_id" jsonschema:"The job's id (rjob- and 16 hex digits), from remote_job_start or remote_job_list."`
}

// RemoteJobListIn are remote_job_list's arguments.
type RemoteJobListIn struct {
	Machine string `json:"machine" jsonschema:"The machine's id, name or alias."`
	Limit   *int64 `json:"limit,omitempty" jsonschema:"The newest N jobs (1-1000, default 20); the reply says how many were omitted."`
}

// RemoteJobLogsIn are remote_job_logs's arguments.
type RemoteJobLogsIn struct {
	Machine     string `json:"machine" jsonschema:"The machine's id, name or alias."`
	JobID       string `json:"job_id" jsonschema:"The job's id."`
	OffsetBytes *int64 `json:"offset_bytes,omitempty" jsonschema:"Page by byte from this offset (>= 0); continue from the reply's next_offset."`
	MaxBytes    *int64 `json:"max_bytes,omitempty" jsonschema:"Bytes per page with offset_bytes, 1-262144 (default 65536)."`
	TailLines   *int64 `json:"tail_lines,omitempty" jsonschema:"The last N lines (1-10000). Default when no offset is given: the last 200 lines."`
}

// RemoteJobCancelIn are remote_job_cancel's arguments.
type RemoteJobCancelIn struct {
	Machine      string `json:"machine" jsonschema:"The machine's id, name or alias."`
	JobID        string `json:"job_id" jsonschema:"The job's id."`
	GraceSeconds *int64 `json:"grace_seconds,omitempty" jsonschema:"Seconds between SIGTERM and SIGKILL, 0-600 (default 10)."`
}

// RemoteJobOut is a remote job as the tools report it.
type RemoteJobOut struct {
	JobID      string     `json:"job_id" jsonschema:"The job's id; pass it as job_id to the other remote_job tools."`
	MachineID  string     `json:"machine_id" jsonschema:"The machine it runs on."`
	State      string     `json:"state" jsonschema:"starting (recorded, not yet confirmed by the machine), running, exited (see exit_code), canceled, failed (it never started) or unknown (no exit record: killed with SIGKILL, the OOM killer, the machine restarted — the outcome is NOT known, never a success)."`
	Success    bool       `json:"success" jsonschema:"True only when the job exited with code 0."`
	Message    string     `json:"message" jsonschema:"What the state means, in words."`
	Command    string     `json:"command" jsonschema:"The command line."`
	Shell      string     `json:"shell" jsonschema:"The dialect it runs in."`
	Cwd        string     `json:"cwd,omitempty" jsonschema:"Working directory given."`
	EnvNames   []string   `json:"env_names,omitempty" jsonschema:"Names of the environment variables given."`
	GPUIndex   *int       `json:"gpu_index,omitempty" jsonschema:"The GPU it holds (released when it ends)."`
	ExitCode   *int       `json:"exit_code,omitempty" jsonschema:"Exit status once it exited (128+N when signal N other than SIGKILL ended it)."`
	Signal     string     `json:"signal,omitempty" jsonschema:"The signal that ended it, if one did."`
	StartedAt  time.Time  `json:"started_at" jsonschema:"When it started (RFC 3339)."`
	FinishedAt *time.Time `json:"finished_at,omitempty" jsonschema:"When it ended (RFC 3339)."`
	LogBytes   int64      `json:"log_bytes" jsonschema:"Bytes of output so far (stdout and stderr interleaved)."`
}

func remoteJobOut(j remotejobs.Job) RemoteJobOut {
	return RemoteJobOut{JobID: j.JobID, MachineID: j.MachineID, State: j.State, Success: j.Success, Message: j.Message,
		Command: j.Command, Shell: j.Shell, Cwd: j.Cwd, EnvNames: j.EnvNames, GPUIndex: j.GPUIndex, ExitCode: j.ExitCode,
		Signal: j.Signal, StartedAt: j.StartedAt, FinishedAt: j.FinishedAt, LogBytes: j.LogBytes}
}

func renderRemoteJob(j RemoteJobOut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s on %s: %s — %s\ncommand (%s): %s\nstarted_at: %s, log_bytes: %d", j.JobID, j.MachineID, j.State, j.Message,
		j.Shell, j.Command, j.StartedAt.Format(time.RFC3339), j.LogBytes)
	if j.GPUIndex != nil {
		fmt.Fprintf(&b, ", gpu_index: %d", *j.GPUIndex)
	}
	if j.FinishedAt != nil {
		fmt.Fprintf(&b, ", finished_at: %s", j.FinishedAt.Format(time.RFC3339))
	}
	return b.String()
}

// RemoteJobListOut is remote_job_list's reply.
type RemoteJobListOut struct {
	Jobs    []RemoteJobOut `json:"jobs" jsonschema:"The newest jobs first."`
	Omitted int            `json:"omitted" jsonschema:"How many older jobs the limit left out."`
}

// RemoteJobLogsOut is remote_job_logs's reply.
type RemoteJobLogsOut struct {
	LogDataOut
	LogRangeOut
	State string `json:"state" jsonschema:"The job's state."`
}

const (
	errMachine     = "MACHINE_NOT_FOUND (check machine_list); MACHINE_OFFLINE (the machine is not connected now: retry later)"
	errRemoteJob   = "JOB_NOT_FOUND (wrong job_id: check remote_job_list)"
	errNoRemoteJob = "UNSUPPORTED_OPERATION (this server runs no remote jobs)"
)

const remoteJobStateDoc = `state is running, exited (exit_code), canceled, failed (never started) or unknown: no exit record exists (the job was SIGKILLed — by kill -9 or the OOM killer —, or the machine rebooted). unknown is never a success: do not report the work as done; look at remote_job_logs and rerun it.`

func (s *Server) addRemoteJobTools() {
	addTool(s, &mcp.Tool{
		Name:  "remote_job_start",
		Title: "Start a detached job on a joined machine",
		Description: `Start a command as a detached job on one of the user's joined machines and return at once. It keeps running when this call, the conversation or the server ends, and (on Linux) when the machine's agent restarts; only its own end, remote_job_cancel, or the machine going down stops it. Use it for anything longer than a minute (training, builds, long tests); remote_exec for short commands.
Arguments: machine, command (one string in the shell's dialect), shell, env, cwd, gpu_index.
Dialects: check the machine's platform (machine_status) first. sh/bash on Linux and macOS; on Windows cmd (chain with &&) or powershell (its exit code does not tell success: check the output). Read stderr too: both streams go to the job's log.
gpu_index reserves that GPU for this job alone (CUDA_VISIBLE_DEVICES is set to it) until it ends or is canceled; only indices the machine reported are accepted.
Reply: {job_id, state: "running", …}. Then remote_job_status, remote_job_logs, remote_job_cancel.
` + errorsDoc(errMachine, "GPU_BUSY (another job holds that GPU: details.job_id names it; wait for it or pick another gpu_index)", "JOB_LIMIT_EXCEEDED (64 jobs already run on that machine)", errInvalid, errNoRemoteJob),
		Annotations: &mcp.ToolAnnotations{Title: "Start a detached job on a joined machine", DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
	}, func(in *jsonschema.Schema) {
		in.Properties["shell"].Enum = []any{"sh", "bash", "cmd", "powershell"}
		in.Properties["gpu_index"].Minimum, in.Properties["gpu_index"].Maximum = ptr(0.0), ptr(float64(hostjobs.MaxGPUIndex))
		in.Properties["command"].MinLength = ptr(1)
	}, s.remoteJobStart)

	addTool(s, &mcp.Tool{
		Name:  "remote_job_list",
		Title: "List a machine's jobs",
		Description: `List a joined machine's jobs, newest first. Arguments: machine, limit (1-1000, default 20).
Reply: {jobs: [{job_id, state, exit_code, command, gpu_index, started_at, finished_at, …}], omitted (older jobs left out)}. Commands longer than 1 KiB are cut in the list (remote_job_status has them whole).
` + errorsDoc(errMachine, errInvalid, errNoRemoteJob),
		Annotations: &mcp.ToolAnnotations{Title: "List a machine's jobs", ReadOnlyHint: true, OpenWorldHint: ptr(true)},
	}, func(in *jsonschema.Schema) {
		in.Properties["limit"].Minimum, in.Properties["limit"].Maximum = ptr(1.0), ptr(float64(hostjobs.MaxListLimit))
	}, s.remoteJobList)

	addTool(s, &mcp.Tool{
		Name:  "remote_job_status",
		Title: "A remote job's status",
		Description: `Get a remote job's status. Arguments: machine, job_id.
Reply: {job_id, state, success, message, exit_code, signal, started_at, finished_at, log_bytes, gpu_index, …}. ` + remoteJobStateDoc + `
` + errorsDoc(errMachine, errRemoteJob, errInvalid, errNoRemoteJob),
		Annotations: &mcp.ToolAnnotations{Title: "A remote job's status", ReadOnlyHint: true, OpenWorldHint: ptr(true)},
	}, nil, s.remoteJobStatus)

	addTool(s, &mcp.Tool{
		Name:  "remote_job_logs",
		Title: "Read a remote job's output",
		Description: `Read a bounded slice of a remote job's output (stdout and stderr interleaved as written). Arguments: machine, job_id, and either tail_lines (1-10000; the default is the last 200 lines) or offset_bytes (>= 0) with max_bytes (1-262144, default 65536) to page.
Reply: {data, offset, next_offset, total_bytes, state}. Page to the end by passing next_offset as offset_bytes until next_offset == total_bytes.
` + errorsDoc(errMachine, errRemoteJob, errInvalid, errNoRemoteJob),
		Annotations: &mcp.ToolAnnotations{Title: "Read a remote job's output", ReadOnlyHint: true, OpenWorldHint: ptr(true)},
	}, func(in *jsonschema.Schema) {
		in.Properties["offset_bytes"].Minimum = ptr(0.0)
		in.Properties["max_bytes"].Minimum, in.Properties["max_bytes"].Maximum = ptr(1.0), ptr(float64(jobmodel.MaxLogBytes))
		in.Properties["tail_lines"].Minimum, in.Properties["tail_lines"].Maximum = ptr(1.0), ptr(float64(jobmodel.MaxTailLines))
	}, s.remoteJobLogs)

	addTool(s, &mcp.Tool{
		Name:  "remote_job_cancel",
		Title: "Cancel a remote job",
		Description: `Cancel a remote job: SIGTERM to its whole process tree (on Linux, descendants that left its process group too; on Windows taskkill /T), SIGKILL after grace_seconds (0-600, default 10). Its GPU is released. Arguments: machine, job_id, grace_seconds.
Reply: the job's status, state "canceled" (or how it ended, if it ended first).
` + errorsDoc(errMachine, errRemoteJob, errInvalid, errNoRemoteJob),
		Annotations: &mcp.ToolAnnotations{Title: "Cancel a remote job", DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(true)},
	}, func(in *jsonschema.Schema) {
		in.Properties["grace_seconds"].Minimum, in.Properties["grace_seconds"].Maximum = ptr(0.0), ptr(float64(jobmodel.MaxGraceSeconds))
	}, s.remoteJobCancel)
}

func (s *Server) remoteJobs() (RemoteJobBackend, error) {
	if s.opts.RemoteJobs == nil {
		return nil, errcode.New(errcode.UnsupportedOp, "this server runs no remote jobs")
	}
	return s.opts.RemoteJobs, nil
}

func (s *Server) remoteJobStart(ctx context.Context, _ *mcp.CallToolRequest, in RemoteJobStartIn) (RemoteJobOut, string, error) {
	b, err := s.remoteJobs()
	if err != nil {
		return RemoteJobOut{}, "", err
	}
	j, err := b.Start(ctx, in.Machine, remotejobs.StartRequest{Command: in.Command, Shell: in.Shell, Env: in.Env, Cwd: in.Cwd, GPUIndex: in.GPUIndex})
	if err != nil {
		return RemoteJobOut{}, "", err
	}
	out := remoteJobOut(j)
	return out, renderRemoteJob(out), nil
}

func (s *Server) remoteJobList(ctx context.Context, _ *mcp.CallToolRequest, in RemoteJobListIn) (RemoteJobListOut, string, error) {
	b, err := s.remoteJobs()
	if err != nil {
		return RemoteJobListOut{}, "", err
	}
	limit := hostjobs.DefaultListLimit
	if in.Limit != nil {
		if *in.Limit < 1 || *in.Limit > hostjobs.MaxListLimit {
			return RemoteJobListOut{}, "", errcode.New(errcode.InvalidArgument, "limit must be 1–%d, not %d", hostjobs.MaxListLimit, *in.Limit)
		}
		limit = int(*in.Limit)
	}
	l, err := b.List(ctx, in.Machine, limit)
	if err != nil {
		return RemoteJobListOut{}, "", err
	}
	out := RemoteJobListOut{Jobs: make([]RemoteJobOut, 0, len(l.Jobs)), Omitted: l.Omitted}
	var text strings.Builder
	for _, j := range l.Jobs {
		o := remoteJobOut(j)
		out.Jobs = append(out.Jobs, o)
		fmt.Fprintf(&text, "%s %s %s\n", o.JobID, o.State, o.Command)
	}
	fmt.Fprintf(&text, "%d jobs, %d older omitted", len(out.Jobs), out.Omitted)
	return out, text.String(), nil
}

func (s *Server) remoteJobStatus(ctx context.Context, _ *mcp.CallToolRequest, in RemoteJobIn) (RemoteJobOut, string, error) {
	b, err := s.remoteJobs()
	if err != nil {
		return RemoteJobOut{}, "", err
	}
	j, err := b.Status(ctx, in.Machine, in.JobID)
	if err != nil {
		return RemoteJobOut{}, "", err
	}
	out := remoteJobOut(j)
	return out, renderRemoteJob(out), nil
}

func (s *Server) remoteJobLogs(ctx context.Context, _ *mcp.CallToolRequest, in RemoteJobLogsIn) (RemoteJobLogsOut, string, error) {
	b, err := s.remoteJobs()
	if err != nil {
		return RemoteJobLogsOut{}, "", err
	}
	var req remotejobs.LogsRequest
	if in.TailLines != nil {
		req.TailLines = int(max(min(*in.TailLines, 1<<30), -1))
	}
	req.Offset = in.OffsetBytes
	if in.MaxBytes != nil {
		req.MaxBytes = int(max(min(*in.MaxBytes, 1<<30), -1))
	}
	l, err := b.Logs(ctx, in.Machine, in.JobID, req)
	if err != nil {
		return RemoteJobLogsOut{}, "", err
	}
	out := RemoteJobLogsOut{LogDataOut: logData(l.JobID, l.Data),
		LogRangeOut: LogRangeOut{Offset: l.Offset, NextOffset: l.NextOffset, TotalBytes: l.TotalBytes}, State: l.State}
	return out, out.Data, nil
}

func (s *Server) remoteJobCancel(ctx context.Context, _ *mcp.CallToolRequest, in RemoteJobCancelIn) (RemoteJobOut, string, error) {
	b, err := s.remoteJobs()
	if err != nil {
		return RemoteJobOut{}, "", err
	}
	grace := jobmodel.DefaultGrace
	if in.GraceSeconds != nil {
		if grace, err = jobmodel.GraceSeconds(float64(*in.GraceSeconds)); err != nil {
			return RemoteJobOut{}, "", err
		}
	}
	j, err := b.Cancel(ctx, in.Machine, in.JobID, grace)
	if err != nil {
		return RemoteJobOut{}, "", err
	}
	out := remoteJobOut(j)
	return out, renderRemoteJob(out), nil
}
