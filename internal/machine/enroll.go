package machine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/store"
)

// TokenPrefix starts every join token's secret.
const TokenPrefix = "abj_"

// TokenRequest asks for a join token: how long it lasts (a Go duration, default 24h, at most
// 720h) and how many machines it may enroll (default 1, at most 1000).
type TokenRequest struct {
	Expires string `json:"expires,omitempty"`
	Uses    int    `json:"uses,omitempty"`
}

// CreatedToken is a new join token and, once, its secret.
type CreatedToken struct {
	Token store.JoinToken `json:"token"`
	// Secret is what `agentbox join URL --token SECRET` takes: shown now and never again.
	Secret string `json:"secret"`
}

// CreateToken makes a join token.
func (r *Registry) CreateToken(ctx context.Context, req TokenRequest) (CreatedToken, error) {
	ttl := DefaultTokenTTL
	if req.Expires != "" {
		d, err := time.ParseDuration(req.Expires)
		if err != nil || d < time.Minute || d > MaxTokenTTL {
			return CreatedToken{}, errcode.New(errcode.InvalidArgument, "expires %q: a duration from 1m to %v (e.g. 24h)", req.Expires, MaxTokenTTL)
		}
		ttl = d
	}
	if req.Uses == 0 {
		req.Uses = 1
	}
	if req.Uses < 1 || req.Uses > MaxTokenUses {
		return CreatedToken{}, errcode.New(errcode.InvalidArgument, "uses %d: from 1 to %d", req.Uses, MaxTokenUses)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return CreatedToken{}, err
	}
	secret := TokenPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	id, err := newID("jt-")
	if err != nil {
		return CreatedToken{}, err
	}
	now := r.now()
	t := store.JoinToken{ID: id, Prefix: secret[:len(TokenPrefix)+8], CreatedAt: now, ExpiresAt: now.Add(ttl), Uses: req.Uses, UsesLeft: req.Uses}
	if err := r.st.CreateJoinToken(ctx, t, hashSecret(secret), r.opts.MaxTokens); err != nil {
		return CreatedToken{}, err
	}
	r.log.Info("join token created", "token_id", id, "uses", req.Uses, "expires_at", t.ExpiresAt)
	return CreatedToken{Token: t, Secret: secret}, nil
}

// ListTokens returns the join tokens, newest first, without their secrets.
func (r *Registry) ListTokens(ctx context.Context) ([]store.JoinToken, error) {
	return r.st.ListJoinTokens(ctx, r.opts.MaxTokens*10)
}

// RevokeToken revokes the join token of id or prefix ref; machines it enrolled stay.
func (r *Registry) RevokeToken(ctx context.Context, ref string) (store.JoinToken, error) {
	return r.st.RevokeJoinToken(ctx, ref, r.now())
}

// Enroll checks req and spends one use of its join token to create the machine (one
// transaction: a token's uses and expiry hold under concurrent joins).
func (r *Registry) Enroll(ctx context.Context, req proto.JoinRequest) (proto.JoinReply, error) {
	bad := func(format string, args ...any) (proto.JoinReply, error) {
		return proto.JoinReply{}, errcode.New(errcode.InvalidArgument, format, args...)
	}
	if req.Token == "" || len(req.Token) > proto.MaxTokenLen {
		return bad("token: the join token (`agentbox machine token create` prints one), at most %d characters", proto.MaxTokenLen)
	}
	if len(req.PublicKey) != ed25519.PublicKeySize {
		return bad("public_key: an ed25519 public key, %d bytes in standard base64; got %d bytes", ed25519.PublicKeySize, len(req.PublicKey))
	}
	if err := proto.CheckName("name", req.Name); err != nil {
		return bad("%v (pass --name)", err)
	}
	if err := req.Facts.Check(); err != nil {
		return bad("%v", err)
	}
	id, err := newID("mc-")
	if err != nil {
		return proto.JoinReply{}, err
	}
	m := store.Machine{ID: id, Name: req.Name, PublicKey: req.PublicKey, Platform: req.Platform, Arch: req.Arch,
		AgentVersion: req.AgentVersion, GPUs: req.GPUs, CreatedAt: r.now()}
	m, err = r.st.EnrollMachine(ctx, hashSecret(req.Token), m, r.opts.MaxMachines)
	if err != nil {
		return proto.JoinReply{}, err
	}
	r.log.Info("machine joined", "machine_id", m.ID, "name", m.Name, "platform", m.Platform, "arch", m.Arch)
	return proto.JoinReply{MachineID: m.ID, Name: m.Name}, nil
}
