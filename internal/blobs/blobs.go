// Package blobs is the server side of the file relay: files pulled from joined
// machines (remote_pull) or uploaded (POST /v1/blobs) are held as blobs under the server's state
// dir, handed out through signed links (internal/linksign: the link is its own credential, valid
// LinkTTL) and written to machines (remote_push) through the machine-side handler
// (internal/hostfiles).
//
// Every blob's record is written (pending) before its bytes, and marked ready after they are
// synced and renamed into place; a sweeper deletes expired blobs (record, then bytes), pending
// records older than two call deadlines or from before a restart, and files without a record,
// so the relay converges after a crash. Quotas are per owner (the API key or token that calls)
// and are checked before bytes move: TransfersPerHour calls in any hour and BytesPerDay bytes
// admitted in any rolling 24 h (a pull reserves MaxFileBytes and settles to the true size; an
// upload reserves its declared length or MaxFileBytes; a push admits no bytes). Over a limit:
// RATE_LIMITED with details.limit and details.retry_at, when enough frees up. Every call is
// bounded by CallTimeout (55 s): a transfer that does not finish by then fails saying so and
// leaves nothing behind.
package blobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/hostfiles"
	"github.com/agentbox/agentbox/internal/linksign"
	"github.com/agentbox/agentbox/internal/store"
)

// Defaults of Config's limits.
const (
	DefaultMaxFileBytes     int64 = 100 << 20
	DefaultTTL                    = 24 * time.Hour
	DefaultLinkTTL                = time.Hour
	DefaultTransfersPerHour       = 60
	DefaultBytesPerDay      int64 = 5 << 30
	DefaultCallTimeout            = 55 * time.Second
	DefaultSweepEvery             = time.Minute
)

// Machines resolves a machine reference (id, name or alias) to an HTTP client whose transport
// reaches that machine's agent (machine.Registry.Client); MACHINE_NOT_FOUND or MACHINE_OFFLINE
// otherwise.
type Machines interface {
	Client(ctx context.Context, ref string) (*http.Client, store.Machine, error)
}

// Config configures the Service.
type Config struct {
	Store store.BlobStore
	// Dir holds the bytes (<state dir>/blobs), 0700; its url-key signs the links.
	Dir string
	// Machines reaches joined machines; nil: remote_pull and remote_push answer
	// UNSUPPORTED_OPERATION.
	Machines Machines
	// BaseURL returns the server's address as clients reach it, for links.
	BaseURL func() string
	Log     *slog.Logger
	Now     func() time.Time // injectable clock (nil: time.Now)

	MaxFileBytes     int64         // per file (default 100 MiB)
	TTL              time.Duration // a blob is deleted this long after creation (default 24 h)
	LinkTTL          time.Duration // a link works this long (default 1 h)
	TransfersPerHour int           // per owner (default 60)
	BytesPerDay      int64         // admitted per owner per rolling 24 h (default 5 GiB)
	CallTimeout      time.Duration // every call answers within this (default 55 s)
	SweepEvery       time.Duration // how often the sweeper runs (default 1 min)
}

// Service is the relay. It is safe for concurrent use.
type Service struct {
	cfg     Config
	st      store.BlobStore
	log     *slog.Logger
	now     func() time.Time
	signer  *linksign.Signer
	started time.Time  // pending records from before this are a previous process's
	qmu     sync.Mutex // admission: check and record one owner's transfer at a time
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// New validates cfg, prepares Dir and returns the Service; Start runs its sweeper.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Dir == "" {
		return nil, fmt.Errorf("blobs: Store and Dir are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.BaseURL == nil {
		cfg.BaseURL = func() string { return "" }
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.TTL, DefaultTTL)
	def(&cfg.LinkTTL, DefaultLinkTTL)
	def(&cfg.CallTimeout, DefaultCallTimeout)
	def(&cfg.SweepEvery, DefaultSweepEvery)
	if cfg.MaxFileBytes == 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.TransfersPerHour == 0 {
		cfg.TransfersPerHour = DefaultTransfersPerHour
	}
	if cfg.BytesPerDay == 0 {
		cfg.BytesPerDay = DefaultBytesPerDay
	}
	switch {
	case cfg.MaxFileBytes < 0 || cfg.TransfersPerHour < 0 || cfg.BytesPerDay < 0 ||
		cfg.TTL < 0 || cfg.LinkTTL < 0 || cfg.CallTimeout < 0 || cfg.SweepEvery < 0:
		return nil, fmt.Errorf("blobs: limits must be positive")
	case cfg.MaxFileBytes > cfg.BytesPerDay:
		return nil, fmt.Errorf("blobs: the per-file limit (%d bytes) exceeds the bytes a day one key may move (%d): no pull could ever be admitted", cfg.MaxFileBytes, cfg.BytesPerDay)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("blobs: %w", err)
	}
	signer, err := linksign.Load(filepath.Join(cfg.Dir, "url-key"), cfg.Now)
	if err != nil {
		return nil, fmt.Errorf("blobs: %w", err)
	}
	return &Service{cfg: cfg, st: cfg.Store, log: cfg.Log, now: cfg.Now, signer: signer, started: cfg.Now(),
		stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Limits are the relay's configured limits (for docs and replies).
func (s *Service) Limits() Config { return s.cfg }

// Start sweeps once (a previous process's leftovers) and then every SweepEvery until Close.
func (s *Service) Start(ctx context.Context) {
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.cfg.SweepEvery)
		defer t.Stop()
		for {
			if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("blob sweep", "err", err)
			}
			select {
			case <-t.C:
			case <-s.stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
}

// Close stops the sweeper (if started) and waits for it.
func (s *Service) Close() {
	s.once.Do(func() { close(s.stop) })
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
	}
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "blob-" + hex.EncodeToString(b[:])
}

// validID reports whether id looks like one newID makes (so it is safe as a file name).
func validID(id string) bool {
	if len(id) != len("blob-")+24 || id[:5] != "blob-" {
		return false
	}
	_, err := hex.DecodeString(id[5:])
	return err == nil
}

func (s *Service) blobPath(id string) string { return filepath.Join(s.cfg.Dir, id) }
func (s *Service) partPath(id string) string { return filepath.Join(s.cfg.Dir, id+".part") }

// withDeadline bounds a call by CallTimeout.
func (s *Service) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, s.cfg.CallTimeout, fmt.Errorf("the relay answers every call within %s", s.cfg.CallTimeout))
}

// newClient is the file client for a machine's HTTP client.
func newClient(hc *http.Client) *hostfiles.Client { return hostfiles.NewClient(hc) }
