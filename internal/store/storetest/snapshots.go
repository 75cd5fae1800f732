package storetest

import (
	"maps"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// snapshotTests are the cases of the snapshot records (sandbox.SnapshotStore) and of the
// sandbox fields snapshots and sleep add; Run runs them with the rest.
var snapshotTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"SnapshotRoundTrip", testSnapshotRoundTrip},
	{"SnapshotUnknown", testSnapshotUnknown},
	{"SnapshotCreateChecks", testSnapshotCreateChecks},
	{"SnapshotUpdateVersion", testSnapshotUpdateVersion},
	{"SnapshotConcurrentUpdateOneWins", testSnapshotConcurrentUpdateOneWins},
	{"SnapshotListCursorAndBounds", testSnapshotListCursorAndBounds},
	{"SnapshotBytesReadyUserOnly", testSnapshotBytes},
	{"SnapshotOutlivesPrunedSandbox", testSnapshotOutlivesPrune},
	{"SandboxSnapshotFieldsRoundTrip", testSandboxSnapshotFields},
}

func newSnapshot(sb sandbox.Sandbox, at time.Time) sandbox.Snapshot {
	return sandbox.Snapshot{
		ID: sandbox.NewSnapshotID(), SandboxID: sb.ID, State: sandbox.SnapshotCreating,
		Kind: "files", Purpose: sandbox.SnapshotPurposeUser, Runtime: sb.Runtime, Image: sb.Image,
		ImageDigest: sb.ImageDigest, CPU: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB,
		Labels: map[string]string{"step": "1"}, CreatedAt: at, Version: 1,
	}
}

func mustCreateSnapshot(t *testing.T, s store.Store, sn sandbox.Snapshot) sandbox.Snapshot {
	t.Helper()
	if err := s.CreateSnapshot(t.Context(), sn); err != nil {
		t.Fatalf("CreateSnapshot(%s): %v", sn.ID, err)
	}
	return sn
}

func mustGetSnapshot(t *testing.T, s store.Store, id string) sandbox.Snapshot {
	t.Helper()
	sn, err := s.GetSnapshot(t.Context(), id)
	if err != nil {
		t.Fatalf("GetSnapshot(%s): %v", id, err)
	}
	return sn
}

func checkSnapshotRecord(t *testing.T, want, got sandbox.Snapshot) {
	t.Helper()
	wc, gc := want.CreatedAt, got.CreatedAt
	checkTime(t, want.ID+": CreatedAt", wc, gc)
	checkMap(t, want.ID+": Labels", want.Labels, got.Labels)
	want.CreatedAt, got.CreatedAt = time.Time{}, time.Time{}
	want.Labels, got.Labels = nil, nil
	if !reflect.DeepEqual(want, got) {
		t.Errorf("snapshot read back as\n%+v\nwant\n%+v", got, want)
	}
}

func snapshotIDs(sns []sandbox.Snapshot) []string {
	out := make([]string, len(sns))
	for i, sn := range sns {
		out[i] = sn.ID
	}
	return out
}

func testSnapshotRoundTrip(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	sn := newSnapshot(sb, base().Add(time.Second))
	sn.Kind, sn.SizeBytes, sn.IDBase, sn.Node = "files+memory", 123<<20, 1<<20, "node-a"
	sn.Network = &sandbox.Network{Policy: &egress.Policy{Allow: []string{"pypi.org", "*.github.com"}, Deny: []string{}}}
	sn.Secrets = []egress.Secret{{Name: "GH", Placeholder: "ph-1", From: "env:GH_TOKEN", Hosts: []string{"api.github.com"}}}
	sn.Labels = map[string]string{"a": "b", "quote": `"x"`}
	mustCreateSnapshot(t, s, sn)
	checkSnapshotRecord(t, sn, mustGetSnapshot(t, s, sn.ID))

	// No network, no secrets, no labels read back as none.
	bare := newSnapshot(sb, base().Add(2*time.Second))
	bare.Labels = nil
	mustCreateSnapshot(t, s, bare)
	got := mustGetSnapshot(t, s, bare.ID)
	if got.Network != nil || got.Secrets != nil || got.Labels != nil {
		t.Errorf("bare snapshot read back with network %v, secrets %v, labels %v; want none", got.Network, got.Secrets, got.Labels)
	}
	checkSnapshotRecord(t, bare, got)
}

