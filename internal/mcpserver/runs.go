package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Durable runs: run, run_get, run_list, run_cancel, run_events, run_logs,
// run_artifact, run_batch, run_matrix, agent_compare, agent_test, batch_get.

// RunsBackend is what the run tools need of the run service; *runs.Service satisfies it.
type RunsBackend interface {
	Start(ctx context.Context, spec runs.Spec) (runs.Run, error)
	Wait(ctx context.Context, id string, timeout time.Duration) (runs.Run, error)
	Get(ctx context.Context, id string) (runs.Run, error)
	List(ctx context.Context, f runs.Filter) (runs.RunList, error)
	Cancel(ctx context.Context, id string) (runs.Run, error)
	Events(ctx context.Context, id string, after int64, limit int) (runs.EventList, error)
	Logs(ctx context.Context, id string, req runs.LogsRequest) (runs.Logs, error)
	OpenArtifact(ctx context.Context, runID, path string) (io.ReadCloser, runs.Artifact, error)
	StartBatch(ctx context.Context, req runs.BatchRequest) (runs.Batch, error)
	StartMatrix(ctx context.Context, req runs.MatrixRequest) (runs.Batch, error)
	AgentCompare(ctx context.Context, req runs.CompareRequest) (runs.Batch, error)
	AgentTest(ctx context.Context, req runs.CompareRequest) (runs.Batch, error)
	GetBatch(ctx context.Context, id string) (runs.Batch, error)
	WaitBatch(ctx context.Context, id string, timeout time.Duration) (runs.Batch, error)
	ListBatches(ctx context.Context, before string, limit int) (runs.BatchList, error)
	CancelBatch(ctx context.Context, id string) (runs.Batch, error)
}

var _ RunsBackend = (*runs.Service)(nil)

// Bounds of the run tools.
const (
	// MaxInlineArtifact is the largest artifact run_artifact returns inline (base64); larger
	// ones are only their URL and size.
	MaxInlineArtifact = 1 << 20
	// DefaultRunWait is how long run (and the batch tools) wait with wait true and no
	// wait_seconds.
	DefaultRunWait = 10 * time.Minute
	// runPollEvery is how often a waiting run reports its new events as progress.
	runPollEvery = 500 * time.Millisecond
)

// WaitIn are the wait arguments of the tools that start runs.
type WaitIn struct {
	Wait        bool   `json:"wait,omitempty" jsonschema:"Block until the run (or every run of the batch) settled, at most wait_seconds; default false: return at once with the id. A wait that runs out is not an error: the reply is the record as it is then (call run_get or batch_get later). With a progressToken, progress notifications report each phase as it changes."`
	WaitSeconds *int64 `json:"wait_seconds,omitempty" jsonschema:"How long wait blocks, 1-3600 seconds (default 600). Giving it implies wait."`
}

func (w WaitIn) timeout() (time.Duration, error) {
	if w.WaitSeconds != nil {
		if *w.WaitSeconds < 1 || *w.WaitSeconds > int64(runs.MaxWait/time.Second) {
			return 0, errcode.New(errcode.InvalidArgument, "wait_seconds must be between 1 and %d; got %d", int64(runs.MaxWait/time.Second), *w.WaitSeconds)
		}
		return time.Duration(*w.WaitSeconds) * time.Second, nil
	}
	if w.Wait {
		return DefaultRunWait, nil
	}
	return 0, nil
}

// ShapeIn is the sandbox a run gets.
type ShapeIn struct {
	Image          string              `json:"image,omitempty" jsonschema:"Root filesystem image: host (default) or an OCI image reference (python:3.12-slim), as sandbox_create's."`
	Runtime        string              `json:"runtime,omitempty" jsonschema:"Runtime by name (see health); default the server's."`
	CPU            float64             `json:"cpu,omitempty" jsonschema:"CPU limit in cores; default 1."`
	MemoryMB       int64               `json:"memory_mb,omitempty" jsonschema:"Memory limit in MiB; default 512."`
	DiskMB         int64               `json:"disk_mb,omitempty" jsonschema:"Disk size in MiB; default 1024."`
	Network        any                 `json:"network,omitempty"`
	Env            map[string]string   `json:"env,omitempty" jsonschema:"Environment variables for every phase."`
	Secrets        map[string]SecretIn `json:"secrets,omitempty" jsonschema:"Secrets by environment variable name, as sandbox_create's: {\"TOKEN\": {\"from\": \"env:TOKEN\", \"hosts\": [\"api.example.com\"]}}. The sandbox sees a placeholder; the value is swapped in by agentbox's proxy on requests to those hosts only."`
	TimeoutSeconds int64               `json:"timeout_seconds,omitempty" jsonschema:"Bound of the whole run in seconds (default 3600, at most 86400); past it the run is timed_out."`
	IdempotencyKey string              `json:"idempotency_key,omitempty" jsonschema:"A key of your choice: a retry with the same key returns the existing run (or batch) instead of doing the work twice, also after a server restart."`
}

// RunIn are run's arguments: a runs.Spec, and the wait.
type RunIn struct {
	RepoURL            string            `json:"repo_url,omitempty" jsonschema:"Repository checked out (shallow, at ref) into dir inside the sandbox: http(s)://… (its host is reachable for the checkout only), or file:// under a directory the server's operator allowed. Optional: a run can start from files or an image only."`
	Ref                string            `json:"ref,omitempty" jsonschema:"Branch, tag or commit of repo_url; default the remote's HEAD. The resolved commit is in the reply's commit."`
	RepoSecret         string            `json:"repo_secret,omitempty" jsonschema:"Name of one of secrets that authenticates the checkout (HTTP basic auth added by agentbox's proxy; never in the URL, argv or logs)."`
	Dir                string            `json:"dir,omitempty" jsonschema:"Working directory of every phase and the checkout's target; default /workspace."`
	Files              map[string]string `json:"files,omitempty" jsonschema:"Files written into dir before setup: relative path -> UTF-8 content (at most 256 files, 8 MiB in all)."`
	Setup              []string          `json:"setup,omitempty" jsonschema:"Argv run before the command (e.g. [\"pip\", \"install\", \"-e\", \".\"]); its failure skips the rest. Not a shell: use [\"sh\", \"-c\", \"...\"]."`
	Command            []string          `json:"command,omitempty" jsonschema:"The task's argv (e.g. [\"pytest\", \"-q\"]). Not a shell."`
	ValidationCommands [][]string        `json:"validation_commands,omitempty" jsonschema:"Argvs run after the command (even when it failed: they are diagnostics); any non-zero makes the run failed. At most 32."`
	Stdin              string            `json:"stdin,omitempty" jsonschema:"Given to the command on its standard input."`
	Artifacts          []string          `json:"artifacts,omitempty" jsonschema:"Paths or globs (*, ?, [..], ** across directories) relative to dir, collected after the validations and downloadable by URL (run_artifact). At most 100."`
	ShapeIn
	Requirements        *Requirements     `json:"requirements,omitempty" jsonschema:"Minimum guarantees (isolation, network), as sandbox_create's."`
	PhaseTimeoutSeconds map[string]int64  `json:"phase_timeout_seconds,omitempty" jsonschema:"Bounds of single phases in seconds by name: checkout, setup, command, validation, agent_build; each at most the run's."`
	Retention           string            `json:"retention,omitempty" jsonschema:"What happens to the sandbox once the run settled: destroy (default) or keep (for debugging: kept keep_ttl_seconds, its id in the reply's sandbox_id)."`
	KeepTTLSeconds      int64             `json:"keep_ttl_seconds,omitempty" jsonschema:"With retention keep: how long the sandbox is kept (default 1800, at most 86400)."`
	Labels              map[string]string `json:"labels,omitempty" jsonschema:"Free-form labels to find the run by (run_list labels)."`
	WaitIn
}

