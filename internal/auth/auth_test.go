package auth_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// touchCounter counts last_used_at writes.
type touchCounter struct {
	*sqlite.Store
	touches atomic.Int64
}

func (c *touchCounter) TouchAPIKey(ctx context.Context, id string, at time.Time) error {
	c.touches.Add(1)
	return c.Store.TouchAPIKey(ctx, id, at)
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func keys(t *testing.T) (*auth.Keys, *touchCounter, *clock) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tc := &touchCounter{Store: st}
	clk := &clock{t: time.Now()}
	return auth.NewKeys(tc, nil).WithClock(clk.now), tc, clk
}

// TestKeyLifecycle: a created key authenticates with its id, name and scope and is stored
// only hashed; last_used_at is written at most once per TouchEvery; expiry and revocation
// refuse it at once, saying which.
func TestKeyLifecycle(t *testing.T) {
	ctx := t.Context()
	ks, tc, clk := keys(t)
	c, err := ks.Create(ctx, auth.CreateRequest{Name: "ci", Scope: auth.ScopeOperate, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.Secret, auth.KeyPrefix) || len(c.Secret) != len(auth.KeyPrefix)+43 || !strings.HasPrefix(c.Secret, c.Key.Prefix) {
		t.Fatalf("secret %q prefix %q", c.Secret, c.Key.Prefix)
	}
	var wg sync.WaitGroup
	for range 8 { // a concurrent burst: one write
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := ks.Authenticate(ctx, c.Secret)
			if err != nil || k.ID != c.Key.ID || k.Name != "ci" || k.Scope != auth.ScopeOperate {
				t.Errorf("authenticate: %+v %v", k, err)
			}
		}()
	}
	wg.Wait()
	if k, err := ks.Authenticate(ctx, c.Secret); err != nil || k.LastUsedAt == nil {
		t.Fatalf("last_used_at: %+v %v", k, err)
	}
	if n := tc.touches.Load(); n != 1 {
		t.Fatalf("%d last_used_at writes in a burst, want 1", n)
	}
	clk.add(auth.TouchEvery)
	if _, err := ks.Authenticate(ctx, c.Secret); err != nil || tc.touches.Load() != 2 {
		t.Fatalf("after TouchEvery: %v, %d writes", err, tc.touches.Load())
	}
	// Wrong keys.
	for _, bad := range []string{"", "abk_", c.Secret + "x", strings.TrimPrefix(c.Secret, "abk_"), "abk_" + strings.Repeat("A", 43)} {
		if _, err := ks.Authenticate(ctx, bad); !errcode.Is(err, errcode.AuthFailed) {
			t.Fatalf("key %q: %v", bad, err)
		}
	}
	// Expiry.
	clk.add(time.Hour)
	if _, err := ks.Authenticate(ctx, c.Secret); !errcode.Is(err, errcode.AuthFailed) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired key: %v", err)
	}
	// Revocation, by name.
	c2, err := ks.Create(ctx, auth.CreateRequest{Name: "dash"})
	if err != nil || c2.Key.Scope != auth.ScopeRead || c2.Key.ExpiresAt != nil {
		t.Fatalf("default scope and expiry: %+v %v", c2.Key, err)
	}
	if _, err := ks.Authenticate(ctx, c2.Secret); err != nil {
		t.Fatal(err)
	}
	if k, err := ks.Revoke(ctx, "dash"); err != nil || k.ID != c2.Key.ID {
		t.Fatalf("revoke: %+v %v", k, err)
	}
	if _, err := ks.Authenticate(ctx, c2.Secret); !errcode.Is(err, errcode.AuthFailed) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("revoked key: %v", err)
	}
	l, err := ks.List(ctx)
	if err != nil || len(l) != 2 || l[0].ID != c2.Key.ID || l[0].RevokedAt == nil {
		t.Fatalf("list: %+v %v", l, err)
	}
}

