package runs

import "context"

// runSettled is called once a run settled (by the worker that settled it, or by Cancel of a
// queued run); the batch service sets onSettled to keep its batch's record current.
func (s *Service) runSettled(ctx context.Context, r Run) {
	if s.onSettled != nil {
		s.onSettled(ctx, r)
	}
}