func testSnapshotUnknown(t *testing.T, s store.Store) {
	id := sandbox.NewSnapshotID()
	_, err := s.GetSnapshot(t.Context(), id)
	if !errcode.Is(err, errcode.SnapshotNotFound) {
		t.Fatalf("GetSnapshot(unknown) = %v, want SNAPSHOT_NOT_FOUND", err)
	}
	for _, want := range []string{id, "snapshot_list"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("GetSnapshot(unknown) = %q; it should name %q", err, want)
		}
	}
	if err := s.DeleteSnapshot(t.Context(), id); !errcode.Is(err, errcode.SnapshotNotFound) {
		t.Errorf("DeleteSnapshot(unknown) = %v, want SNAPSHOT_NOT_FOUND", err)
	}
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	sn := newSnapshot(sb, base())
	sn.Version = 2
	if err := s.UpdateSnapshot(t.Context(), sn); !errcode.Is(err, errcode.SnapshotNotFound) {
		t.Errorf("UpdateSnapshot(unknown) = %v, want SNAPSHOT_NOT_FOUND", err)
	}
}

func testSnapshotCreateChecks(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	sn := mustCreateSnapshot(t, s, newSnapshot(sb, base()))
	if err := s.CreateSnapshot(t.Context(), sn); !errcode.Is(err, errcode.Conflict) {
		t.Errorf("CreateSnapshot(existing id) = %v, want CONFLICT", err)
	}
	orphan := newSnapshot(sandbox.Sandbox{ID: sandbox.NewID()}, base())
	if err := s.CreateSnapshot(t.Context(), orphan); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("CreateSnapshot(unknown sandbox) = %v, want SANDBOX_NOT_FOUND", err)
	}
	bad := newSnapshot(sb, base())
	bad.ID = "snap-nothex"
	if err := s.CreateSnapshot(t.Context(), bad); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateSnapshot(malformed id) = %v, want INVALID_ARGUMENT", err)
	}
	v2 := newSnapshot(sb, base())
	v2.Version = 2
	if err := s.CreateSnapshot(t.Context(), v2); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateSnapshot(version 2) = %v, want INVALID_ARGUMENT", err)
	}
	st := newSnapshot(sb, base())
	st.State = "half"
	if err := s.CreateSnapshot(t.Context(), st); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateSnapshot(unknown state) = %v, want INVALID_ARGUMENT", err)
	}
}

func testSnapshotUpdateVersion(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	sn := mustCreateSnapshot(t, s, newSnapshot(sb, base()))
	ready := sn
	ready.State, ready.SizeBytes, ready.Kind, ready.Version = sandbox.SnapshotReady, 4096, "files", 2
	if err := s.UpdateSnapshot(t.Context(), ready); err != nil {
		t.Fatalf("UpdateSnapshot(ready): %v", err)
	}
	checkSnapshotRecord(t, ready, mustGetSnapshot(t, s, sn.ID))
	stale := sn
	stale.State, stale.Version = sandbox.SnapshotFailed, 2 // expects version 1, stored 2
	err := s.UpdateSnapshot(t.Context(), stale)
	if !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("UpdateSnapshot(stale) = %v, want CONFLICT", err)
	}
	checkSnapshotRecord(t, ready, mustGetSnapshot(t, s, sn.ID))
	if err := s.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	if _, err := s.GetSnapshot(t.Context(), sn.ID); !errcode.Is(err, errcode.SnapshotNotFound) {
		t.Errorf("GetSnapshot after delete = %v, want SNAPSHOT_NOT_FOUND", err)
	}
}

func testSnapshotConcurrentUpdateOneWins(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	sn := mustCreateSnapshot(t, s, newSnapshot(sb, base()))
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := sn
			u.State, u.SizeBytes, u.Version = sandbox.SnapshotReady, int64(i+1), 2
			errs[i] = s.UpdateSnapshot(t.Context(), u)
		}()
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errcode.Is(err, errcode.Conflict):
			t.Errorf("writer %d: %v, want nil or CONFLICT", i, err)
		}
	}
	if won != 1 {
		t.Errorf("%d concurrent updates of version 1 succeeded, want exactly 1", won)
	}
}

