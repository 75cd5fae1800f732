package runtime

import "context"

// TEMPORARY until the runtime branch lands (then runtime.go defines these).
type Handle string

type Adopter interface {
	Adopt(ctx context.Context, id string, h Handle) error
}

type Waiter interface {
	Wait(ctx context.Context, id string) error
}
