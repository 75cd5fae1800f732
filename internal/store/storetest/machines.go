package storetest

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/store"
)

var machineTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"JoinTokenRoundTripAndRevoke", testJoinTokenRoundTripAndRevoke},
	{"JoinTokenBound", testJoinTokenBound},
	{"EnrollSpendsTokenAndRefuses", testEnrollSpendsTokenAndRefuses},
	{"EnrollConcurrentNeverOverspends", testEnrollConcurrentNeverOverspends},
	{"MachineNamesAndAliasesUnique", testMachineNamesAndAliasesUnique},
	{"MachineHeartbeatAndRemove", testMachineHeartbeatAndRemove},
}

func joinToken(n, uses int, at time.Time, ttl time.Duration) (store.JoinToken, []byte) {
	t := store.JoinToken{ID: fmt.Sprintf("jt-%012d", n), Prefix: fmt.Sprintf("abj_%06d", n), CreatedAt: at,
		ExpiresAt: at.Add(ttl), Uses: uses, UsesLeft: uses}
	h := bytes.Repeat([]byte{byte(n)}, 32)
	return t, h
}

func newMachine(n int, name string, at time.Time) store.Machine {
	return store.Machine{ID: fmt.Sprintf("mc-%012d", n), Name: name, PublicKey: bytes.Repeat([]byte{byte(n)}, 32),
		Platform: "linux", Arch: "amd64", AgentVersion: "v1", CreatedAt: at}
}

func wantCode(t *testing.T, err error, code errcode.Code, what string) {
	t.Helper()
	if errcode.Of(err) != code {
		t.Fatalf("%s: got %v (%s), want %s", what, err, errcode.Of(err), code)
	}
}

// testJoinTokenRoundTripAndRevoke: a token lists with every field and no secret; revoking by
// id or prefix sets revoked_at once; an unknown ref is INVALID_ARGUMENT.
func testJoinTokenRoundTripAndRevoke(t *testing.T, s store.Store) {
	ctx := t.Context()
	tok, h := joinToken(1, 3, base(), time.Hour)
	if err := s.CreateJoinToken(ctx, tok, h, 10); err != nil {
		t.Fatal(err)
	}
	l, err := s.ListJoinTokens(ctx, 10)
	if err != nil || len(l) != 1 {
		t.Fatalf("list: %v %v", l, err)
	}
	g := l[0]
	if g.ID != tok.ID || g.Prefix != tok.Prefix || !g.CreatedAt.Equal(tok.CreatedAt) || g.CreatedAt.Location() != time.UTC ||
		!g.ExpiresAt.Equal(tok.ExpiresAt) || g.Uses != 3 || g.UsesLeft != 3 || g.RevokedAt != nil {
		t.Fatalf("round trip: got %+v, want %+v", g, tok)
	}
	r, err := s.RevokeJoinToken(ctx, tok.Prefix, base().Add(time.Minute))
	if err != nil || r.RevokedAt == nil || !r.RevokedAt.Equal(base().Add(time.Minute)) {
		t.Fatalf("revoke: %+v %v", r, err)
	}
	r2, err := s.RevokeJoinToken(ctx, tok.ID, base().Add(time.Hour))
	if err != nil || !r2.RevokedAt.Equal(*r.RevokedAt) {
		t.Fatalf("revoke again: %+v %v", r2, err)
	}
	_, err = s.RevokeJoinToken(ctx, "jt-nope", base())
	wantCode(t, err, errcode.InvalidArgument, "revoke unknown")
}

// testJoinTokenBound: at most max usable tokens; revoked ones do not count.
func testJoinTokenBound(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i := 1; i <= 2; i++ {
		tok, h := joinToken(i, 1, base(), time.Hour)
		if err := s.CreateJoinToken(ctx, tok, h, 2); err != nil {
			t.Fatal(err)
		}
	}
	tok, h := joinToken(3, 1, base(), time.Hour)
	wantCode(t, s.CreateJoinToken(ctx, tok, h, 2), errcode.InvalidArgument, "third token")
	if _, err := s.RevokeJoinToken(ctx, "jt-000000000001", base()); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJoinToken(ctx, tok, h, 2); err != nil {
		t.Fatalf("after revoke: %v", err)
	}
}