// TestCreateRefusesBadInput: name, scope and ttl out of range are INVALID_ARGUMENT naming the
// field; a live name twice is CONFLICT; nothing is created.
func TestCreateRefusesBadInput(t *testing.T) {
	ctx := t.Context()
	ks, _, _ := keys(t)
	for _, req := range []auth.CreateRequest{
		{Name: ""}, {Name: "-x"}, {Name: "a b"}, {Name: strings.Repeat("n", auth.MaxNameLen+1)},
		{Name: "k", Scope: "root"}, {Name: "k", TTL: "30s"}, {Name: "k", TTL: "forever"}, {Name: "k", TTL: "100000h"},
	} {
		_, err := ks.Create(ctx, req)
		field := "name"
		if req.Scope != "" {
			field = "scope"
		} else if req.TTL != "" {
			field = "ttl"
		}
		if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(err.Error(), field) {
			t.Errorf("%+v: %v", req, err)
		}
	}
	if l, _ := ks.List(ctx); len(l) != 0 {
		t.Fatalf("refused creates made keys: %+v", l)
	}
	if _, err := ks.Create(ctx, auth.CreateRequest{Name: "k"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ks.Create(ctx, auth.CreateRequest{Name: "k"}); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("second key named k: %v", err)
	}
	if _, err := ks.Revoke(ctx, "nope"); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("revoke unknown: %v", err)
	}
}

// TestScopeGate: each scope covers its own calls and those of the scopes below it; a refusal
// is PERMISSION_DENIED naming the scope needed and the key's; an unknown tool needs admin.
func TestScopeGate(t *testing.T) {
	cases := []struct {
		scope, tool string
		ok          bool
	}{
		{"read", "sandbox_list", true}, {"read", "GET /v1/sandboxes", true}, {"read", "GET /v1/sandboxes/{id}/jobs/{job_id}/logs", true},
		{"read", "sandbox_create", false}, {"read", "exec", false}, {"read", "POST /v1/sandboxes/{id}/exec", false},
		{"read", "PUT /v1/sandboxes/{id}/files", false}, {"read", "GET /v1/sandboxes/{id}/pty", false}, {"read", "POST /v1/keys", false},
		{"operate", "sandbox_create", true}, {"operate", "exec", true}, {"operate", "DELETE /v1/images", true}, {"operate", "sandbox_list", true},
		{"operate", "POST /v1/keys", false}, {"operate", "GET /v1/keys", false}, {"operate", "DELETE /v1/keys/{ref}", false},
		{"operate", "a_tool_nobody_listed", false},
		{"admin", "POST /v1/keys", true}, {"admin", "exec", true}, {"admin", "a_tool_nobody_listed", true},
		{"", "sandbox_list", false}, {"", "GET /health", true}, {"bogus", "sandbox_list", false},
	}
	for _, tc := range cases {
		c := &gate.Call{Surface: gate.SurfaceMCP, Tool: tc.tool, Caller: gate.Caller{ID: "key_1", Name: "k", Scope: tc.scope}}
		if rt, ok := api.RouteTable()[tc.tool]; ok { // a REST route: the scope its declaration gives
			c.Surface, c.Scope = gate.SurfaceREST, rt.Scope
		}
		exit, err := auth.ScopeGate{}.Enter(t.Context(), c)
		if tc.ok != (err == nil) {
			t.Errorf("%s calling %s: %v", tc.scope, tc.tool, err)
			continue
		}
		if err == nil {
			exit(nil)
			continue
		}
		e, _ := errcode.As(err)
		need := auth.NeededScope(c)
		if e == nil || e.Code != errcode.PermissionDenied || errcode.HTTPStatus(e.Code) != 403 ||
			!strings.Contains(e.Message, "needs scope "+need) || e.Details["required_scope"] != need {
			t.Errorf("%s calling %s: %#v", tc.scope, tc.tool, err)
		}
	}
}
