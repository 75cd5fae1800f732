package sandbox

import "context"

// SweepSnapshots runs the periodic sweep of snapshot directories once.
func (s *Service) SweepSnapshots(ctx context.Context) error { return s.sweepSnapshots(ctx, false) }