func (in RunIn) spec() (runs.Spec, error) {
	nw, err := networkArg(in.Network)
	if err != nil {
		return runs.Spec{}, err
	}
	sp := runs.Spec{RepoURL: in.RepoURL, Ref: in.Ref, RepoSecret: in.RepoSecret, Dir: in.Dir, Files: in.Files,
		Setup: in.Setup, Command: in.Command, ValidationCommands: in.ValidationCommands, Stdin: in.Stdin, Artifacts: in.Artifacts,
		Env: in.Env, Secrets: secretsArg(in.Secrets), Image: in.Image, Runtime: in.Runtime, CPU: in.CPU, MemoryMB: in.MemoryMB,
		DiskMB: in.DiskMB, Network: nw, TimeoutSeconds: in.TimeoutSeconds, PhaseTimeouts: in.PhaseTimeoutSeconds,
		Retention: in.Retention, KeepTTLSeconds: in.KeepTTLSeconds, Labels: in.Labels, IdempotencyKey: in.IdempotencyKey}
	if in.Requirements != nil {
		sp.Requirements = sandbox.Requirements{Isolation: in.Requirements.Isolation, Network: in.Requirements.Network}
	}
	return sp, nil
}

// RunIDIn names one run.
type RunIDIn struct {
	RunID string `json:"run_id" jsonschema:"The run's id, from run or run_list."`
}

// BatchIDIn names one batch.
type BatchIDIn struct {
	BatchID string `json:"batch_id" jsonschema:"The batch's id, from run_batch, run_matrix, agent_compare or agent_test."`
}

// RunListIn are run_list's arguments.
type RunListIn struct {
	State   []string          `json:"state,omitempty" jsonschema:"Only runs in these states."`
	BatchID string            `json:"batch_id,omitempty" jsonschema:"Only the runs of this batch."`
	Labels  map[string]string `json:"labels,omitempty" jsonschema:"Only runs with all these labels."`
	Before  string            `json:"before,omitempty" jsonschema:"Page: the previous reply's next."`
	Limit   *int64            `json:"limit,omitempty" jsonschema:"Runs per page, 1-1000 (default 20)."`
}

// RunEventsIn are run_events's arguments.
type RunEventsIn struct {
	RunID string `json:"run_id" jsonschema:"The run's id."`
	After *int64 `json:"after,omitempty" jsonschema:"Cursor: the events after this seq (the previous reply's next); default from the first."`
	Limit *int64 `json:"limit,omitempty" jsonschema:"Events per page, 1-1000 (default 100)."`
}

// RunLogsIn are run_logs's arguments.
type RunLogsIn struct {
	RunID    string `json:"run_id" jsonschema:"The run's id."`
	Phase    string `json:"phase,omitempty" jsonschema:"The phase's name as the record lists it (setup, command, validation[0], checkout, agent_build, …); default command."`
	Stream   string `json:"stream,omitempty" jsonschema:"stdout (default) or stderr."`
	Offset   *int64 `json:"offset,omitempty" jsonschema:"Byte offset to read from (>= 0); continue from the reply's next_offset."`
	MaxBytes *int64 `json:"max_bytes,omitempty" jsonschema:"Bytes per page, 1-1048576 (default 65536)."`
}

// RunArtifactIn are run_artifact's arguments.
type RunArtifactIn struct {
	RunID string `json:"run_id" jsonschema:"The run's id."`
	Path  string `json:"path" jsonschema:"The artifact's path as the run's artifacts list it."`
}

// RunBatchIn are run_batch's arguments.
type RunBatchIn struct {
	Runs           []map[string]any  `json:"runs" jsonschema:"The run specs, each as run's arguments (without wait). A spec that is refused is listed in submission_failures with its index and why; the others run. At most 256."`
	MaxParallel    int               `json:"max_parallel,omitempty" jsonschema:"Most runs of this batch at once, 1-64 (default 4), whatever the server's other load."`
	IdempotencyKey string            `json:"idempotency_key,omitempty" jsonschema:"A retry with the same key returns the existing batch."`
	Labels         map[string]string `json:"labels,omitempty" jsonschema:"Labels of the batch."`
	WaitIn
}

// RunMatrixIn are run_matrix's arguments.
type RunMatrixIn struct {
	Base           map[string]any    `json:"base" jsonschema:"The run spec every cell starts from, as run's arguments (without wait)."`
	Axes           map[string][]any  `json:"axes" jsonschema:"Field path -> values: each cell replaces the field at the path with one value, e.g. {\"image\": [\"python:3.11\", \"python:3.12\"], \"env.MODE\": [\"a\", \"b\"], \"command\": [[\"make\"], [\"make\", \"fast\"]]}. The cartesian product runs as a batch: at most 256 cells."`
	MaxParallel    int               `json:"max_parallel,omitempty" jsonschema:"Most cells at once, 1-64 (default 4)."`
	IdempotencyKey string            `json:"idempotency_key,omitempty" jsonschema:"A retry with the same key returns the existing batch."`
	Labels         map[string]string `json:"labels,omitempty" jsonschema:"Labels of the batch."`
	WaitIn
}

// AgentSideIn is one version of a coding agent.
type AgentSideIn struct {
	RepoURL    string `json:"repo_url" jsonschema:"The agent's repository (http(s) or an allowed file://)."`
	Ref        string `json:"ref,omitempty" jsonschema:"Branch, tag or commit; default HEAD. The resolved commit is reported."`
	RepoSecret string `json:"repo_secret,omitempty" jsonschema:"Name of one of secrets for a private agent repository."`
}

