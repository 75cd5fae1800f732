package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/internal/blobs"
	"github.com/agentbox/agentbox/internal/store"
)

// relayFlags are serve's limits of the file relay (internal/blobs).
type relayFlags struct {
	maxFileMB        int64
	blobTTL, linkTTL time.Duration
	transfersPerHour int
	mbPerDay         int64
	callTimeout      time.Duration
}

func registerRelayFlags(fs *flag.FlagSet) *relayFlags {
	r := &relayFlags{}
	fs.Int64Var(&r.maxFileMB, "relay-max-file-mb", blobs.DefaultMaxFileBytes>>20, "file relay: largest file remote_pull, remote_push and POST /v1/blobs move, in MiB")
	fs.DurationVar(&r.blobTTL, "relay-blob-ttl", blobs.DefaultTTL, "file relay: a blob is deleted this long after it was made")
	fs.DurationVar(&r.linkTTL, "relay-link-ttl", blobs.DefaultLinkTTL, "file relay: how long a blob's download link works")
	fs.IntVar(&r.transfersPerHour, "relay-transfers-per-hour", blobs.DefaultTransfersPerHour, "file relay: transfers (pulls, pushes, uploads) one API key may make in any hour")
	fs.Int64Var(&r.mbPerDay, "relay-mb-per-day", blobs.DefaultBytesPerDay>>20, "file relay: MiB one API key may bring in (pulls, uploads) in any rolling 24 h")
	fs.DurationVar(&r.callTimeout, "relay-call-timeout", blobs.DefaultCallTimeout, "file relay: every call answers within this or fails saying so")
	return r
}

// check refuses a limit that is not positive (0 is not "no limit").
func (r *relayFlags) check() error {
	switch {
	case r.maxFileMB <= 0:
		return fmt.Errorf("--relay-max-file-mb %d must be at least 1", r.maxFileMB)
	case r.blobTTL < time.Minute:
		return fmt.Errorf("--relay-blob-ttl %v must be at least 1m", r.blobTTL)
	case r.linkTTL < time.Minute:
		return fmt.Errorf("--relay-link-ttl %v must be at least 1m", r.linkTTL)
	case r.transfersPerHour <= 0:
		return fmt.Errorf("--relay-transfers-per-hour %d must be at least 1", r.transfersPerHour)
	case r.mbPerDay < r.maxFileMB:
		return fmt.Errorf("--relay-mb-per-day %d must be at least --relay-max-file-mb (%d): a pull reserves the per-file maximum", r.mbPerDay, r.maxFileMB)
	case r.callTimeout < time.Second || r.callTimeout > 10*time.Minute:
		return fmt.Errorf("--relay-call-timeout %v must be between 1s and 10m", r.callTimeout)
	}
	return nil
}

// start builds the relay on the server's store under <state>/blobs and starts its sweeper.
// machines may be nil (remote_pull and remote_push then answer UNSUPPORTED_OPERATION).
func (r *relayFlags) start(ctx context.Context, st store.BlobStore, stateDir string, machines blobs.Machines, baseURL func() string, log *slog.Logger) (*blobs.Service, error) {
	svc, err := blobs.New(blobs.Config{Store: st, Dir: filepath.Join(stateDir, "blobs"), Machines: machines, BaseURL: baseURL,
		Log: log.With("component", "blobs"), MaxFileBytes: r.maxFileMB << 20, TTL: r.blobTTL, LinkTTL: r.linkTTL,
		TransfersPerHour: r.transfersPerHour, BytesPerDay: r.mbPerDay << 20, CallTimeout: r.callTimeout})
	if err != nil {
		return nil, fmt.Errorf("file relay: %w", err)
	}
	svc.Start(ctx)
	return svc, nil
}
