package sandbox

import "context"

type ownerKey struct{}

// WithOwner returns ctx carrying the identity of the caller (an API key's name, an MCP session),
// which Create records as the new sandbox's owner and which scopes idempotency keys.
func WithOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// OwnerFrom returns the owner WithOwner put on ctx, or "".
func OwnerFrom(ctx context.Context) string {
	o, _ := ctx.Value(ownerKey{}).(string)
	return o
}