func (a *AgentSideIn) side() *runs.AgentSide {
	if a == nil {
		return nil
	}
	return &runs.AgentSide{RepoURL: a.RepoURL, Ref: a.Ref, RepoSecret: a.RepoSecret}
}

// AgentTestIn are agent_test's arguments (agent_compare's add baseline and repetitions).
type AgentTestIn struct {
	Candidate          AgentSideIn `json:"candidate" jsonschema:"The agent version to run."`
	Preset             string      `json:"preset,omitempty" jsonschema:"omp: the oh-my-pi conventions (agent at /workspace/omp, build bun install && bun run build, invocation /bin/sh /workspace/omp/packages/coding-agent/scripts/omp --print -- TASK). Omit to give agent_command."`
	TargetRepoURL      string      `json:"target_repo_url" jsonschema:"The repository the agent works on, checked out into /workspace/target."`
	TargetRef          string      `json:"target_ref,omitempty" jsonschema:"Its branch, tag or commit."`
	TargetRepoSecret   string      `json:"target_repo_secret,omitempty" jsonschema:"Name of one of secrets for a private target repository."`
	Task               string      `json:"task" jsonschema:"The task given to the agent (one literal argument for the preset; on stdin and in OMP_TASK and AGENT_TASK for agent_command)."`
	BuildCommand       []string    `json:"build_command,omitempty" jsonschema:"Argv that builds the agent in its directory; [\"true\"] skips the build."`
	SetupCommand       []string    `json:"setup_command,omitempty" jsonschema:"Argv that prepares the target before the agent runs."`
	AgentCommand       []string    `json:"agent_command,omitempty" jsonschema:"Argv that runs the agent (overrides the preset's invocation), in the target's directory."`
	ValidationCommands [][]string  `json:"validation_commands,omitempty" jsonschema:"Argvs that check the agent's work, in the target's directory."`
	KeepSandbox        bool        `json:"keep_sandbox,omitempty" jsonschema:"agent_test only: keep the sandbox for keep_ttl_seconds to look into it."`
	KeepTTLSeconds     int64       `json:"keep_ttl_seconds,omitempty" jsonschema:"How long a kept sandbox lives (default 1800)."`
	MaxParallel        int         `json:"max_parallel,omitempty" jsonschema:"Most runs at once, 1-64 (default 4)."`
	ShapeIn
	WaitIn
}

// AgentCompareIn are agent_compare's arguments.
type AgentCompareIn struct {
	Baseline    AgentSideIn `json:"baseline" jsonschema:"The reference version of the agent."`
	Repetitions int         `json:"repetitions,omitempty" jsonschema:"Runs per side, each in its own clean sandbox of the same shape, 1-16 (default 1)."`
	AgentTestIn
}

func (in AgentTestIn) request(baseline *AgentSideIn, reps int) (runs.CompareRequest, error) {
	nw, err := networkArg(in.Network)
	if err != nil {
		return runs.CompareRequest{}, err
	}
	return runs.CompareRequest{Baseline: baseline.side(), Candidate: *in.Candidate.side(), Preset: in.Preset,
		TargetRepoURL: in.TargetRepoURL, TargetRef: in.TargetRef, TargetRepoSecret: in.TargetRepoSecret, Task: in.Task,
		BuildCommand: in.BuildCommand, SetupCommand: in.SetupCommand, AgentCommand: in.AgentCommand,
		ValidationCommands: in.ValidationCommands, Repetitions: reps, MaxParallel: in.MaxParallel,
		KeepSandbox: in.KeepSandbox, KeepTTLSeconds: in.KeepTTLSeconds, Image: in.Image, Runtime: in.Runtime, CPU: in.CPU,
		MemoryMB: in.MemoryMB, DiskMB: in.DiskMB, Network: nw, Env: in.Env, Secrets: secretsArg(in.Secrets),
		TimeoutSeconds: in.TimeoutSeconds, IdempotencyKey: in.IdempotencyKey}, nil
}

// Replies. Run records keep their nulls (unknown times and exit codes are null, never 0):
// their output schemas are inferred without dropping "null" (rawOutput).

// RunOut is a run's record (runs.Run).
type RunOut runs.Run

// RunListOut is run_list's reply.
type RunListOut struct {
	Runs []RunOut `json:"runs"`
	Next string   `json:"next,omitempty"`
}

// RunEventsOut is run_events's reply.
type RunEventsOut runs.EventList

// BatchOut is a batch's record (runs.Batch).
type BatchOut runs.Batch

func (RunOut) rawOutput()       {}
func (RunListOut) rawOutput()   {}
func (RunEventsOut) rawOutput() {}
func (BatchOut) rawOutput()     {}

// RunLogsOut is run_logs's reply.
type RunLogsOut struct {
	RunID      string `json:"run_id" jsonschema:"The run's id."`
	Phase      string `json:"phase" jsonschema:"The phase."`
	Stream     string `json:"stream" jsonschema:"stdout or stderr."`
	Data       string `json:"data" jsonschema:"The slice as UTF-8 text (bytes that are not UTF-8 replaced by U+FFFD; data_base64 then has the exact bytes)."`
	DataBase64 string `json:"data_base64,omitempty" jsonschema:"The exact bytes in standard base64; only when they are not valid UTF-8."`
	Offset     int64  `json:"offset" jsonschema:"Where the slice starts."`
	NextOffset int64  `json:"next_offset" jsonschema:"Pass as offset to read on."`
	TotalBytes int64  `json:"total_bytes" jsonschema:"The output's size now."`
	Truncated  bool   `json:"truncated" jsonschema:"The phase wrote more than 16 MiB; the rest was not kept."`
	Complete   bool   `json:"complete" jsonschema:"The phase ended: there will be no more."`
}

// RunArtifactOut is run_artifact's reply.
type RunArtifactOut struct {
	RunID         string    `json:"run_id" jsonschema:"The run's id."`
	Path          string    `json:"path" jsonschema:"The artifact's path."`
	Size          int64     `json:"size" jsonschema:"Its size in bytes."`
	SHA256        string    `json:"sha256" jsonschema:"Its SHA-256 (hex)."`
	URL           string    `json:"url" jsonschema:"A signed download URL (no token needed) valid until expires_at."`
	ExpiresAt     time.Time `json:"expires_at" jsonschema:"When url stops working (RFC 3339)."`
	Inline        bool      `json:"inline" jsonschema:"True when content_base64 holds the file (at most 1 MiB); larger files are only their URL."`
	ContentBase64 string    `json:"content_base64,omitempty" jsonschema:"The file's bytes in standard base64 (inline only)."`
}

