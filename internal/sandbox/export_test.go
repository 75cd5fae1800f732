package sandbox

import "context"

// SweepOnce runs the features' parts of the periodic orphan sweep once (the snapshots
// feature's removes orphaned snapshot directories).
func (s *Service) SweepOnce(ctx context.Context) error { return s.hooks.sweep(ctx, false) }
