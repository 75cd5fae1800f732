package blobs

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

// Quota windows.
const (
	countWindow = time.Hour
	bytesWindow = 24 * time.Hour
)

// Transfer kinds in the ledger.
const (
	kindPull   = "pull"
	kindPush   = "push"
	kindUpload = "upload"
)

// admit checks owner's quotas for one more transfer admitting reserve bytes and, when it fits,
// records it (before any byte moves). Over a limit: RATE_LIMITED with details.limit (which
// limit binds), details.retry_at (when enough of the window frees up for this call), and the
// figures.
func (s *Service) admit(ctx context.Context, owner, kind string, reserve int64) (store.BlobTransfer, error) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	now := s.now()
	// At most TransfersPerHour fit in each hour, so a day holds at most 24 times that.
	// A transfer leaves a window when it is exactly the window's length old.
	ledger, err := s.st.BlobTransfers(ctx, owner, now.Add(-bytesWindow+time.Millisecond), 24*s.cfg.TransfersPerHour+1)
	if err != nil {
		return store.BlobTransfer{}, err
	}
	var inHour []store.BlobTransfer
	var bytes int64
	for _, t := range ledger {
		if t.At.After(now.Add(-countWindow)) {
			inHour = append(inHour, t)
		}
		bytes += t.Bytes
	}
	var (
		limit   string
		retryAt time.Time
	)
	if over := len(inHour) + 1 - s.cfg.TransfersPerHour; over > 0 {
		// The over-th oldest transfer of the hour leaving the window frees enough.
		limit, retryAt = "transfers_per_hour", inHour[over-1].At.Add(countWindow)
	}
	if bytes+reserve > s.cfg.BytesPerDay {
		left := bytes
		var at time.Time
		for _, t := range ledger {
			left -= t.Bytes
			if left+reserve <= s.cfg.BytesPerDay {
				at = t.At.Add(bytesWindow)
				break
			}
		}
		if at.After(retryAt) {
			limit, retryAt = "bytes_per_day", at
		}
	}
	if limit != "" {
		msg := "this key made %d transfers in the last hour (the limit is %d per hour)"
		args := []any{len(inHour), s.cfg.TransfersPerHour}
		if limit == "bytes_per_day" {
			msg = "this key moved %d bytes in the last 24 hours and this %s needs %d more (the limit is %d bytes per rolling 24 h; a pull reserves the per-file maximum until it settles to the true size)"
			args = []any{bytes, kind, reserve, s.cfg.BytesPerDay}
		}
		return store.BlobTransfer{}, errcode.New(errcode.RateLimited, msg+"; retry at %s", append(args, retryAt.UTC().Format(time.RFC3339))...).
			With("limit", limit).With("retry_at", retryAt.UTC().Format(time.RFC3339)).
			With("transfers_last_hour", len(inHour)).With("transfers_per_hour", s.cfg.TransfersPerHour).
			With("bytes_last_24h", bytes).With("bytes_per_day", s.cfg.BytesPerDay)
	}
	t := store.BlobTransfer{ID: "xfer-" + newID()[5:], Owner: owner, Kind: kind, Bytes: reserve, At: now}
	if err := s.st.AddBlobTransfer(ctx, t); err != nil {
		return store.BlobTransfer{}, err
	}
	return t, nil
}

// settle sets a transfer's admitted bytes to what really moved. It runs on its own short
// context so a caller's expired deadline does not leave the reservation standing.
func (s *Service) settle(t store.BlobTransfer, bytes int64) {
	if t.Bytes == bytes {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.st.SettleBlobTransfer(ctx, t.ID, bytes); err != nil {
		s.log.Warn("settle blob transfer", "transfer", t.ID, "bytes", bytes, "err", err)
	}
}
