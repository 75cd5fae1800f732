package sandbox

import (
	"context"

	"github.com/agentbox/agentbox/internal/guest"
)

// NetSessionReply waits until sandbox id's network session is up and returns where its
// listeners are.
func (s *Service) NetSessionReply(ctx context.Context, id string) (guest.NetSessionReply, error) {
	return s.netSessionReply(ctx, id)
}

// FlushNetRecords writes every egress record queued so far to the store.
func (s *Service) FlushNetRecords(ctx context.Context) error { return s.flushNetRecords(ctx) }

// SweepSnapshots runs the periodic sweep of snapshot directories once.
func (s *Service) SweepSnapshots(ctx context.Context) error { return s.sweepSnapshots(ctx, false) }
