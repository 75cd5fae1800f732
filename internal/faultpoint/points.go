package faultpoint

// EnvVar names the crash point a process built with the faultpoints tag dies at: NAME (its
// first hit) or NAME:N (its Nth).
const EnvVar = "AGENTBOX_FAULTPOINT"

// The crash points: each sits between two steps of a multi-step operation, where a crash leaves
// the store and the host half way. The server must converge from each at its next start.
const (
	// CreateRecorded: a create's record is written (creating); the runtime has made nothing.
	CreateRecorded = "create.recorded"
	// CreateStarted: the runtime made and started the sandbox; its record still says creating.
	CreateStarted = "create.started"
	// DestroyStopping: a destroy's record says stopping; the runtime still holds the sandbox.
	DestroyStopping = "destroy.stopping"
	// SnapshotTaken: a snapshot's files are on disk; its record is not ready.
	SnapshotTaken = "snapshot.taken"
	// ForkSnapshotted: a fork has its snapshot; no child sandbox is made yet.
	ForkSnapshotted = "fork.snapshotted"
	// RunStep: a durable run finished a phase and recorded it; the next has not started.
	RunStep = "run.step"
	// PoolRefill: a warm pool's new sandbox is created; the pool has not counted it ready.
	PoolRefill = "pool.refill"
)

// Failure points: where a test build makes a step fail instead of crashing (Fail), to show
// that the operation converges from a failed write as from a crash.
const (
	// FailEnvVar names the failure point and how many of its first hits fail: NAME or NAME:N.
	FailEnvVar = "AGENTBOX_FAULTFAIL"
	// CreateRunningWrite: the store write that records a made sandbox running.
	CreateRunningWrite = "create.running_write"
)

// Points are every crash point, for the campaign to choose from.
var Points = []string{CreateRecorded, CreateStarted, DestroyStopping, SnapshotTaken, ForkSnapshotted, RunStep, PoolRefill}