// rawOutputSchema infers Out's schema keeping nullable types (run records).
func rawOutputSchema(t reflect.Type) *jsonschema.Schema {
	ts := map[reflect.Type]*jsonschema.Schema{json_RawMessage: {Description: "Any JSON value."}}
	for k, v := range typeSchemas {
		ts[k] = v
	}
	s, err := jsonschema.ForType(t, &jsonschema.ForOptions{TypeSchemas: ts})
	if err != nil {
		panic(fmt.Sprintf("mcpserver: schema for %s: %v", t, err))
	}
	return s
}

var json_RawMessage = reflect.TypeFor[json.RawMessage]()

const (
	errRunNotFound = "RUN_NOT_FOUND (no run or batch of that id: check run_list)"
	errNoRuns      = "UNSUPPORTED_OPERATION (this server has no run service)"
	runStatesDoc   = "queued → preparing → running → validating → collecting → cleaning → succeeded | failed (a phase exited non-zero: an outcome, not an error) | errored (agentbox could not do its part; reason says why) | canceled | timed_out"
)

var runStates = []any{"queued", "preparing", "running", "validating", "collecting", "cleaning", "succeeded", "failed", "errored", "canceled", "timed_out"}

func tweakWait(in *jsonschema.Schema) {
	in.Properties["wait_seconds"].Minimum, in.Properties["wait_seconds"].Maximum = ptr(1.0), ptr(runs.MaxWait.Seconds())
}

func tweakShape(in *jsonschema.Schema) {
	tweakCreateNetwork(in)
	in.Properties["network"].Description = "The run's network: \"none\" (default) or {\"allow\": [...], \"deny\": [...]} as sandbox_create's. The repository's host is allowed for the checkout only."
	in.Properties["timeout_seconds"].Minimum, in.Properties["timeout_seconds"].Maximum = ptr(0.0), ptr(runs.MaxTimeout.Seconds())
	tweakWait(in)
}

func tweakAgent(in *jsonschema.Schema) {
	tweakShape(in)
	in.Properties["preset"].Enum = []any{"omp"}
	in.Properties["max_parallel"].Minimum, in.Properties["max_parallel"].Maximum = ptr(0.0), ptr(64.0)
}

