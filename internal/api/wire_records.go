package api

import (
	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// The conversions of the store's records that replies carry (jobs, snapshots, exposures, pools,
// network records, approvals, API keys, audit records, runs and batches) to their wire types: a
// field added to a record is published when it is added here. Each keeps nil lists nil and
// empty ones empty, so a reply's null and [] stay as the record's JSON wrote them
// (TestWireRecordBytes).

// convSlice converts each element of l with f (nil stays nil).
func convSlice[T, U any](l []T, f func(T) U) []U {
	if l == nil {
		return nil
	}
	out := make([]U, len(l))
	for i, v := range l {
		out[i] = f(v)
	}
	return out
}

// convPtr converts *p with f (nil stays nil).
func convPtr[T, U any](p *T, f func(T) U) *U {
	if p == nil {
		return nil
	}
	u := f(*p)
	return &u
}

// convValues converts each value of m with f (nil stays nil).
func convValues[K comparable, T, U any](m map[K]T, f func(T) U) map[K]U {
	if m == nil {
		return nil
	}
	out := make(map[K]U, len(m))
	for k, v := range m {
		out[k] = f(v)
	}
	return out
}

// convKeys converts the string keys of m to the wire's string type K2 (nil stays nil).
func convKeys[V any, K2 ~string, K1 ~string](m map[K1]V) map[K2]V {
	if m == nil {
		return nil
	}
	out := make(map[K2]V, len(m))
	for k, v := range m {
		out[K2(k)] = v
	}
	return out
}

// wireConnection is one connection record of a sandbox's egress proxy.
func wireConnection(c egress.Connection) wire.Connection {
	return wire.Connection{SandboxID: c.SandboxID, Seq: c.Seq, Time: c.Time, Kind: string(c.Kind), Host: c.Host,
		Port: c.Port, Addr: c.Addr, Decision: c.Decision, Rule: c.Rule, Reason: c.Reason, BytesOut: c.BytesOut,
		BytesIn: c.BytesIn, DurationMS: c.DurationMS, Intercepted: c.Intercepted}
}

func wireSnapshot(v sandbox.Snapshot) wire.Snapshot {
	return wire.Snapshot{
		ID:          v.ID,
		SandboxID:   v.SandboxID,
		State:       wire.SnapshotState(v.State),
		Kind:        v.Kind,
		Purpose:     v.Purpose,
		SizeBytes:   v.SizeBytes,
		Runtime:     v.Runtime,
		Image:       v.Image,
		ImageDigest: v.ImageDigest,
		CPU:         v.CPU,
		MemoryMB:    v.MemoryMB,
		DiskMB:      v.DiskMB,
		Network:     convPtr(v.Network, wireNetwork),
		Labels:      v.Labels,
		Node:        v.Node,
		CreatedAt:   v.CreatedAt,
		Error:       v.Error,
	}
}

func wireRequirements(v sandbox.Requirements) wire.Requirements {
	return wire.Requirements{
		Isolation: v.Isolation,
		Network:   v.Network,
	}
}

func wireSecretSpec(v sandbox.SecretSpec) wire.SecretSpec {
	return wire.SecretSpec{
		From:  v.From,
		Hosts: v.Hosts,
		Body:  v.Body,
	}
}

func wireCapacity(v sandbox.Capacity) wire.Capacity {
	return wire.Capacity{
		MaxSandboxes:      v.MaxSandboxes,
		Live:              v.Live,
		Free:              v.Free,
		CPUBudget:         v.CPUBudget,
		CPUUsed:           v.CPUUsed,
		MemoryBudgetMB:    v.MemoryBudgetMB,
		MemoryUsedMB:      v.MemoryUsedMB,
		DiskBudgetMB:      v.DiskBudgetMB,
		DiskUsedMB:        v.DiskUsedMB,
		Sleeping:          v.Sleeping,
		Overcommit:        v.Overcommit,
		MemoryAvailableMB: v.MemoryAvailableMB,
		MemoryReserveMB:   v.MemoryReserveMB,
		DiskFreeMB:        v.DiskFreeMB,
		DiskReserveMB:     v.DiskReserveMB,
		Pools:             convSlice(v.Pools, wirePoolStatus),
		MaxPooled:         v.MaxPooled,
	}
}

func wirePool(v sandbox.Pool) wire.Pool {
	return wire.Pool{
		Name:      v.Name,
		Image:     v.Image,
		Runtime:   v.Runtime,
		CPU:       v.CPU,
		MemoryMB:  v.MemoryMB,
		DiskMB:    v.DiskMB,
		Network:   v.Network,
		Size:      v.Size,
		CreatedAt: v.CreatedAt,
		UpdatedAt: v.UpdatedAt,
	}
}

func wirePoolStatus(v sandbox.PoolStatus) wire.PoolStatus {
	return wire.PoolStatus{
		Pool:      wirePool(v.Pool),
		Ready:     v.Ready,
		Starting:  v.Starting,
		Hits:      v.Hits,
		Misses:    v.Misses,
		LastError: v.LastError,
	}
}

func wireJob(v sandbox.Job) wire.Job {
	return wire.Job{
		ID:           v.ID,
		SandboxID:    v.SandboxID,
		Argv:         v.Argv,
		EnvNames:     v.EnvNames,
		Cwd:          v.Cwd,
		User:         v.User,
		State:        wire.JobState(v.State),
		ExitCode:     v.ExitCode,
		Signal:       v.Signal,
		OOMKilled:    v.OOMKilled,
		StartedAt:    v.StartedAt,
		FinishedAt:   v.FinishedAt,
		LogBytes:     v.LogBytes,
		LogTruncated: v.LogTruncated,
		CPUSeconds:   v.CPUSeconds,
		Error:        v.Error,
		Success:      v.Success,
		Message:      v.Message,
		UpdatedAt:    v.UpdatedAt,
	}
}

func wireJobList(v sandbox.JobList) wire.JobList {
	return wire.JobList{
		Jobs:    convSlice(v.Jobs, wireJob),
		Omitted: v.Omitted,
	}
}

func wireConnectionList(v sandbox.ConnectionList) wire.ConnectionList {
	return wire.ConnectionList{
		SandboxID:   v.SandboxID,
		Connections: convSlice(v.Connections, wireConnection),
		Next:        v.Next,
		Omitted:     v.Omitted,
	}
}

func wireSecretCallList(v sandbox.SecretCallList) wire.SecretCallList {
	return wire.SecretCallList{
		SandboxID: v.SandboxID,
		Calls:     convSlice(v.Calls, wireSecretCall),
		Next:      v.Next,
		Omitted:   v.Omitted,
	}
}

func wireSecretCall(v egress.SecretCall) wire.SecretCall {
	return wire.SecretCall{
		SandboxID: v.SandboxID,
		Seq:       v.Seq,
		Time:      v.Time,
		Secret:    v.Secret,
		Host:      v.Host,
		Method:    v.Method,
		Path:      v.Path,
		Replaced:  v.Replaced,
		Scrubbed:  v.Scrubbed,
		Reason:    v.Reason,
	}
}

func wireExposure(v sandbox.Exposure) wire.Exposure {
	return wire.Exposure{
		SandboxID:   v.SandboxID,
		Port:        v.Port,
		Public:      v.Public,
		URL:         v.URL,
		AccessToken: v.AccessToken,
		CreatedAt:   v.CreatedAt,
	}
}

func wireRun(v runs.Run) wire.Run {
	return wire.Run{
		ID:              v.ID,
		BatchID:         v.BatchID,
		State:           wire.RunState(v.State),
		Reason:          v.Reason,
		Spec:            wireRunSpec(v.Spec),
		Commit:          v.Commit,
		AgentCommit:     v.AgentCommit,
		Phases:          convSlice(v.Phases, wireRunPhase),
		ChangedFiles:    convSlice(v.ChangedFiles, wireChangedFile),
		DiffStat:        v.DiffStat,
		Diff:            v.Diff,
		DiffTruncated:   v.DiffTruncated,
		Artifacts:       convSlice(v.Artifacts, wireArtifact),
		ArtifactErrors:  v.ArtifactErrors,
		SandboxID:       v.SandboxID,
		SandboxKept:     v.SandboxKept,
		KeptUntil:       v.KeptUntil,
		CleanupFailed:   v.CleanupFailed,
		CleanupError:    v.CleanupError,
		CreatedAt:       v.CreatedAt,
		StartedAt:       v.StartedAt,
		FinishedAt:      v.FinishedAt,
		DurationMs:      v.DurationMs,
		Success:         v.Success,
		UpdatedAt:       v.UpdatedAt,
		CancelRequested: v.CancelRequested,
	}
}

func wireRunList(v runs.RunList) wire.RunList {
	return wire.RunList{
		Runs: convSlice(v.Runs, wireRun),
		Next: v.Next,
	}
}

func wireRunSpec(v runs.Spec) wire.RunSpec {
	return wire.RunSpec{
		RepoURL:            v.RepoURL,
		Ref:                v.Ref,
		RepoSecret:         v.RepoSecret,
		Dir:                v.Dir,
		Files:              v.Files,
		Agent:              convPtr(v.Agent, wireAgentCheckout),
		Setup:              v.Setup,
		Command:            v.Command,
		ValidationCommands: v.ValidationCommands,
		Stdin:              v.Stdin,
		Artifacts:          v.Artifacts,
		Env:                v.Env,
		Secrets:            convValues(v.Secrets, wireSecretSpec),
		Image:              v.Image,
		Runtime:            v.Runtime,
		CPU:                v.CPU,
		MemoryMB:           v.MemoryMB,
		DiskMB:             v.DiskMB,
		Network:            convPtr(v.Network, wireNetwork),
		Requirements:       wireRequirements(v.Requirements),
		TimeoutSeconds:     v.TimeoutSeconds,
		PhaseTimeouts:      v.PhaseTimeouts,
		Retention:          v.Retention,
		KeepTTLSeconds:     v.KeepTTLSeconds,
		Labels:             v.Labels,
		IdempotencyKey:     v.IdempotencyKey,
	}
}

func wireAgentCheckout(v runs.AgentCheckout) wire.AgentCheckout {
	return wire.AgentCheckout{
		RepoURL:      v.RepoURL,
		Ref:          v.Ref,
		Dir:          v.Dir,
		BuildCommand: v.BuildCommand,
		RepoSecret:   v.RepoSecret,
	}
}

func wireRunPhase(v runs.Phase) wire.RunPhase {
	return wire.RunPhase{
		Name:        v.Name,
		State:       wire.PhaseState(v.State),
		Argv:        v.Argv,
		JobID:       v.JobID,
		ExitCode:    v.ExitCode,
		Signal:      v.Signal,
		Stdout:      v.Stdout,
		Stderr:      v.Stderr,
		StdoutBytes: v.StdoutBytes,
		StderrBytes: v.StderrBytes,
		Truncated:   v.Truncated,
		StartedAt:   v.StartedAt,
		FinishedAt:  v.FinishedAt,
		DurationMs:  v.DurationMs,
		Error:       v.Error,
	}
}

func wireChangedFile(v runs.ChangedFile) wire.ChangedFile {
	return wire.ChangedFile{
		Path:   v.Path,
		Status: v.Status,
		From:   v.From,
	}
}

func wireArtifact(v runs.Artifact) wire.Artifact {
	return wire.Artifact{
		Path:      v.Path,
		Size:      v.Size,
		SHA256:    v.SHA256,
		URL:       v.URL,
		ExpiresAt: v.ExpiresAt,
	}
}

func wireRunEvent(v runs.Event) wire.RunEvent {
	return wire.RunEvent{
		Seq:    v.Seq,
		RunID:  v.RunID,
		Time:   v.Time,
		From:   wire.RunState(v.From),
		To:     wire.RunState(v.To),
		Phase:  v.Phase,
		Reason: v.Reason,
	}
}

func wireRunEventList(v runs.EventList) wire.RunEventList {
	return wire.RunEventList{
		RunID:  v.RunID,
		Events: convSlice(v.Events, wireRunEvent),
		Next:   v.Next,
	}
}

func wireBatch(v runs.Batch) wire.Batch {
	return wire.Batch{
		ID:                 v.ID,
		Kind:               v.Kind,
		MaxParallel:        v.MaxParallel,
		Runs:               convSlice(v.Runs, wireBatchRun),
		SubmissionFailures: convSlice(v.SubmissionFailures, wireSubmissionFailure),
		Counts:             convKeys[int, wire.RunState](v.Counts),
		Settled:            v.Settled,
		Matrix:             convSlice(v.Matrix, wireCell),
		Axes:               v.Axes,
		Compare:            convPtr(v.Compare, wireComparison),
		Labels:             v.Labels,
		CreatedAt:          v.CreatedAt,
		SettledAt:          v.SettledAt,
	}
}

func wireBatchList(v runs.BatchList) wire.BatchList {
	return wire.BatchList{
		Batches: convSlice(v.Batches, wireBatch),
		Next:    v.Next,
	}
}

func wireBatchRun(v runs.BatchRun) wire.BatchRun {
	return wire.BatchRun{
		RunID:  v.RunID,
		Index:  v.Index,
		State:  wire.RunState(v.State),
		Reason: v.Reason,
	}
}

func wireSubmissionFailure(v runs.SubmissionFailure) wire.SubmissionFailure {
	return wire.SubmissionFailure{
		Index: v.Index,
		Error: v.Error,
		Code:  v.Code,
	}
}

func wireCell(v runs.Cell) wire.Cell {
	return wire.Cell{
		Values:    v.Values,
		RunID:     v.RunID,
		State:     wire.RunState(v.State),
		ExitCodes: v.ExitCodes,
	}
}

func wireComparison(v runs.Comparison) wire.Comparison {
	return wire.Comparison{
		Task:       v.Task,
		Invocation: v.Invocation,
		Sides:      convSlice(v.Sides, wireSideSummary),
	}
}

func wireSideSummary(v runs.SideSummary) wire.SideSummary {
	return wire.SideSummary{
		Side:         v.Side,
		RepoURL:      v.RepoURL,
		Ref:          v.Ref,
		Repetitions:  convSlice(v.Repetitions, wireRepetitionSummary),
		Counts:       convKeys[int, wire.RunState](v.Counts),
		Passed:       v.Passed,
		MedianTaskMs: v.MedianTaskMs,
	}
}

func wireRepetitionSummary(v runs.RepetitionSummary) wire.RepetitionSummary {
	return wire.RepetitionSummary{
		RunID:         v.RunID,
		State:         wire.RunState(v.State),
		AgentCommit:   v.AgentCommit,
		TargetCommit:  v.TargetCommit,
		Build:         convPtr(v.Build, wirePhaseOutcome),
		Setup:         convPtr(v.Setup, wirePhaseOutcome),
		Task:          convPtr(v.Task, wirePhaseOutcome),
		Validations:   convSlice(v.Validations, wirePhaseOutcome),
		DiffStat:      v.DiffStat,
		ChangedFiles:  v.ChangedFiles,
		CleanupFailed: v.CleanupFailed,
		Summary:       v.Summary,
		SandboxID:     v.SandboxID,
	}
}

func wirePhaseOutcome(v runs.PhaseOutcome) wire.PhaseOutcome {
	return wire.PhaseOutcome{
		State:      wire.PhaseState(v.State),
		ExitCode:   v.ExitCode,
		DurationMs: v.DurationMs,
	}
}

func wireApproval(v approval.Approval) wire.Approval {
	return wire.Approval{
		ID:         v.ID,
		State:      wire.ApprovalState(v.State),
		Tool:       v.Tool,
		Action:     v.Action,
		Surface:    v.Surface,
		SandboxID:  v.SandboxID,
		Digest:     v.Digest,
		Summary:    v.Summary,
		CallerID:   v.CallerID,
		CallerName: v.CallerName,
		Principal:  v.Principal,
		CreatedAt:  v.CreatedAt,
		ExpiresAt:  v.ExpiresAt,
		DecidedAt:  v.DecidedAt,
		Decider:    v.Decider,
		Reason:     v.Reason,
		UsedAt:     v.UsedAt,
		Outcome:    v.Outcome,
		Bound:      v.Bound,
	}
}

func wireAuditRecord(v audit.Record) wire.AuditRecord {
	return wire.AuditRecord{
		Seq:        v.Seq,
		Time:       v.Time,
		Surface:    v.Surface,
		CallerID:   v.CallerID,
		CallerName: v.CallerName,
		Tool:       v.Tool,
		Action:     v.Action,
		SandboxID:  v.SandboxID,
		ArgsSHA256: v.ArgsSHA256,
		Summary:    v.Summary,
		Outcome:    v.Outcome,
		DurationMS: v.DurationMS,
		ApprovalID: v.ApprovalID,
	}
}

func wireAuditList(v audit.List) wire.AuditList {
	return wire.AuditList{
		Records: convSlice(v.Records, wireAuditRecord),
		Next:    v.Next,
		Omitted: v.Omitted,
	}
}

func wireAPIKey(v auth.Key) wire.APIKey {
	return wire.APIKey{
		ID:         v.ID,
		Name:       v.Name,
		Scope:      v.Scope,
		Prefix:     v.Prefix,
		CreatedAt:  v.CreatedAt,
		ExpiresAt:  v.ExpiresAt,
		RevokedAt:  v.RevokedAt,
		LastUsedAt: v.LastUsedAt,
	}
}

func wireCreatedKey(v auth.Created) wire.CreatedKey {
	return wire.CreatedKey{
		Key:    wireAPIKey(v.Key),
		Secret: v.Secret,
	}
}