func testSnapshotListCursorAndBounds(t *testing.T, s store.Store) {
	a := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	b := mustCreate(t, s, newSandbox(2, sandbox.StateRunning, base(), nil))
	var ofA []string
	// 5 of a (two share a created_at: the id breaks the tie), 2 of b, and a sleep snapshot of a.
	for i := range 5 {
		at := base().Add(time.Duration(i/2) * time.Second)
		ofA = append(ofA, mustCreateSnapshot(t, s, newSnapshot(a, at)).ID)
	}
	for i := range 2 {
		mustCreateSnapshot(t, s, newSnapshot(b, base().Add(time.Duration(i)*time.Minute)))
	}
	sleep := newSnapshot(a, base().Add(time.Hour))
	sleep.Purpose = sandbox.SnapshotPurposeSleep
	mustCreateSnapshot(t, s, sleep)

	list := func(f sandbox.SnapshotFilter) []sandbox.Snapshot {
		t.Helper()
		sns, err := s.ListSnapshots(t.Context(), f)
		if err != nil {
			t.Fatalf("ListSnapshots(%+v): %v", f, err)
		}
		return sns
	}
	all := list(sandbox.SnapshotFilter{})
	if len(all) != 8 {
		t.Fatalf("ListSnapshots() = %d snapshots, want 8", len(all))
	}
	for i := 1; i < len(all); i++ {
		p, c := all[i-1], all[i]
		if c.CreatedAt.Before(p.CreatedAt) || (c.CreatedAt.Equal(p.CreatedAt) && c.ID < p.ID) {
			t.Errorf("ListSnapshots not oldest first (created_at, id): %s then %s", p.ID, c.ID)
		}
	}
	// Paging a's user snapshots two at a time sees each exactly once, in order.
	var paged []string
	after := ""
	for range 10 {
		page := list(sandbox.SnapshotFilter{SandboxID: a.ID, Purpose: sandbox.SnapshotPurposeUser, After: after, Limit: 2})
		if len(page) == 0 {
			break
		}
		paged = append(paged, snapshotIDs(page)...)
		after = page[len(page)-1].ID
	}
	got := map[string]bool{}
	for _, id := range paged {
		got[id] = true
	}
	want := map[string]bool{}
	for _, id := range ofA {
		want[id] = true
	}
	if len(paged) != 5 || !maps.Equal(got, want) {
		t.Errorf("paging a's user snapshots by 2 = %v, want each of %v once", paged, ofA)
	}
	if sns := list(sandbox.SnapshotFilter{SandboxID: a.ID, Purpose: sandbox.SnapshotPurposeSleep}); len(sns) != 1 || sns[0].ID != sleep.ID {
		t.Errorf("sleep snapshots of a = %v, want [%s]", snapshotIDs(sns), sleep.ID)
	}
	if sns := list(sandbox.SnapshotFilter{States: []sandbox.SnapshotState{sandbox.SnapshotReady}}); len(sns) != 0 {
		t.Errorf("ready snapshots = %v, want none", snapshotIDs(sns))
	}
	for _, n := range []int{-1, sandbox.MaxSnapshotList + 1} {
		if _, err := s.ListSnapshots(t.Context(), sandbox.SnapshotFilter{Limit: n}); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("ListSnapshots(limit %d) = %v, want INVALID_ARGUMENT", n, err)
		}
	}
	if _, err := s.ListSnapshots(t.Context(), sandbox.SnapshotFilter{After: sandbox.NewSnapshotID()}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("ListSnapshots(after unknown) = %v, want INVALID_ARGUMENT", err)
	}
}

func testSnapshotBytes(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	mk := func(state sandbox.SnapshotState, purpose string, size int64) {
		sn := newSnapshot(sb, base())
		sn.State, sn.Purpose, sn.SizeBytes = state, purpose, size
		mustCreateSnapshot(t, s, sn)
	}
	mk(sandbox.SnapshotReady, sandbox.SnapshotPurposeUser, 1000)
	mk(sandbox.SnapshotReady, sandbox.SnapshotPurposeUser, 24)
	mk(sandbox.SnapshotCreating, sandbox.SnapshotPurposeUser, 1<<20)
	mk(sandbox.SnapshotFailed, sandbox.SnapshotPurposeUser, 1<<21)
	mk(sandbox.SnapshotReady, sandbox.SnapshotPurposeSleep, 1<<22)
	n, err := s.SnapshotBytes(t.Context())
	if err != nil || n != 1024 {
		t.Errorf("SnapshotBytes = %d, %v; want 1024 (ready user snapshots only)", n, err)
	}
}

