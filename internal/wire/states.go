package wire

// The states replies name, apart from a sandbox's (State): a job's, a snapshot's, a run's and
// its phases', an approval's. Each is the server's string; the constants are those the CLI
// tests for.

// JobState is where a job is (a sandbox's or a joined machine's).
type JobState string

// The job states. A job in a final state (anything but starting and running) never changes again.
const (
	JobStarting JobState = "starting"
	JobRunning  JobState = "running"
	JobExited   JobState = "exited"
	JobKilled   JobState = "killed"
	JobCanceled JobState = "canceled"
	JobFailed   JobState = "failed"
	JobUnknown  JobState = "unknown"
)

// Active reports whether a job in state s may still be running.
func (s JobState) Active() bool { return s == JobStarting || s == JobRunning }

// SnapshotState is a snapshot's lifecycle state: creating → ready, or → failed.
type SnapshotState string

// The snapshot states.
const (
	SnapshotCreating SnapshotState = "creating"
	SnapshotReady    SnapshotState = "ready"
	SnapshotFailed   SnapshotState = "failed"
	SnapshotDeleting SnapshotState = "deleting"
)

// RunState is where a durable run is.
type RunState string

// The run states.
const (
	RunQueued     RunState = "queued"
	RunPreparing  RunState = "preparing"
	RunRunning    RunState = "running"
	RunValidating RunState = "validating"
	RunCollecting RunState = "collecting"
	RunCleaning   RunState = "cleaning"
	RunSucceeded  RunState = "succeeded"
	RunFailed     RunState = "failed"
	RunErrored    RunState = "errored"
	RunCanceled   RunState = "canceled"
	RunTimedOut   RunState = "timed_out"
)

// Settled reports whether s is final.
func (s RunState) Settled() bool {
	switch s {
	case RunSucceeded, RunFailed, RunErrored, RunCanceled, RunTimedOut:
		return true
	}
	return false
}

// PhaseState is where one phase of a run is.
type PhaseState string

// ApprovalState is where an approval is.
type ApprovalState string

// The approval states.
const (
	ApprovalPending  ApprovalState = "pending"
	ApprovalApproved ApprovalState = "approved" // decided, not yet claimed by the call
	ApprovalDenied   ApprovalState = "denied"
	ApprovalExpired  ApprovalState = "expired" // nobody decided in time
	ApprovalUsed     ApprovalState = "used"    // the approved call was let through
)

// The phase states.
const (
	PhasePending     PhaseState = "pending"
	PhaseRunning     PhaseState = "running"
	PhaseSucceeded   PhaseState = "succeeded"
	PhaseFailed      PhaseState = "failed"
	PhaseSkipped     PhaseState = "skipped"
	PhaseTimedOut    PhaseState = "timed_out"
	PhaseCanceled    PhaseState = "canceled"
	PhaseInterrupted PhaseState = "interrupted"
)
