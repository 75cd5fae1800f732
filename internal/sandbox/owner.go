package sandbox

import (
	"context"
	"maps"

	"github.com/agentbox/agentbox/internal/gate"
)

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

// callEnv is the env a command in sb runs with: a sandbox claimed from a pool was started
// without its claimant's env and secrets, so that env and the secrets' placeholders (kept on
// the record) are laid under the command's own. Other sandboxes have them as the agent's base
// env already.
func callEnv(sb Sandbox, env map[string]string) map[string]string {
	if !sb.FromPool || len(sb.Env)+len(sb.Secrets) == 0 {
		return env
	}
	out := make(map[string]string, len(sb.Env)+len(sb.Secrets)+len(env))
	maps.Copy(out, sb.Env)
	for _, sc := range sb.Secrets {
		out[sc.Name] = sc.Placeholder
	}
	maps.Copy(out, env)
	return out
}

type principalKey struct{}

// WithPrincipal returns ctx carrying the principal the caller acts as (an API key's
// "key:<id>", or gate.AdminPrincipal), which Create records on the new sandbox. Unlike the
// owner, it is the same for every surface and session of one key.
func WithPrincipal(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, principalKey{}, principal)
}

// PrincipalFrom returns the principal WithPrincipal put on ctx, or gate.AdminPrincipal: what
// is made without a caller (a pool's fill, a run's sandbox before it says otherwise) is the
// admin's.
func PrincipalFrom(ctx context.Context) string {
	if p, _ := ctx.Value(principalKey{}).(string); p != "" {
		return p
	}
	return gate.AdminPrincipal
}
