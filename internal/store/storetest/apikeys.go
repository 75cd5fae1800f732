package storetest

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

var apiKeyTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"APIKeyRoundTrip", testAPIKeyRoundTrip},
	{"APIKeyNameUniqueAmongLive", testAPIKeyNameUniqueAmongLive},
	{"APIKeyBound", testAPIKeyBound},
	{"APIKeyRevokeAndTouch", testAPIKeyRevokeAndTouch},
}

func newKey(n int, at time.Time) (auth.Key, []byte) {
	k := auth.Key{ID: fmt.Sprintf("key_%012d", n), Name: fmt.Sprintf("k%d", n), Scope: auth.ScopeOperate,
		Prefix: fmt.Sprintf("abk_%06d", n), CreatedAt: at.Add(time.Duration(n) * time.Second)}
	return k, auth.Hash(fmt.Sprintf("abk_secret_%d", n))
}

// testAPIKeyRoundTrip: a key comes back by its hash with every field (times in UTC to the
// millisecond), and an unknown hash is not found.
func testAPIKeyRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	k, h := newKey(1, base())
	exp := base().Add(time.Hour)
	k.ExpiresAt = &exp
	if err := s.CreateAPIKey(ctx, k, h, 10); err != nil {
		t.Fatal(err)
	}
	got, stored, found, err := s.APIKeyByHash(ctx, h)
	if err != nil || !found || !bytes.Equal(stored, h) {
		t.Fatalf("by hash: %v %v", found, err)
	}
	if got.ID != k.ID || got.Name != k.Name || got.Scope != k.Scope || got.Prefix != k.Prefix ||
		!got.CreatedAt.Equal(k.CreatedAt) || got.CreatedAt.Location() != time.UTC ||
		got.ExpiresAt == nil || !got.ExpiresAt.Equal(exp) || got.RevokedAt != nil || got.LastUsedAt != nil {
		t.Fatalf("round trip: got %+v, want %+v", got, k)
	}
	if _, _, found, err := s.APIKeyByHash(ctx, auth.Hash("abk_other")); found || err != nil {
		t.Fatalf("unknown hash: %v %v", found, err)
	}
}

// testAPIKeyNameUniqueAmongLive: a second live key of one name is CONFLICT; once the first is
// revoked the name is free again.
func testAPIKeyNameUniqueAmongLive(t *testing.T, s store.Store) {
	ctx := t.Context()
	k1, h1 := newKey(1, base())
	k2, h2 := newKey(2, base())
	k2.Name = k1.Name
	if err := s.CreateAPIKey(ctx, k1, h1, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateAPIKey(ctx, k2, h2, 10); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("second live key of one name: %v", err)
	}
	if _, err := s.RevokeAPIKey(ctx, k1.Name, base()); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateAPIKey(ctx, k2, h2, 10); err != nil {
		t.Fatalf("name after revocation: %v", err)
	}
}

// testAPIKeyBound: Create refuses beyond max keys, and List returns at most limit, newest first.
func testAPIKeyBound(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i := range 3 {
		k, h := newKey(i, base())
		if err := s.CreateAPIKey(ctx, k, h, 3); err != nil {
			t.Fatal(err)
		}
	}
	k, h := newKey(3, base())
	if err := s.CreateAPIKey(ctx, k, h, 3); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("beyond max: %v", err)
	}
	l, err := s.ListAPIKeys(ctx, 2)
	if err != nil || len(l) != 2 || l[0].ID != "key_000000000002" || l[1].ID != "key_000000000001" {
		t.Fatalf("list: %+v %v", l, err)
	}
}

// testAPIKeyRevokeAndTouch: revocation by id or name is recorded (and idempotent by id); an
// unknown ref is INVALID_ARGUMENT; last_used_at is written.
func testAPIKeyRevokeAndTouch(t *testing.T, s store.Store) {
	ctx := t.Context()
	k1, h1 := newKey(1, base())
	k2, h2 := newKey(2, base())
	for _, x := range []struct {
		k auth.Key
		h []byte
	}{{k1, h1}, {k2, h2}} {
		if err := s.CreateAPIKey(ctx, x.k, x.h, 10); err != nil {
			t.Fatal(err)
		}
	}
	used := base().Add(time.Minute)
	if err := s.TouchAPIKey(ctx, k2.ID, used); err != nil {
		t.Fatal(err)
	}
	if got, _, _, _ := s.APIKeyByHash(ctx, h2); got.LastUsedAt == nil || !got.LastUsedAt.Equal(used) {
		t.Fatalf("last_used_at: %v", got.LastUsedAt)
	}
	at := base().Add(2 * time.Minute)
	r, err := s.RevokeAPIKey(ctx, k1.ID, at)
	if err != nil || r.ID != k1.ID || r.RevokedAt == nil || !r.RevokedAt.Equal(at) {
		t.Fatalf("revoke by id: %+v %v", r, err)
	}
	if r, err := s.RevokeAPIKey(ctx, k1.ID, at.Add(time.Hour)); err != nil || !r.RevokedAt.Equal(at) {
		t.Fatalf("revoke again: %+v %v", r, err)
	}
	if r, err := s.RevokeAPIKey(ctx, k2.Name, at); err != nil || r.ID != k2.ID {
		t.Fatalf("revoke by name: %+v %v", r, err)
	}
	if got, _, _, _ := s.APIKeyByHash(ctx, h1); got.RevokedAt == nil {
		t.Fatalf("revocation not stored")
	}
	if _, err := s.RevokeAPIKey(ctx, "nope", at); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("unknown ref: %v", err)
	}
}
