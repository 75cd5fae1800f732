package store

import (
	"context"
	"time"
)

// Remote jobs (internal/remotejobs).

// Remote job states. Starting: recorded, the machine not yet confirmed; Failed: it never ran
// (the machine refused it, or does not know it after a crash between record and start).
const (
	RemoteJobStarting = "starting"
	RemoteJobRunning  = "running"
	RemoteJobExited   = "exited"
	RemoteJobCanceled = "canceled"
	RemoteJobUnknown  = "unknown"
	RemoteJobFailed   = "failed"
)

// RemoteJobEnded reports whether state is final (its GPU reservation, if any, released).
func RemoteJobEnded(state string) bool {
	return state != RemoteJobStarting && state != RemoteJobRunning
}

// RemoteJob is the server's record of one job on a joined machine.
type RemoteJob struct {
	ID        string
	MachineID string
	Owner     string
	Command   string
	Shell     string
	// GPUIndex is the GPU the job holds while it runs (nil: none).
	GPUIndex  *int
	State     string
	ExitCode  *int
	Message   string
	CreatedAt time.Time
	UpdatedAt time.Time
	EndedAt   *time.Time
}

// GPUReservation is one GPU of a machine held by a job.
type GPUReservation struct {
	MachineID string
	GPUIndex  int
	JobID     string
	CreatedAt time.Time
}

// RemoteJobStore is the durable state of remote jobs and their GPU reservations.
type RemoteJobStore interface {
	// CreateRemoteJob inserts j (state starting) and, when j.GPUIndex is set, reserves that GPU
	// of j.MachineID for it, in one transaction: GPU_BUSY (details job_id, gpu_index) when
	// another job holds it, and nothing is written.
	CreateRemoteJob(ctx context.Context, j RemoteJob) error
	// GetRemoteJob returns the job of id; JOB_NOT_FOUND when none.
	GetRemoteJob(ctx context.Context, id string) (RemoteJob, error)
	// UpdateRemoteJob stores j's State, ExitCode, Message, UpdatedAt and EndedAt. An ended
	// state deletes its GPU reservation in the same transaction. An ended record is final:
	// updating it changes nothing and returns it as stored. JOB_NOT_FOUND when none.
	UpdateRemoteJob(ctx context.Context, j RemoteJob) (RemoteJob, error)
	// ListRemoteJobs returns a machine's newest limit jobs and how many older ones there are.
	ListRemoteJobs(ctx context.Context, machineID string, limit int) ([]RemoteJob, int, error)
	// ActiveRemoteJobs returns up to limit jobs not yet ended (starting or running), oldest
	// first.
	ActiveRemoteJobs(ctx context.Context, limit int) ([]RemoteJob, error)
	// GPUReservations returns the GPUs of a machine held now, by index.
	GPUReservations(ctx context.Context, machineID string) ([]GPUReservation, error)
}