func (s *Server) addRunTools() {
	addTool(s, &mcp.Tool{
		Name:  "run",
		Title: "Run a task to completion",
		Description: `Run one self-contained task as a durable record: a fresh sandbox, the repository checked out (repo_url at ref), files written, setup, the command, the validation commands, changed files and artifacts collected, the sandbox destroyed. The server executes it; it survives this call, the conversation and a server restart.
Arguments (all optional, but give a command or validation_commands): repo_url, ref, repo_secret, dir, files, setup, command, validation_commands, stdin, artifacts, env, secrets, image, runtime, cpu, memory_mb, disk_mb, network, requirements, timeout_seconds, phase_timeout_seconds, retention (destroy|keep), keep_ttl_seconds, labels, idempotency_key, wait, wait_seconds. Every command is an argv, never a shell string.
Reply: the run {run_id, state, reason, commit, phases: [{name, state, exit_code, stdout, stderr (last 16 KiB each), started_at, finished_at, duration_ms}], changed_files: [{path, status}], diff, diff_stat, artifacts: [{path, size, sha256, url, expires_at}], sandbox_id, cleanup_failed, started_at, finished_at, duration_ms, success}. Unknown times and exit codes are null.
States: ` + runStatesDoc + `. Without wait the reply is queued at once: follow it with run_get or run_events.
` + errorsDoc(errInvalid, "CONFLICT (idempotency_key already used for a different spec)", errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "Run a task to completion", DestructiveHint: ptr(false), OpenWorldHint: ptr(true)},
	}, func(in *jsonschema.Schema) {
		tweakShape(in)
		in.Properties["retention"].Enum = []any{runs.RetentionDestroy, runs.RetentionKeep}
		in.Properties["requirements"].Properties["isolation"].Enum = []any{"process", "kernel", "vm"}
		in.Properties["requirements"].Properties["network"].Enum = []any{"none", "egress"}
		in.Properties["validation_commands"].MaxItems = ptr(runs.MaxValidations)
		in.Properties["artifacts"].MaxItems = ptr(runs.MaxArtifacts)
	}, s.runStart)

	addTool(s, &mcp.Tool{
		Name:        "run_get",
		Title:       "A run's record",
		Description: "Get a run's record (as run's reply; artifact URLs freshly signed). Arguments: run_id.\n" + errorsDoc(errRunNotFound, errInvalid, errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "A run's record", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.runGet)

	addTool(s, &mcp.Tool{
		Name:  "run_list",
		Title: "List runs",
		Description: `List runs, newest first. Arguments: state (states to keep), batch_id, labels, before (the previous page's next), limit (1-1000, default 20).
Reply: {runs: [run…], next} — pass next as before for the following page; no next: the last page.
` + errorsDoc(errInvalid, errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "List runs", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["state"].Items.Enum = runStates
		in.Properties["limit"].Minimum, in.Properties["limit"].Maximum = ptr(1.0), ptr(float64(runs.MaxList))
	}, s.runList)

	addTool(s, &mcp.Tool{
		Name:  "run_cancel",
		Title: "Cancel a run",
		Description: `Cancel a run: a queued run is canceled at once; a running phase's command is stopped, what exists is collected, the sandbox is cleaned up and the run settles canceled. Canceling a settled run returns it unchanged. Arguments: run_id.
Reply: the run (cancel_requested true until the worker acted).
` + errorsDoc(errRunNotFound, errInvalid, errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "Cancel a run", DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.runCancel)

	addTool(s, &mcp.Tool{
		Name:  "run_events",
		Title: "A run's transitions",
		Description: `Page a run's events, oldest first: every state transition and phase start or end, each written before it acted. Arguments: run_id, after (cursor), limit (1-1000, default 100).
Reply: {run_id, events: [{seq, time, from, to, phase, reason}], next} — pass next as after to continue.
` + errorsDoc(errRunNotFound, errInvalid, errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "A run's transitions", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["after"].Minimum = ptr(0.0)
		in.Properties["limit"].Minimum, in.Properties["limit"].Maximum = ptr(1.0), ptr(float64(runs.MaxEventsPage))
	}, s.runEvents)

	addTool(s, &mcp.Tool{
		Name:  "run_logs",
		Title: "Read a run's output",
		Description: `Read a bounded slice of one phase's whole output (the record keeps only the last 16 KiB of each stream; this keeps up to 16 MiB). Arguments: run_id, phase (default command), stream (stdout|stderr), offset, max_bytes (1-1048576, default 65536).
Reply: {run_id, phase, stream, data, data_base64?, offset, next_offset, total_bytes, truncated, complete}. Page by passing next_offset as offset until next_offset == total_bytes and complete.
` + errorsDoc(errRunNotFound, errInvalid, errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "Read a run's output", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["stream"].Enum = []any{"stdout", "stderr"}
		in.Properties["offset"].Minimum = ptr(0.0)
		in.Properties["max_bytes"].Minimum, in.Properties["max_bytes"].Maximum = ptr(1.0), ptr(float64(runs.MaxLogPage))
	}, s.runLogs)

	addTool(s, &mcp.Tool{
		Name:  "run_artifact",
		Title: "Fetch a run's artifact",
		Description: `Fetch one artifact of a run: files up to 1 MiB come back inline (content_base64); larger ones only as their signed URL and size (download it with curl, no token needed, until expires_at). Arguments: run_id, path (as the run's artifacts list it).
Reply: {run_id, path, size, sha256, url, expires_at, inline, content_base64?}.
` + errorsDoc(errRunNotFound, "FILE_NOT_FOUND (the run has no artifact of that path: see its artifacts)", "LINK_EXPIRED (the artifact is no longer kept: retention or the budget removed it)", errInvalid, errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "Fetch a run's artifact", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) { in.Properties["path"].MinLength = ptr(1) }, s.runArtifact)

	batchReply := `Reply: the batch {batch_id, kind, max_parallel, runs: [{run_id, index, state, reason}], submission_failures: [{index, error, code}], counts (runs by state), settled, created_at, settled_at}`
	addTool(s, &mcp.Tool{
		Name:  "run_batch",
		Title: "Run a batch of tasks",
		Description: `Run many tasks under one parallelism bound: never more than max_parallel (1-64, default 4) of the batch at once, whatever the server's other load. Arguments: runs (each spec as run's arguments, at most 256), max_parallel, idempotency_key, labels, wait, wait_seconds.
A spec that is refused (bad input) is listed in submission_failures with its index and reason, never dropped and never turned into a failed run; the others run.
` + batchReply + `. Follow it with batch_get, run_list batch_id, run_get.
` + errorsDoc(errInvalid, errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "Run a batch of tasks", DestructiveHint: ptr(false), OpenWorldHint: ptr(true)},
	}, func(in *jsonschema.Schema) {
		tweakWait(in)
		in.Properties["runs"].MinItems, in.Properties["runs"].MaxItems = ptr(1), ptr(runs.MaxBatchRuns)
		in.Properties["max_parallel"].Minimum, in.Properties["max_parallel"].Maximum = ptr(0.0), ptr(64.0)
	}, s.runBatch)

	addTool(s, &mcp.Tool{
		Name:  "run_matrix",
		Title: "Run a matrix of variants",
		Description: `Run one base spec over the cartesian product of axes (at most 256 cells), as a batch. Arguments: base (a spec as run's arguments), axes ({"field.path": [values…]}: "image", "env.MODE", "command", …), max_parallel, idempotency_key, labels, wait, wait_seconds.
` + batchReply + `, plus matrix: [{values (by axis), run_id, state, exit_codes (by phase)}] and axes (the axis keys, sorted): the results as a table.
` + errorsDoc(errInvalid+"; more than 256 cells is INVALID_ARGUMENT and nothing runs", errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "Run a matrix of variants", DestructiveHint: ptr(false), OpenWorldHint: ptr(true)},
	}, func(in *jsonschema.Schema) {
		tweakWait(in)
		in.Properties["max_parallel"].Minimum, in.Properties["max_parallel"].Maximum = ptr(0.0), ptr(64.0)
	}, s.runMatrix)

	agentDoc := `Each run: the agent at its ref checked out into /workspace/agent (preset omp: /workspace/omp) and built (build_command), the target checked out into /workspace/target and prepared (setup_command), the agent run with the task (preset or agent_command), the validation commands run. Reply: the batch (as run_batch's) with comparison: {task, invocation, sides: [{side, repo_url, ref, repetitions: [{run_id, state, agent_commit, target_commit, build, setup, task, validations (each {state, exit_code, duration_ms}), diff_stat, changed_files, cleanup_failed, summary, sandbox_id}], counts, passed, median_task_ms}]}. Measurements only: it never picks a winner.`
	addTool(s, &mcp.Tool{
		Name:  "agent_compare",
		Title: "Compare two versions of a coding agent",
		Description: `Run two versions of a coding agent (baseline and candidate: repo_url + ref each) on the same task against the same target repository, repetitions times each (1-16, each in its own clean sandbox of the same shape, interleaved so both see the same load), as one bounded batch.
` + agentDoc + `
` + errorsDoc(errInvalid, errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "Compare two versions of a coding agent", DestructiveHint: ptr(false), OpenWorldHint: ptr(true)},
	}, func(in *jsonschema.Schema) {
		tweakAgent(in)
		in.Properties["repetitions"].Minimum, in.Properties["repetitions"].Maximum = ptr(0.0), ptr(float64(runs.MaxRepetitions))
	}, s.agentCompare)

	addTool(s, &mcp.Tool{
		Name:  "agent_test",
		Title: "Test one version of a coding agent",
		Description: `Run one version of a coding agent (candidate: repo_url + ref) on a task against a target repository: agent_compare's single-side form, with keep_sandbox allowed (the sandbox stays keep_ttl_seconds for you to look into).
` + agentDoc + `
` + errorsDoc(errInvalid, errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "Test one version of a coding agent", DestructiveHint: ptr(false), OpenWorldHint: ptr(true)},
	}, tweakAgent, s.agentTest)

	addTool(s, &mcp.Tool{
		Name:  "batch_get",
		Title: "A batch's record",
		Description: `Get a batch's record (run_batch, run_matrix, agent_compare or agent_test) with its runs' current states, counts, and its matrix table or comparison filled. Arguments: batch_id.
` + errorsDoc(errRunNotFound, errInvalid, errNoRuns),
		Annotations: &mcp.ToolAnnotations{Title: "A batch's record", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.batchGet)
}

// runsOr returns the run service, or UNSUPPORTED_OPERATION.
func (s *Server) runsOr() (RunsBackend, error) {
	if s.opts.Runs == nil {
		return nil, errcode.New(errcode.UnsupportedOp, "this agentbox server has no run service (durable runs are served by agentbox serve and agentbox mcp)")
	}
	return s.opts.Runs, nil
}

// LocalRunOwner owns the runs started through an MCP server whose transport names no caller
// (agentbox mcp on stdio, in process).
const LocalRunOwner = "mcp-local"

// owned carries the runs' owner to the run service. Runs are durable records, so their owner is
// the principal, not the MCP session (sandbox_create's): the bearer token's owner when the
// transport has one (serve's /mcp, as REST calls), else LocalRunOwner. An idempotency_key so
// holds across sessions and restarts of the client.
func (s *Server) owned(ctx context.Context, _ *mcp.CallToolRequest) context.Context {
	if sandbox.OwnerFrom(ctx) != "" {
		return ctx
	}
	return sandbox.WithOwner(ctx, LocalRunOwner)
}

// runOut fills a record's lists so that none is null.
func runOut(r runs.Run) RunOut {
	r = r.Redacted() // env values never leave the record
	if r.Phases == nil {
		r.Phases = []runs.Phase{}
	}
	if r.ChangedFiles == nil {
		r.ChangedFiles = []runs.ChangedFile{}
	}
	if r.Artifacts == nil {
		r.Artifacts = []runs.Artifact{}
	}
	return RunOut(r)
}

func batchOut(b runs.Batch) BatchOut {
	if b.Runs == nil {
		b.Runs = []runs.BatchRun{}
	}
	if b.SubmissionFailures == nil {
		b.SubmissionFailures = []runs.SubmissionFailure{}
	}
	return BatchOut(b)
}

func exitStr(c *int) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprint(*c)
}

func durStr(ms *int64) string {
	if ms == nil {
		return "-"
	}
	return (time.Duration(*ms) * time.Millisecond).String()
}

// renderRun is a run in words: state, phases, changes, artifacts.
func renderRun(r RunOut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s: %s", r.ID, r.State)
	if r.Reason != "" {
		fmt.Fprintf(&b, " — %s", r.Reason)
	}
	if r.Commit != "" {
		fmt.Fprintf(&b, "\ncommit %s", r.Commit)
	}
	for _, p := range r.Phases {
		fmt.Fprintf(&b, "\n  %-14s %-11s exit %s  %s", p.Name, p.State, exitStr(p.ExitCode), durStr(p.DurationMs))
		if p.Error != "" {
			fmt.Fprintf(&b, "  (%s)", p.Error)
		}
	}
	if len(r.ChangedFiles) > 0 {
		fmt.Fprintf(&b, "\nchanged files (%d):", len(r.ChangedFiles))
		for i, f := range r.ChangedFiles {
			if i == 20 {
				fmt.Fprintf(&b, "\n  … %d more", len(r.ChangedFiles)-20)
				break
			}
			fmt.Fprintf(&b, "\n  %s %s", f.Status, f.Path)
		}
	}
	for _, a := range r.Artifacts {
		fmt.Fprintf(&b, "\nartifact %s (%d bytes): %s", a.Path, a.Size, a.URL)
	}
	if r.SandboxKept {
		fmt.Fprintf(&b, "\nsandbox %s kept", r.SandboxID)
	}
	if r.CleanupFailed {
		fmt.Fprintf(&b, "\ncleanup FAILED: %s", r.CleanupError)
	}
	return b.String()
}

func renderBatch(b BatchOut) string {
	var s strings.Builder
	fmt.Fprintf(&s, "batch %s (%s, max_parallel %d): %d runs, settled %v", b.ID, b.Kind, b.MaxParallel, len(b.Runs), b.Settled)
	states := make([]string, 0, len(b.Counts))
	for st, n := range b.Counts {
		states = append(states, fmt.Sprintf("%s %d", st, n))
	}
	slices.Sort(states)
	if len(states) > 0 {
		fmt.Fprintf(&s, "\ncounts: %s", strings.Join(states, ", "))
	}
	for i, r := range b.Runs {
		if i == 50 {
			fmt.Fprintf(&s, "\n… %d more runs", len(b.Runs)-50)
			break
		}
		fmt.Fprintf(&s, "\n  [%d] %s %s", r.Index, r.RunID, r.State)
	}
	for _, f := range b.SubmissionFailures {
		fmt.Fprintf(&s, "\nsubmission failure [%d] %s: %s", f.Index, f.Code, f.Error)
	}
	return s.String()
}

func (s *Server) runStart(ctx context.Context, call *mcp.CallToolRequest, in RunIn) (RunOut, string, error) {
	rb, err := s.runsOr()
	if err != nil {
		return RunOut{}, "", err
	}
	wait, err := in.timeout()
	if err != nil {
		return RunOut{}, "", err
	}
	sp, err := in.spec()
	if err != nil {
		return RunOut{}, "", err
	}
	ctx = s.owned(ctx, call)
	r, err := rb.Start(ctx, sp)
	if err != nil {
		return RunOut{}, "", err
	}
	if wait > 0 && !r.State.Settled() {
		if r, err = s.waitRun(ctx, call, rb, r.ID, wait); err != nil {
			return RunOut{}, "", err
		}
	}
	out := runOut(r)
	return out, renderRun(out), nil
}

// waitRun waits for a run; with a progress token, it polls the run's events every 500 ms and
// reports each as a progress notification.
func (s *Server) waitRun(ctx context.Context, call *mcp.CallToolRequest, rb RunsBackend, id string, wait time.Duration) (runs.Run, error) {
	var tok any
	if call != nil && call.Session != nil {
		tok = call.Params.GetProgressToken()
	}
	if tok == nil {
		return rb.Wait(ctx, id, wait)
	}
	deadline := time.Now().Add(wait)
	var after int64
	n := 0
	for {
		// The record first, then its events: every transition up to the state read is among
		// them, so a run that settled is reported through its last event before the reply.
		r, err := rb.Get(ctx, id)
		if err != nil {
			return r, err
		}
		for {
			l, err := rb.Events(ctx, id, after, runs.MaxEventsPage)
			if err != nil {
				return runs.Run{}, err
			}
			for _, ev := range l.Events {
				n++
				msg := fmt.Sprintf("%s → %s", ev.From, ev.To)
				if ev.From == "" {
					msg = string(ev.To)
				}
				if ev.Phase != "" {
					msg += " [" + ev.Phase + "]"
				}
				if ev.Reason != "" {
					msg += ": " + ev.Reason
				}
				if err := call.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(n), Message: msg}); err != nil && ctx.Err() == nil {
					s.log.Debug("progress notification failed", "err", err)
				}
				after = ev.Seq
			}
			if l.Next > after {
				after = l.Next
			}
			if len(l.Events) < runs.MaxEventsPage {
				break
			}
		}
		if r.State.Settled() || !time.Now().Before(deadline) {
			return r, nil
		}
		select {
		case <-ctx.Done():
			return r, nil
		case <-time.After(min(runPollEvery, time.Until(deadline))):
		}
	}
}

func (s *Server) runGet(ctx context.Context, call *mcp.CallToolRequest, in RunIDIn) (RunOut, string, error) {
	rb, err := s.runsOr()
	if err != nil {
		return RunOut{}, "", err
	}
	r, err := rb.Get(s.owned(ctx, call), in.RunID)
	if err != nil {
		return RunOut{}, "", err
	}
	out := runOut(r)
	return out, renderRun(out), nil
}

func (s *Server) runCancel(ctx context.Context, call *mcp.CallToolRequest, in RunIDIn) (RunOut, string, error) {
	rb, err := s.runsOr()
	if err != nil {
		return RunOut{}, "", err
	}
	r, err := rb.Cancel(s.owned(ctx, call), in.RunID)
	if err != nil {
		return RunOut{}, "", err
	}
	out := runOut(r)
	return out, renderRun(out), nil
}

func (s *Server) runList(ctx context.Context, call *mcp.CallToolRequest, in RunListIn) (RunListOut, string, error) {
	rb, err := s.runsOr()
	if err != nil {
		return RunListOut{}, "", err
	}
	f := runs.Filter{BatchID: in.BatchID, Labels: in.Labels, Before: in.Before}
	for _, st := range in.State {
		f.States = append(f.States, runs.State(st))
	}
	if in.Limit != nil {
		if *in.Limit < 1 || *in.Limit > runs.MaxList {
			return RunListOut{}, "", errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", runs.MaxList, *in.Limit)
		}
		f.Limit = int(*in.Limit)
	}
	ctx = s.owned(ctx, call)
	f.Owner = authz.ListOwner(ctx) // the caller's principal's runs, an admin's all (over REST the server applies its own)
	l, err := rb.List(ctx, f)
	if err != nil {
		return RunListOut{}, "", err
	}
	out := RunListOut{Runs: []RunOut{}, Next: l.Next}
	var b strings.Builder
	for _, r := range l.Runs {
		out.Runs = append(out.Runs, runOut(r))
		fmt.Fprintf(&b, "%s %s %s %q\n", r.ID, r.State, r.CreatedAt.Format(time.RFC3339), r.Spec.Command)
	}
	fmt.Fprintf(&b, "%d runs", len(out.Runs))
	if out.Next != "" {
		fmt.Fprintf(&b, "; more: before=%s", out.Next)
	}
	return out, b.String(), nil
}

func (s *Server) runEvents(ctx context.Context, call *mcp.CallToolRequest, in RunEventsIn) (RunEventsOut, string, error) {
	rb, err := s.runsOr()
	if err != nil {
		return RunEventsOut{}, "", err
	}
	var after int64
	if in.After != nil {
		if *in.After < 0 {
			return RunEventsOut{}, "", errcode.New(errcode.InvalidArgument, "after must be >= 0; got %d", *in.After)
		}
		after = *in.After
	}
	limit := 100
	if in.Limit != nil {
		if *in.Limit < 1 || *in.Limit > runs.MaxEventsPage {
			return RunEventsOut{}, "", errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", runs.MaxEventsPage, *in.Limit)
		}
		limit = int(*in.Limit)
	}
	l, err := rb.Events(s.owned(ctx, call), in.RunID, after, limit)
	if err != nil {
		return RunEventsOut{}, "", err
	}
	if l.Events == nil {
		l.Events = []runs.Event{}
	}
	var b strings.Builder
	for _, ev := range l.Events {
		fmt.Fprintf(&b, "%d %s %s→%s %s %s\n", ev.Seq, ev.Time.Format(time.RFC3339Nano), ev.From, ev.To, ev.Phase, ev.Reason)
	}
	fmt.Fprintf(&b, "%d events; next %d", len(l.Events), l.Next)
	return RunEventsOut(l), b.String(), nil
}

func (s *Server) runLogs(ctx context.Context, call *mcp.CallToolRequest, in RunLogsIn) (RunLogsOut, string, error) {
	rb, err := s.runsOr()
	if err != nil {
		return RunLogsOut{}, "", err
	}
	req := runs.LogsRequest{Phase: in.Phase, Stream: in.Stream}
	if in.Offset != nil {
		if *in.Offset < 0 {
			return RunLogsOut{}, "", errcode.New(errcode.InvalidArgument, "offset must be >= 0; got %d", *in.Offset)
		}
		req.Offset = *in.Offset
	}
	if in.MaxBytes != nil {
		if *in.MaxBytes < 1 || *in.MaxBytes > runs.MaxLogPage {
			return RunLogsOut{}, "", errcode.New(errcode.InvalidArgument, "max_bytes must be between 1 and %d; got %d", runs.MaxLogPage, *in.MaxBytes)
		}
		req.MaxBytes = *in.MaxBytes
	}
	l, err := rb.Logs(s.owned(ctx, call), in.RunID, req)
	if err != nil {
		return RunLogsOut{}, "", err
	}
	out := RunLogsOut{RunID: l.RunID, Phase: l.Phase, Stream: l.Stream, Data: strings.ToValidUTF8(string(l.Data), "\uFFFD"),
		Offset: l.Offset, NextOffset: l.NextOffset, TotalBytes: l.TotalBytes, Truncated: l.Truncated, Complete: l.Complete}
	if !utf8.Valid(l.Data) {
		out.DataBase64 = base64.StdEncoding.EncodeToString(l.Data)
	}
	text := out.Data + fmt.Sprintf("\n[run_logs %s %s: bytes %d-%d of %d; complete %v]", out.Phase, out.Stream, out.Offset, out.NextOffset, out.TotalBytes, out.Complete)
	return out, text, nil
}

func (s *Server) runArtifact(ctx context.Context, call *mcp.CallToolRequest, in RunArtifactIn) (RunArtifactOut, string, error) {
	rb, err := s.runsOr()
	if err != nil {
		return RunArtifactOut{}, "", err
	}
	ctx = s.owned(ctx, call)
	r, err := rb.Get(ctx, in.RunID)
	if err != nil {
		return RunArtifactOut{}, "", err
	}
	i := slices.IndexFunc(r.Artifacts, func(a runs.Artifact) bool { return a.Path == in.Path })
	if i < 0 {
		var have []string
		for _, a := range r.Artifacts {
			have = append(have, a.Path)
		}
		return RunArtifactOut{}, "", errcode.New(errcode.FileNotFound, "run %s has no artifact %q; its artifacts: %q", r.ID, in.Path, have)
	}
	a := r.Artifacts[i]
	out := RunArtifactOut{RunID: r.ID, Path: a.Path, Size: a.Size, SHA256: a.SHA256, URL: a.URL, ExpiresAt: a.ExpiresAt}
	if a.Size > MaxInlineArtifact {
		return out, fmt.Sprintf("artifact %s of %s: %d bytes (over 1 MiB: not inline); download: %s (until %s)", a.Path, r.ID, a.Size, a.URL, a.ExpiresAt.Format(time.RFC3339)), nil
	}
	rc, _, err := rb.OpenArtifact(ctx, r.ID, a.Path)
	if err != nil {
		return RunArtifactOut{}, "", err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxInlineArtifact+1))
	if err != nil {
		return RunArtifactOut{}, "", errcode.Wrap(errcode.Internal, err, "read artifact %s of %s: %v", a.Path, r.ID, err)
	}
	if len(data) > MaxInlineArtifact {
		return out, fmt.Sprintf("artifact %s of %s is over 1 MiB: download: %s", a.Path, r.ID, a.URL), nil
	}
	out.Inline, out.ContentBase64, out.Size = true, base64.StdEncoding.EncodeToString(data), int64(len(data))
	text := fmt.Sprintf("artifact %s of %s: %d bytes, sha256 %s, inline as content_base64", a.Path, r.ID, len(data), a.SHA256)
	if utf8.Valid(data) && len(data) <= 64<<10 {
		text += ":\n" + string(data)
	}
	return out, text, nil
}

// startBatch starts a batch and waits as in says; with a progress token, it reports the
// batch's counts as they change.
func (s *Server) startBatch(ctx context.Context, call *mcp.CallToolRequest, w WaitIn, start func(context.Context, RunsBackend) (runs.Batch, error)) (BatchOut, string, error) {
	rb, err := s.runsOr()
	if err != nil {
		return BatchOut{}, "", err
	}
	wait, err := w.timeout()
	if err != nil {
		return BatchOut{}, "", err
	}
	ctx = s.owned(ctx, call)
	b, err := start(ctx, rb)
	if err != nil {
		return BatchOut{}, "", err
	}
	if wait > 0 && !b.Settled {
		var tok any
		if call != nil && call.Session != nil {
			tok = call.Params.GetProgressToken()
		}
		if tok == nil {
			b, err = rb.WaitBatch(ctx, b.ID, wait)
		} else {
			b, err = s.pollBatch(ctx, call, tok, rb, b.ID, wait)
		}
		if err != nil {
			return BatchOut{}, "", err
		}
	}
	out := batchOut(b)
	return out, renderBatch(out), nil
}

func (s *Server) pollBatch(ctx context.Context, call *mcp.CallToolRequest, tok any, rb RunsBackend, id string, wait time.Duration) (runs.Batch, error) {
	deadline := time.Now().Add(wait)
	last, n := "", 0
	for {
		b, err := rb.GetBatch(ctx, id)
		if err != nil {
			return b, err
		}
		var parts []string
		for st, c := range b.Counts {
			parts = append(parts, fmt.Sprintf("%s %d", st, c))
		}
		slices.Sort(parts)
		if msg := strings.Join(parts, ", "); msg != last {
			last, n = msg, n+1
			if err := call.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(n), Message: "batch " + id + ": " + msg}); err != nil && ctx.Err() == nil {
				s.log.Debug("progress notification failed", "err", err)
			}
		}
		if b.Settled || !time.Now().Before(deadline) {
			return b, nil
		}
		select {
		case <-ctx.Done():
			return b, nil
		case <-time.After(min(runPollEvery, time.Until(deadline))):
		}
	}
}

func (s *Server) runBatch(ctx context.Context, call *mcp.CallToolRequest, in RunBatchIn) (BatchOut, string, error) {
	req := runs.BatchRequest{MaxParallel: in.MaxParallel, IdempotencyKey: in.IdempotencyKey, Labels: in.Labels}
	for _, r := range in.Runs {
		raw, err := json.Marshal(r)
		if err != nil {
			return BatchOut{}, "", errcode.New(errcode.InvalidArgument, "runs: %v", err)
		}
		req.Runs = append(req.Runs, raw)
	}
	return s.startBatch(ctx, call, in.WaitIn, func(ctx context.Context, rb RunsBackend) (runs.Batch, error) { return rb.StartBatch(ctx, req) })
}

func (s *Server) runMatrix(ctx context.Context, call *mcp.CallToolRequest, in RunMatrixIn) (BatchOut, string, error) {
	base, err := json.Marshal(in.Base)
	if err != nil {
		return BatchOut{}, "", errcode.New(errcode.InvalidArgument, "base: %v", err)
	}
	req := runs.MatrixRequest{Base: base, Axes: map[string][]json.RawMessage{}, MaxParallel: in.MaxParallel, IdempotencyKey: in.IdempotencyKey, Labels: in.Labels}
	for k, vs := range in.Axes {
		for _, v := range vs {
			raw, err := json.Marshal(v)
			if err != nil {
				return BatchOut{}, "", errcode.New(errcode.InvalidArgument, "axes.%s: %v", k, err)
			}
			req.Axes[k] = append(req.Axes[k], raw)
		}
	}
	return s.startBatch(ctx, call, in.WaitIn, func(ctx context.Context, rb RunsBackend) (runs.Batch, error) { return rb.StartMatrix(ctx, req) })
}

func (s *Server) agentCompare(ctx context.Context, call *mcp.CallToolRequest, in AgentCompareIn) (BatchOut, string, error) {
	req, err := in.request(&in.Baseline, in.Repetitions)
	if err != nil {
		return BatchOut{}, "", err
	}
	return s.startBatch(ctx, call, in.WaitIn, func(ctx context.Context, rb RunsBackend) (runs.Batch, error) { return rb.AgentCompare(ctx, req) })
}

func (s *Server) agentTest(ctx context.Context, call *mcp.CallToolRequest, in AgentTestIn) (BatchOut, string, error) {
	req, err := in.request(nil, 0)
	if err != nil {
		return BatchOut{}, "", err
	}
	return s.startBatch(ctx, call, in.WaitIn, func(ctx context.Context, rb RunsBackend) (runs.Batch, error) { return rb.AgentTest(ctx, req) })
}

func (s *Server) batchGet(ctx context.Context, call *mcp.CallToolRequest, in BatchIDIn) (BatchOut, string, error) {
	rb, err := s.runsOr()
	if err != nil {
		return BatchOut{}, "", err
	}
	b, err := rb.GetBatch(s.owned(ctx, call), in.BatchID)
	if err != nil {
		return BatchOut{}, "", err
	}
	out := batchOut(b)
	return out, renderBatch(out), nil
}
