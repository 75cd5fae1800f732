package runs

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Backend is what runs need of the sandbox control plane; *sandbox.Service satisfies it.
type Backend interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	Get(ctx context.Context, id string) (sandbox.Sandbox, error)
	Destroy(ctx context.Context, id string) (sandbox.Sandbox, error)
	Extend(ctx context.Context, id string, ttlSeconds int64) (sandbox.Sandbox, error)
	Exec(ctx context.Context, id string, req sandbox.ExecRequest, onOutput sandbox.OutputFunc) (sandbox.ExecResult, error)
	StartJob(ctx context.Context, sandboxID string, req sandbox.JobStartRequest) (sandbox.Job, error)
	JobStatus(ctx context.Context, sandboxID, jobID string) (sandbox.Job, error)
	WaitJob(ctx context.Context, sandboxID, jobID string, timeout time.Duration) (sandbox.Job, error)
	CancelJob(ctx context.Context, sandboxID, jobID string, grace *time.Duration) (sandbox.Job, error)
	JobLogs(ctx context.Context, sandboxID, jobID string, req sandbox.JobLogsRequest) (sandbox.JobLogs, error)
	WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) (sandbox.FileInfo, error)
	ReadFile(ctx context.Context, id, path string, offset, length, limit int64) (io.ReadCloser, int64, error)
	Stat(ctx context.Context, id, path string) (sandbox.FileInfo, error)
	ListDir(ctx context.Context, id, path string) (sandbox.DirList, error)
	UpdateNetwork(ctx context.Context, id string, p egress.Policy) (sandbox.Sandbox, error)
}

// Config configures the run service.
type Config struct {
	Sandboxes Backend
	Store     Store
	// Dir is the service's own directory (<state>/runs): the blob store of logs and artifacts
	// and the key that signs artifact URLs.
	Dir string
	// BaseURL returns the server's address as clients reach it ("http://127.0.0.1:8080"), for
	// artifact URLs.
	BaseURL func() string
	// Workers bounds the runs this server executes at once (default DefaultWorkers).
	Workers int
	// CheckoutDirs are the host directories a file:// repo_url may name (operator's flag
	// --checkout-dir); none: file:// is refused.
	CheckoutDirs []string
	// ArtifactBudgetBytes bounds the blob store (logs and artifacts; oldest runs' blobs go
	// first); Retention is how long settled runs, their logs and artifacts are kept.
	ArtifactBudgetBytes int64
	Retention           time.Duration
	// ArtifactURLTTL is how long a signed artifact URL is valid (default DefaultArtifactURLTTL).
	ArtifactURLTTL time.Duration
	Log            *slog.Logger
	Now            func() time.Time
}

// Defaults.
const (
	DefaultWorkers             = 16
	DefaultArtifactBudgetBytes = 2 << 30
	DefaultRetention           = 7 * 24 * time.Hour
)

// Service runs runs. It is safe for concurrent use.
type Service struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
}

// New returns the service; Run starts its workers.
func New(cfg Config) (*Service, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	return &Service{cfg: cfg, log: cfg.Log, now: cfg.Now}, nil
}

var errNotYet = errcode.New(errcode.UnsupportedOp, "runs are not built yet")

// Run resumes every unsettled run and executes queued ones until ctx ends; Close waits for it.
func (s *Service) Run(ctx context.Context) { <-ctx.Done() }

// Close waits for the workers to stop (after Run's ctx ended).
func (s *Service) Close() error { return nil }

// Start records a run (queued) and returns it at once; the caller's owner is
// sandbox.OwnerFrom(ctx). Bad input is INVALID_ARGUMENT naming the field, and nothing is
// recorded.
func (s *Service) Start(ctx context.Context, spec Spec) (Run, error) { return Run{}, errNotYet }

// Wait returns the run once it settled, or as it is when timeout (at most MaxWait) passes or
// ctx ends (a caller that hangs up loses nothing: the run goes on).
func (s *Service) Wait(ctx context.Context, id string, timeout time.Duration) (Run, error) {
	return Run{}, errNotYet
}

// Get returns a run (artifact URLs freshly signed).
func (s *Service) Get(ctx context.Context, id string) (Run, error) { return Run{}, errNotYet }

// List pages runs, newest first.
func (s *Service) List(ctx context.Context, f Filter) (RunList, error) { return RunList{}, errNotYet }

// Cancel asks for a run's end: a queued run is canceled at once; a running phase's job is
// canceled and the run cleans up and settles canceled. Canceling a settled run returns it.
func (s *Service) Cancel(ctx context.Context, id string) (Run, error) { return Run{}, errNotYet }

// Events pages a run's events.
func (s *Service) Events(ctx context.Context, id string, after int64, limit int) (EventList, error) {
	return EventList{}, errNotYet
}

// Logs returns a slice of one phase's output (live while it runs, from the blob store after).
func (s *Service) Logs(ctx context.Context, id string, req LogsRequest) (Logs, error) {
	return Logs{}, errNotYet
}

// ArtifactURL signs the download URL of a run's artifact path, valid until expires.
func (s *Service) ArtifactURL(runID, path string, expires time.Time) string { return "" }

// VerifyArtifact checks a signed URL's parameters: AUTH_FAILED for a bad signature,
// LINK_EXPIRED past expires.
func (s *Service) VerifyArtifact(runID, path string, expires int64, sig string) error {
	return errNotYet
}

// OpenArtifact opens a collected artifact (LINK_EXPIRED when it is no longer kept).
func (s *Service) OpenArtifact(ctx context.Context, runID, path string) (io.ReadCloser, Artifact, error) {
	return nil, Artifact{}, errNotYet
}

var _ Backend = (*sandbox.Service)(nil)