// testEnrollSpendsTokenAndRefuses: each enrollment spends one use; a used-up, expired,
// revoked or unknown token is AUTH_FAILED and creates nothing; a taken name is CONFLICT and
// spends nothing.
func testEnrollSpendsTokenAndRefuses(t *testing.T, s store.Store) {
	ctx := t.Context()
	tok, h := joinToken(1, 2, base(), time.Hour)
	if err := s.CreateJoinToken(ctx, tok, h, 10); err != nil {
		t.Fatal(err)
	}
	m1 := newMachine(1, "gpu-box", base().Add(time.Second))
	m1.GPUs = []gpu.GPU{{Index: 0, Name: "NVIDIA A100", MemoryTotalMB: 81920, MemoryUsedMB: 1, UtilizationPct: 2}}
	got, err := s.EnrollMachine(ctx, h, m1, 100)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != m1.ID || got.Name != "gpu-box" || !bytes.Equal(got.PublicKey, m1.PublicKey) || got.Platform != "linux" ||
		got.LastSeen != nil || len(got.GPUs) != 1 || got.GPUs[0] != m1.GPUs[0] || got.Aliases == nil || got.RemovedAt != nil {
		t.Fatalf("enrolled: %+v", got)
	}
	_, err = s.EnrollMachine(ctx, h, newMachine(2, "gpu-box", base().Add(time.Second)), 100)
	wantCode(t, err, errcode.Conflict, "taken name")
	if _, err := s.EnrollMachine(ctx, h, newMachine(2, "second", base().Add(time.Second)), 100); err != nil {
		t.Fatalf("second use (the conflict spent nothing): %v", err)
	}
	_, err = s.EnrollMachine(ctx, h, newMachine(3, "third", base().Add(time.Second)), 100)
	wantCode(t, err, errcode.AuthFailed, "used up")
	l, _ := s.ListJoinTokens(ctx, 10)
	if l[0].UsesLeft != 0 {
		t.Fatalf("uses left %d", l[0].UsesLeft)
	}
	exp, eh := joinToken(2, 5, base(), time.Minute)
	if err := s.CreateJoinToken(ctx, exp, eh, 10); err != nil {
		t.Fatal(err)
	}
	_, err = s.EnrollMachine(ctx, eh, newMachine(4, "late", base().Add(time.Minute)), 100)
	wantCode(t, err, errcode.AuthFailed, "expired")
	rev, rh := joinToken(3, 5, base(), time.Hour)
	if err := s.CreateJoinToken(ctx, rev, rh, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeJoinToken(ctx, rev.ID, base()); err != nil {
		t.Fatal(err)
	}
	_, err = s.EnrollMachine(ctx, rh, newMachine(5, "revoked", base().Add(time.Second)), 100)
	wantCode(t, err, errcode.AuthFailed, "revoked")
	_, err = s.EnrollMachine(ctx, bytes.Repeat([]byte{99}, 32), newMachine(6, "unknown", base()), 100)
	wantCode(t, err, errcode.AuthFailed, "unknown")
	ms, err := s.ListMachines(ctx, 100)
	if err != nil || len(ms) != 2 || ms[0].Name != "gpu-box" || ms[1].Name != "second" {
		t.Fatalf("machines: %+v %v", ms, err)
	}
	ok, okh := joinToken(4, 5, base(), time.Hour)
	if err := s.CreateJoinToken(ctx, ok, okh, 10); err != nil {
		t.Fatal(err)
	}
	_, err = s.EnrollMachine(ctx, okh, newMachine(7, "over", base()), 2)
	wantCode(t, err, errcode.InvalidArgument, "machine bound")
}

// testEnrollConcurrentNeverOverspends: 8 concurrent enrollments with a 3-use token: exactly
// 3 machines.
func testEnrollConcurrentNeverOverspends(t *testing.T, s store.Store) {
	ctx := t.Context()
	tok, h := joinToken(1, 3, base(), time.Hour)
	if err := s.CreateJoinToken(ctx, tok, h, 10); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.EnrollMachine(ctx, h, newMachine(i+1, fmt.Sprintf("m%d", i), base()), 100)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				ok++
			} else if errcode.Of(err) != errcode.AuthFailed {
				t.Errorf("enroll %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	ms, _ := s.ListMachines(ctx, 100)
	if ok != 3 || len(ms) != 3 {
		t.Fatalf("%d enrolled, %d listed; want 3", ok, len(ms))
	}
}

// testMachineNamesAndAliasesUnique: a machine resolves by id, name and alias; an alias may not
// be any live machine's name or alias; a removed machine frees both.
func testMachineNamesAndAliasesUnique(t *testing.T, s store.Store) {
	ctx := t.Context()
	tok, h := joinToken(1, 10, base(), time.Hour)
	if err := s.CreateJoinToken(ctx, tok, h, 10); err != nil {
		t.Fatal(err)
	}
	a, err := s.EnrollMachine(ctx, h, newMachine(1, "alpha", base()), 100)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.EnrollMachine(ctx, h, newMachine(2, "beta", base()), 100)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.AddMachineAlias(ctx, "alpha", "trainer", 4); err != nil || len(m.Aliases) != 1 || m.Aliases[0] != "trainer" {
		t.Fatalf("alias: %+v %v", m, err)
	}
	if m, err := s.AddMachineAlias(ctx, a.ID, "trainer", 4); err != nil || len(m.Aliases) != 1 {
		t.Fatalf("alias again: %+v %v", m, err)
	}
	for _, ref := range []string{a.ID, "alpha", "trainer"} {
		if m, err := s.Machine(ctx, ref); err != nil || m.ID != a.ID || len(m.Aliases) != 1 {
			t.Fatalf("resolve %q: %+v %v", ref, m, err)
		}
	}
	_, err = s.AddMachineAlias(ctx, "beta", "trainer", 4)
	wantCode(t, err, errcode.Conflict, "alias taken")
	_, err = s.AddMachineAlias(ctx, "beta", "alpha", 4)
	wantCode(t, err, errcode.Conflict, "alias = other's name")
	_, err = s.EnrollMachine(ctx, h, newMachine(3, "trainer", base()), 100)
	wantCode(t, err, errcode.Conflict, "name = other's alias")
	_, err = s.AddMachineAlias(ctx, "beta", "b2", 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.AddMachineAlias(ctx, "beta", "b3", 1)
	wantCode(t, err, errcode.InvalidArgument, "alias bound")
	if m, err := s.RemoveMachineAlias(ctx, "b2", "b2"); err != nil || len(m.Aliases) != 0 {
		t.Fatalf("remove alias: %+v %v", m, err)
	}
	_, err = s.RemoveMachineAlias(ctx, "beta", "b2")
	wantCode(t, err, errcode.InvalidArgument, "remove missing alias")
	_, err = s.Machine(ctx, "nope")
	wantCode(t, err, errcode.MachineNotFound, "unknown ref")
	if _, err := s.RemoveMachine(ctx, "trainer", base().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	_, err = s.Machine(ctx, "alpha")
	wantCode(t, err, errcode.MachineNotFound, "removed")
	if m, err := s.MachineByID(ctx, a.ID); err != nil || m.RemovedAt == nil {
		t.Fatalf("by id after remove: %+v %v", m, err)
	}
	if _, err := s.AddMachineAlias(ctx, b.ID, "trainer", 4); err != nil {
		t.Fatalf("freed alias: %v", err)
	}
	if _, err := s.EnrollMachine(ctx, h, newMachine(4, "alpha", base()), 100); err != nil {
		t.Fatalf("freed name: %v", err)
	}
}

// testMachineHeartbeatAndRemove: a heartbeat stores facts and last_seen; a removed machine's
// heartbeat is MACHINE_NOT_FOUND and it is no longer listed.
func testMachineHeartbeatAndRemove(t *testing.T, s store.Store) {
	ctx := t.Context()
	tok, h := joinToken(1, 10, base(), time.Hour)
	if err := s.CreateJoinToken(ctx, tok, h, 10); err != nil {
		t.Fatal(err)
	}
	m, err := s.EnrollMachine(ctx, h, newMachine(1, "alpha", base()), 100)
	if err != nil {
		t.Fatal(err)
	}
	at := base().Add(90 * time.Second).In(zone())
	g := []gpu.GPU{{Index: 0, Name: "A", MemoryTotalMB: 10, MemoryUsedMB: 5, UtilizationPct: 50}, {Index: 1, Name: "B", MemoryTotalMB: 10, MemoryUsedMB: -1, UtilizationPct: -1}}
	if err := s.RecordHeartbeat(ctx, m.ID, store.MachineFacts{Platform: "linux", Arch: "arm64", AgentVersion: "v2", GPUs: g}, at); err != nil {
		t.Fatal(err)
	}
	got, err := s.Machine(ctx, m.ID)
	if err != nil || got.LastSeen == nil || !got.LastSeen.Equal(at) || got.LastSeen.Location() != time.UTC ||
		got.Arch != "arm64" || got.AgentVersion != "v2" || len(got.GPUs) != 2 || got.GPUs[1] != g[1] {
		t.Fatalf("after heartbeat: %+v %v", got, err)
	}
	if _, err := s.RemoveMachine(ctx, "alpha", base()); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.RecordHeartbeat(ctx, m.ID, store.MachineFacts{}, at), errcode.MachineNotFound, "heartbeat after remove")
	_, err = s.RemoveMachine(ctx, m.ID, base())
	wantCode(t, err, errcode.MachineNotFound, "remove twice")
	if ms, err := s.ListMachines(ctx, 10); err != nil || len(ms) != 0 {
		t.Fatalf("list after remove: %+v %v", ms, err)
	}
}