func testSnapshotOutlivesPrune(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	sn := mustCreateSnapshot(t, s, newSnapshot(sb, base()))
	gone, ev := next(sb, sandbox.StateStopping, base().Add(time.Second), "destroy")
	if err := s.UpdateSandbox(t.Context(), gone, ev); err != nil {
		t.Fatal(err)
	}
	gone, ev = next(gone, sandbox.StateDestroyed, base().Add(2*time.Second), "destroyed")
	if err := s.UpdateSandbox(t.Context(), gone, ev); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneSandboxes(t.Context(), base().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("PruneSandboxes = %d, %v; want 1", n, err)
	}
	checkSnapshotRecord(t, sn, mustGetSnapshot(t, s, sn.ID))
}

func testSandboxSnapshotFields(t *testing.T, s store.Store) {
	sb := newSandbox(1, sandbox.StateRunning, base(), nil)
	sb.FromSnapshot, sb.AutoWake, sb.TTLWhileSleeping = sandbox.NewSnapshotID(), true, true
	sb.OnExpiry, sb.TTLSeconds = sandbox.OnExpirySleep, 3600
	mustCreate(t, s, sb)
	got := mustGet(t, s, sb.ID)
	if got.OnExpiry != sandbox.OnExpirySleep || got.TTLSeconds != 3600 {
		t.Errorf("new sandbox read back with on_expiry %q ttl_seconds %d; want %q 3600", got.OnExpiry, got.TTLSeconds, sandbox.OnExpirySleep)
	}
	if got.FromSnapshot != sb.FromSnapshot || !got.AutoWake || !got.TTLWhileSleeping || got.SleepSnapshot != "" || !got.SleptAt.IsZero() {
		t.Errorf("new sandbox read back with from_snapshot %q auto_wake %v ttl_while_sleeping %v sleep_snapshot %q slept_at %v; want %q true true \"\" zero",
			got.FromSnapshot, got.AutoWake, got.TTLWhileSleeping, got.SleepSnapshot, got.SleptAt, sb.FromSnapshot)
	}
	// A plain record has none of them.
	plain := mustCreate(t, s, newSandbox(2, sandbox.StateRunning, base(), nil))
	if g := mustGet(t, s, plain.ID); g.FromSnapshot != "" || g.AutoWake || g.TTLWhileSleeping || !g.SleptAt.IsZero() || g.OnExpiry != "" || g.TTLSeconds != 0 {
		t.Errorf("plain sandbox read back with snapshot fields %+v", g)
	}
	// An update writes them.
	up, ev := next(got, sandbox.StateRunning, base().Add(time.Second), "")
	ev.To = ""
	up.SleepSnapshot, up.SleptAt, up.AutoWake = sandbox.NewSnapshotID(), base().Add(time.Minute), false
	up.OnExpiry, up.TTLSeconds = "", 60
	if err := s.UpdateSandbox(t.Context(), up, ev); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	got = mustGet(t, s, sb.ID)
	if got.OnExpiry != "" || got.TTLSeconds != 60 {
		t.Errorf("updated sandbox read back with on_expiry %q ttl_seconds %d; want \"\" 60", got.OnExpiry, got.TTLSeconds)
	}
	if got.SleepSnapshot != up.SleepSnapshot || got.AutoWake || !got.TTLWhileSleeping || got.FromSnapshot != sb.FromSnapshot {
		t.Errorf("updated sandbox read back with sleep_snapshot %q auto_wake %v ttl_while_sleeping %v from_snapshot %q; want %q false true %q",
			got.SleepSnapshot, got.AutoWake, got.TTLWhileSleeping, got.FromSnapshot, up.SleepSnapshot, sb.FromSnapshot)
	}
	checkTime(t, "SleptAt", up.SleptAt, got.SleptAt)
	list := mustList(t, s, sandbox.ListFilter{})
	for _, l := range list {
		if l.ID == sb.ID && l.SleepSnapshot != up.SleepSnapshot {
			t.Errorf("ListSandboxes: sleep_snapshot %q, want %q", l.SleepSnapshot, up.SleepSnapshot)
		}
	}
}
