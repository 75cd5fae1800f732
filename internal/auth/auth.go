// Package auth is agentbox's API keys and scopes: named keys (stored only as SHA-256 hashes)
// that a server authenticates on every request, each with a scope — read, operate or admin —
// and the scope gate (a gate.Gate) that refuses a call its caller's scope does not cover with
// PERMISSION_DENIED. The table of which scope each MCP tool and REST route needs is scopes.go.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Scopes, each covering those before it.
const (
	ScopeRead    = "read"
	ScopeOperate = "operate"
	ScopeAdmin   = "admin"
)

// KeyPrefix begins every API key, so that a leaked one is recognisable (secret scanners).
const KeyPrefix = "abk_"

// Bounds.
const (
	// MaxKeys bounds the keys a server holds (revoked and expired ones included until deleted
	// by a revocation's retention); Create refuses beyond it.
	MaxKeys = 1000
	// MaxNameLen bounds a key's name.
	MaxNameLen = 64
	// MinTTL and MaxTTL bound a key's expiry (0: never).
	MinTTL = time.Minute
	MaxTTL = 10 * 365 * 24 * time.Hour
	// TouchEvery bounds the writes of last_used_at: at most one per key per TouchEvery.
	TouchEvery = time.Minute
)

// Key is an API key's record: never the key itself, which is shown once at creation.
type Key struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Scope string `json:"scope"`
	// Prefix is the key's first characters ("abk_" and 6 more), to tell keys apart.
	Prefix     string     `json:"prefix"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

// Owner is the owner recorded for what the key creates (sandboxes, runs).
func (k Key) Owner() string { return "key:" + k.ID }

// Active reports whether k authenticates at now.
func (k Key) Active(now time.Time) bool {
	return k.RevokedAt == nil && (k.ExpiresAt == nil || now.Before(*k.ExpiresAt))
}

// Store is what the key service needs of durable state.
type Store interface {
	// CreateAPIKey inserts k with the SHA-256 hash of its key; CONFLICT if an unrevoked key
	// has k.Name, INVALID_ARGUMENT beyond max keys.
	CreateAPIKey(ctx context.Context, k Key, hash []byte, max int) error
	// APIKeyByHash returns the key whose hash is hash (found false if none).
	APIKeyByHash(ctx context.Context, hash []byte) (k Key, storedHash []byte, found bool, err error)
	// ListAPIKeys returns up to limit keys, newest first.
	ListAPIKeys(ctx context.Context, limit int) ([]Key, error)
	// RevokeAPIKey revokes the key whose id, else whose unrevoked name, is ref, at at, and
	// returns it; INVALID_ARGUMENT if none.
	RevokeAPIKey(ctx context.Context, ref string, at time.Time) (Key, error)
	// TouchAPIKey sets the key's last_used_at.
	TouchAPIKey(ctx context.Context, id string, at time.Time) error
}

// Keys creates, lists, revokes and authenticates API keys.
type Keys struct {
	store Store
	log   *slog.Logger
	now   func() time.Time

	mu      sync.Mutex
	touched map[string]time.Time // last_used_at writes in flight or done, by key id (bounded)
}

// NewKeys returns the key service over st.
func NewKeys(st Store, log *slog.Logger) *Keys {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Keys{store: st, log: log, now: time.Now, touched: map[string]time.Time{}}
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// WithClock makes ks read the time from now (tests of expiry); it returns ks.
func (ks *Keys) WithClock(now func() time.Time) *Keys {
	ks.now = now
	return ks
}

// ValidScope reports whether s is a scope.
func ValidScope(s string) bool { return rank(s) > 0 }

func rank(scope string) int {
	switch scope {
	case ScopeRead:
		return 1
	case ScopeOperate:
		return 2
	case ScopeAdmin:
		return 3
	}
	return 0
}

// Covers reports whether a caller of scope have may make a call that needs need.
func Covers(have, need string) bool {
	return need == Public || (rank(have) > 0 && rank(have) >= rank(need))
}

// Hash is the stored form of a key.
func Hash(secret string) []byte {
	s := sha256.Sum256([]byte(secret))
	return s[:]
}

// CreateRequest is a new key's name, scope and lifetime.
type CreateRequest struct {
	Name  string `json:"name"`
	Scope string `json:"scope"`
	// TTL is how long the key lasts (0: until revoked), as a Go duration ("720h").
	TTL string `json:"ttl,omitempty"`
}

// Created is a new key and, once, its secret.
type Created struct {
	Key Key `json:"key"`
	// Secret is the API key: shown now and never again.
	Secret string `json:"secret"`
}

// Create makes a key. Bad input is INVALID_ARGUMENT naming the field and its range.
func (ks *Keys) Create(ctx context.Context, req CreateRequest) (Created, error) {
	if req.Name == "" || len(req.Name) > MaxNameLen || !nameRE.MatchString(req.Name) {
		return Created{}, errcode.New(errcode.InvalidArgument, "name %q: 1–%d characters of letters, digits, '.', '_' and '-', starting with a letter or digit", req.Name, MaxNameLen)
	}
	if req.Scope == "" {
		req.Scope = ScopeRead
	}
	if !ValidScope(req.Scope) {
		return Created{}, errcode.New(errcode.InvalidArgument, "scope %q: use read, operate or admin", req.Scope)
	}
	now := ks.now().UTC().Truncate(time.Millisecond)
	k := Key{Name: req.Name, Scope: req.Scope, CreatedAt: now}
	if req.TTL != "" && req.TTL != "0" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d < MinTTL || d > MaxTTL {
			return Created{}, errcode.New(errcode.InvalidArgument, "ttl %q: a duration from %v to %v (e.g. 720h), or 0 for no expiry", req.TTL, MinTTL, MaxTTL)
		}
		exp := now.Add(d)
		k.ExpiresAt = &exp
	}
	var raw [32]byte
	var id [6]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Created{}, err
	}
	if _, err := rand.Read(id[:]); err != nil {
		return Created{}, err
	}
	secret := KeyPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	k.ID = "key_" + hex.EncodeToString(id[:])
	k.Prefix = secret[:len(KeyPrefix)+6]
	if err := ks.store.CreateAPIKey(ctx, k, Hash(secret), MaxKeys); err != nil {
		return Created{}, err
	}
	ks.log.Info("api key created", "id", k.ID, "name", k.Name, "scope", k.Scope)
	return Created{Key: k, Secret: secret}, nil
}

// List returns the keys, newest first (at most MaxKeys).
func (ks *Keys) List(ctx context.Context) ([]Key, error) { return ks.store.ListAPIKeys(ctx, MaxKeys) }

// Revoke revokes a key by id or name, at once.
func (ks *Keys) Revoke(ctx context.Context, ref string) (Key, error) {
	if ref == "" || len(ref) > MaxNameLen {
		return Key{}, errcode.New(errcode.InvalidArgument, "key %q: give a key's id (key_…) or name", ref)
	}
	k, err := ks.store.RevokeAPIKey(ctx, ref, ks.now().UTC().Truncate(time.Millisecond))
	if err == nil {
		ks.log.Info("api key revoked", "id", k.ID, "name", k.Name)
	}
	return k, err
}

// claimTouch reports whether this request writes id's last_used_at: not when another did
// within TouchEvery (concurrent requests that all read a stale value write once). The map
// holds at most MaxKeys ids: past that, entries older than TouchEvery go.
func (ks *Keys) claimTouch(id string, now time.Time) bool {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if t, ok := ks.touched[id]; ok && now.Sub(t) < TouchEvery {
		return false
	}
	if len(ks.touched) >= MaxKeys {
		for k, t := range ks.touched {
			if now.Sub(t) >= TouchEvery {
				delete(ks.touched, k)
			}
		}
		if len(ks.touched) >= MaxKeys {
			return false
		}
	}
	ks.touched[id] = now
	return true
}

// IsKey reports whether secret looks like an API key (its prefix).
func IsKey(secret string) bool { return strings.HasPrefix(secret, KeyPrefix) }

// Authenticate returns the active key whose secret this is; AUTH_FAILED (saying revoked or
// expired when it is) otherwise. last_used_at is written at most once per TouchEvery per key.
func (ks *Keys) Authenticate(ctx context.Context, secret string) (Key, error) {
	if !IsKey(secret) || len(secret) > 128 {
		return Key{}, errcode.New(errcode.AuthFailed, "not an agentbox API key")
	}
	h := Hash(secret)
	k, stored, found, err := ks.store.APIKeyByHash(ctx, h)
	if err != nil {
		return Key{}, err
	}
	if !found || subtle.ConstantTimeCompare(stored, h) != 1 {
		return Key{}, errcode.New(errcode.AuthFailed, "unknown API key")
	}
	now := ks.now()
	if k.RevokedAt != nil {
		return Key{}, errcode.New(errcode.AuthFailed, "API key %q (%s) was revoked at %s", k.Name, k.ID, k.RevokedAt.Format(time.RFC3339))
	}
	if k.ExpiresAt != nil && !now.Before(*k.ExpiresAt) {
		return Key{}, errcode.New(errcode.AuthFailed, "API key %q (%s) expired at %s", k.Name, k.ID, k.ExpiresAt.Format(time.RFC3339))
	}
	if (k.LastUsedAt == nil || now.Sub(*k.LastUsedAt) >= TouchEvery) && ks.claimTouch(k.ID, now) {
		at := now.UTC().Truncate(time.Millisecond)
		if err := ks.store.TouchAPIKey(ctx, k.ID, at); err != nil {
			ks.log.Warn("api key last_used_at", "id", k.ID, "err", err)
		} else {
			k.LastUsedAt = &at
		}
	}
	return k, nil
}
