package blobs

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

// sweepBatch bounds one pass's store reads.
const sweepBatch = 500

// Sweep deletes expired blobs (record, then bytes), pending records from before this process
// or older than two call deadlines, files without a record, and ledger entries older than the
// quota windows. It returns how many blobs and files it removed.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	removed := 0
	now := s.now()
	pendingBefore := now.Add(-2 * s.cfg.CallTimeout)
	if before := s.started.Add(-time.Millisecond); before.After(pendingBefore) {
		pendingBefore = before // every pending record older than this process
	}
	for {
		bs, err := s.st.ExpiredBlobs(ctx, now, pendingBefore, sweepBatch)
		if err != nil {
			return removed, err
		}
		for _, b := range bs {
			if err := s.remove(ctx, b); err != nil && !errcode.Is(err, errcode.BlobNotFound) {
				return removed, err
			}
			removed++
			s.log.Info("blob swept", "blob_id", b.ID, "state", b.State, "expires_at", b.ExpiresAt)
		}
		if len(bs) < sweepBatch {
			break
		}
	}
	n, err := s.sweepOrphans(ctx)
	removed += n
	if err != nil {
		return removed, err
	}
	if _, err := s.st.PruneBlobTransfers(ctx, now.Add(-bytesWindow)); err != nil {
		return removed, err
	}
	return removed, nil
}

// sweepOrphans removes files in Dir that no record explains: a blob file (<id>) without a
// record, and a partial one (<id>.part) whose record is gone or no longer pending. A record is
// always written before its file, so a file listed here whose record is missing is a leftover.
func (s *Service) sweepOrphans(ctx context.Context) (int, error) {
	ents, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, e := range ents {
		name := e.Name()
		id, part := strings.CutSuffix(name, ".part")
		if !validID(id) {
			continue // url-key and anything not the relay's
		}
		b, err := s.st.GetBlob(ctx, id)
		switch {
		case errcode.Is(err, errcode.BlobNotFound):
		case err != nil:
			return removed, err
		case part && b.State == store.BlobPending:
			continue // being written
		case !part:
			continue // a live blob's bytes
		}
		if err := os.Remove(filepath.Join(s.cfg.Dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, err
		}
		removed++
		s.log.Info("orphaned blob file swept", "file", name)
	}
	return removed, nil
}
