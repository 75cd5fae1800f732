package sandbox

import "context"

// Sleep and wake (issue 15): cp-sleep's. Stubs until they land: UNSUPPORTED_OPERATION.

// Sleep saves sandbox id and releases its memory and CPU; state sleeping.
func (s *Service) Sleep(ctx context.Context, id string) (Sandbox, error) {
	return Sandbox{}, notYet("sandbox_sleep")
}

// Wake restores a sleeping sandbox under its id.
func (s *Service) Wake(ctx context.Context, id string) (Sandbox, error) {
	return Sandbox{}, notYet("sandbox_wake")
}
