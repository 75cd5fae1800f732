package sandbox

import "context"

// Diff compares sandbox id's files with another sandbox's, a snapshot's or its image's.
func (s *Service) Diff(ctx context.Context, id string, req DiffRequest) (DiffResult, error) {
	return DiffResult{}, notYet("sandbox_diff")
}
