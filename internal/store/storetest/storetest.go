// Package storetest is the shared conformance suite for store.Store drivers: every driver
// (sqlite, postgres) runs Run from its own tests and must pass all of it.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// Run runs the conformance suite against the driver that open constructs. open must return a
// new, empty store each time it is called (subtests run in parallel, each on its own store);
// Run closes every store it opens when its subtest ends.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		run  func(t *testing.T, s store.Store)
	}{
		{"CreateGetRoundTrip", testCreateGetRoundTrip},
		{"CreateGetEmptyFields", testCreateGetEmptyFields},
		{"TimesMillisecondPrecise", testTimesMillisecondPrecise},
		{"GetUnknown", testGetUnknown},
		{"CreateExisting", testCreateExisting},
		{"CreateRequiresVersion1", testCreateRequiresVersion1},
		{"Update", testUpdate},
		{"UpdateWithoutEvent", testUpdateWithoutEvent},
		{"UpdateStaleVersion", testUpdateStaleVersion},
		{"UpdateUnknown", testUpdateUnknown},
		{"ListSandboxes", testListSandboxes},
		{"ListDefaultBound", testListDefaultBound},
		{"CountLive", testCountLive},
		{"ListEvents", testListEvents},
		{"Prune", testPrune},
		{"SeqNotReusedAfterPrune", testSeqNotReusedAfterPrune},
		{"ConcurrentUpdateOneWins", testConcurrentUpdateOneWins},
		{"ConcurrentWritersAndReaders", testConcurrentWritersAndReaders},
		{"IDRangeAllocateListRelease", testIDRangeAllocateListRelease},
		{"IDRangeConflicts", testIDRangeConflicts},
		{"IDRangeConcurrentAllocate", testIDRangeConcurrentAllocate},
		{"IDRangePrune", testIDRangePrune},
		{"OwnerNodeHandleRoundTrip", testOwnerNodeHandleRoundTrip},
		{"AdmitBounds", testAdmitBounds},
		{"SleepingUsageAndAdmitWake", testSleepingUsageAndAdmitWake},
		{"AdmitIdempotencyKey", testAdmitIdempotencyKey},
		{"AdmitConcurrentNeverOvershoots", testAdmitConcurrentNeverOvershoots},
		{"ConcurrentAppendsPagingReaderSeesEvery", testConcurrentAppendsPagingReader},
	}
	tests = append(tests, jobTests...)
	tests = append(tests, netTests...)
	tests = append(tests, imageTests...)
	tests = append(tests, runTests...)
	tests = append(tests, apiKeyTests...)       // API keys
	tests = append(tests, auditTests...)        // the audit log
	tests = append(tests, sqlTests...)          // execute_sql's views (sql.go)
	tests = append(tests, approvalTests...)     // approvals
	tests = append(tests, snapshotTests...)     // snapshots
	tests = append(tests, poolTests...)         // warm pools (pools.go)
	tests = append(tests, machineTests...)      // joined machines (machines.go)
	tests = append(tests, remoteJobTests...)    // remote jobs (remotejobs.go)
	tests = append(tests, blobTests...)         // the file relay (blobs.go)
	tests = append(tests, leaseTests...)        // leases across replicas (leases.go)
	tests = append(tests, conversationTests...) // conversations of agentbox chat (conversations.go)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tc.run(t, s)
		})
	}
}

// zone is not UTC, so a driver that returns times in the caller's zone fails the round trip.
func zone() *time.Location { return time.FixedZone("UTC+05:30", 5*3600+1800) }

// base is a millisecond-aligned time, so a driver that drops milliseconds fails the round trip.
func base() time.Time { return time.Date(2025, 3, 14, 15, 9, 26, 535_000_000, zone()) }

// newSandbox returns a fully populated version-1 record; n makes its fields distinct.
func newSandbox(n int, state sandbox.State, created time.Time, labels map[string]string) sandbox.Sandbox {
	return sandbox.Sandbox{
		ID:    sandbox.NewID(),
		State: state,
		Image: fmt.Sprintf("registry.example/agent:%d", n),
		// ImageDigest pins the image (the n-th of 3 digests, so several records share one).
		ImageDigest: fmt.Sprintf("sha256:%064x", n%3+1),
		Runtime:     "runc",
		Isolation:   "container",
		CPU:         0.25 * float64(n+1),
		MemoryMB:    int64(256 * (n + 1)),
		DiskMB:      int64(1024 * (n + 1)),
		PidsLimit:   int64(100 + n),
		Env:         map[string]string{"N": fmt.Sprint(n)},
		Labels:      labels,
		CreatedAt:   created,
		UpdatedAt:   created,
		ExpiresAt:   created.Add(time.Hour),
		Version:     1,
	}
}

func createEvent(sb sandbox.Sandbox) sandbox.Event {
	return sandbox.Event{SandboxID: sb.ID, Type: "state", To: sb.State, Reason: "create requested", At: sb.CreatedAt}
}

func mustCreate(t *testing.T, s store.Store, sb sandbox.Sandbox) sandbox.Sandbox {
	t.Helper()
	if err := s.CreateSandbox(t.Context(), sb, createEvent(sb)); err != nil {
		t.Fatalf("CreateSandbox(%s): %v", sb.ID, err)
	}
	return sb
}

func mustGet(t *testing.T, s store.Store, id string) sandbox.Sandbox {
	t.Helper()
	sb, err := s.GetSandbox(t.Context(), id)
	if err != nil {
		t.Fatalf("GetSandbox(%s): %v", id, err)
	}
	return sb
}

func mustEvents(t *testing.T, s store.Store, f sandbox.EventFilter) []sandbox.Event {
	t.Helper()
	evs, err := s.ListEvents(t.Context(), f)
	if err != nil {
		t.Fatalf("ListEvents(%+v): %v", f, err)
	}
	return evs
}

func mustList(t *testing.T, s store.Store, f sandbox.ListFilter) []sandbox.Sandbox {
	t.Helper()
	sbs, err := s.ListSandboxes(t.Context(), f)
	if err != nil {
		t.Fatalf("ListSandboxes(%+v): %v", f, err)
	}
	return sbs
}

// next returns sb advanced one version to state to, with the event recording it.
func next(sb sandbox.Sandbox, to sandbox.State, at time.Time, reason string) (sandbox.Sandbox, sandbox.Event) {
	ev := sandbox.Event{SandboxID: sb.ID, Type: "state", From: sb.State, To: to, Reason: reason, At: at}
	sb.State, sb.UpdatedAt = to, at
	sb.Version++
	return sb, ev
}

// checkTime reports a difference between a stored time and what came back: it must be the
// same instant and in UTC.
func checkTime(t *testing.T, what string, want, got time.Time) {
	t.Helper()
	if want.IsZero() {
		if !got.IsZero() {
			t.Errorf("%s = %v, want the zero time", what, got)
		}
		return
	}
	if !got.Equal(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
	if got.Location() != time.UTC {
		t.Errorf("%s is in %v, want UTC", what, got.Location())
	}
}

func checkMap(t *testing.T, what string, want, got map[string]string) {
	t.Helper()
	if !maps.Equal(want, got) { // nil and empty are equal
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// checkSandbox compares every field of got with want.
func checkSandbox(t *testing.T, want, got sandbox.Sandbox) {
	t.Helper()
	if got.ID != want.ID {
		t.Errorf("ID = %q, want %q", got.ID, want.ID)
	}
	if got.State != want.State {
		t.Errorf("%s: State = %q, want %q", want.ID, got.State, want.State)
	}
	if got.Image != want.Image || got.Runtime != want.Runtime || got.Isolation != want.Isolation {
		t.Errorf("%s: Image/Runtime/Isolation = %q/%q/%q, want %q/%q/%q", want.ID,
			got.Image, got.Runtime, got.Isolation, want.Image, want.Runtime, want.Isolation)
	}
	if got.ImageDigest != want.ImageDigest {
		t.Errorf("%s: ImageDigest = %q, want %q", want.ID, got.ImageDigest, want.ImageDigest)
	}
	if got.CPU != want.CPU {
		t.Errorf("%s: CPU = %v, want %v", want.ID, got.CPU, want.CPU)
	}
	if got.MemoryMB != want.MemoryMB || got.DiskMB != want.DiskMB || got.PidsLimit != want.PidsLimit {
		t.Errorf("%s: MemoryMB/DiskMB/PidsLimit = %d/%d/%d, want %d/%d/%d", want.ID,
			got.MemoryMB, got.DiskMB, got.PidsLimit, want.MemoryMB, want.DiskMB, want.PidsLimit)
	}
	checkMap(t, want.ID+": Env", want.Env, got.Env)
	checkMap(t, want.ID+": Labels", want.Labels, got.Labels)
	checkTime(t, want.ID+": CreatedAt", want.CreatedAt, got.CreatedAt)
	checkTime(t, want.ID+": UpdatedAt", want.UpdatedAt, got.UpdatedAt)
	checkTime(t, want.ID+": ExpiresAt", want.ExpiresAt, got.ExpiresAt)
	if got.Error != want.Error {
		t.Errorf("%s: Error = %q, want %q", want.ID, got.Error, want.Error)
	}
	if got.Version != want.Version {
		t.Errorf("%s: Version = %d, want %d", want.ID, got.Version, want.Version)
	}
}

// checkEvent compares got with want, except Seq, which the store assigns.
func checkEvent(t *testing.T, want, got sandbox.Event) {
	t.Helper()
	if got.SandboxID != want.SandboxID || got.Type != want.Type || got.From != want.From ||
		got.To != want.To || got.Reason != want.Reason {
		t.Errorf("event = {%s %s %s→%s %q}, want {%s %s %s→%s %q}",
			got.SandboxID, got.Type, got.From, got.To, got.Reason,
			want.SandboxID, want.Type, want.From, want.To, want.Reason)
	}
	if got.Seq <= 0 {
		t.Errorf("event seq = %d, want > 0", got.Seq)
	}
	checkTime(t, "event At", want.At, got.At)
}

func ids(sbs []sandbox.Sandbox) []string {
	out := make([]string, len(sbs))
	for i, sb := range sbs {
		out[i] = sb.ID
	}
	return out
}

func equalIDs(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func testCreateGetRoundTrip(t *testing.T, s store.Store) {
	sb := sandbox.Sandbox{
		ID:        sandbox.NewID(),
		State:     sandbox.StateCreating,
		Image:     "ghcr.io/agentbox/python:3.13",
		Runtime:   "gvisor",
		Isolation: "microvm",
		CPU:       1.375,
		MemoryMB:  3072,
		DiskMB:    40960,
		PidsLimit: 512,
		Env: map[string]string{
			"PATH":    "/usr/local/bin:/usr/bin",
			"QUOTED":  `say "hi" \ 'there'`,
			"UNICODE": "héllo, 世界",
			"EMPTY":   "",
			"EQ":      "a=b;c",
		},
		Labels:    map[string]string{"team": "infra", "env": "prod", "ticket": "AB-12"},
		CreatedAt: base(),
		UpdatedAt: base().Add(1500 * time.Millisecond),
		ExpiresAt: base().Add(90 * time.Minute),
		Error:     "previous attempt: image pull timed out",
		Version:   1,
	}
	ev := sandbox.Event{SandboxID: sb.ID, Type: "state", To: sandbox.StateCreating, Reason: "create requested", At: base()}
	if err := s.CreateSandbox(t.Context(), sb, ev); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	checkSandbox(t, sb, mustGet(t, s, sb.ID))

	list := mustList(t, s, sandbox.ListFilter{})
	if len(list) != 1 {
		t.Fatalf("ListSandboxes = %v, want just %s", ids(list), sb.ID)
	}
	checkSandbox(t, sb, list[0])

	evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: sb.ID})
	if len(evs) != 1 {
		t.Fatalf("ListEvents = %d events, want the 1 written by CreateSandbox", len(evs))
	}
	checkEvent(t, ev, evs[0])
}

func testCreateGetEmptyFields(t *testing.T, s store.Store) {
	sb := sandbox.Sandbox{
		ID:        sandbox.NewID(),
		State:     sandbox.StateCreating,
		Image:     "alpine",
		CreatedAt: base(),
		UpdatedAt: base(),
		Version:   1,
	} // nil maps, zero cpu/limits, zero ExpiresAt, no error
	mustCreate(t, s, sb)
	got := mustGet(t, s, sb.ID)
	checkSandbox(t, sb, got)
	if len(got.Env) != 0 || len(got.Labels) != 0 {
		t.Errorf("Env, Labels = %v, %v, want both empty", got.Env, got.Labels)
	}
}

func testTimesMillisecondPrecise(t *testing.T, s store.Store) {
	// Sub-millisecond digits may be dropped, but nothing coarser.
	at := time.Date(2025, 7, 1, 23, 59, 59, 987_654_321, zone())
	sb := newSandbox(0, sandbox.StateRunning, at, nil)
	sb.UpdatedAt = at.Add(time.Millisecond)
	sb.ExpiresAt = at.Add(2 * time.Millisecond)
	mustCreate(t, s, sb)
	got := mustGet(t, s, sb.ID)
	for _, c := range []struct {
		what      string
		want, got time.Time
	}{
		{"CreatedAt", sb.CreatedAt, got.CreatedAt},
		{"UpdatedAt", sb.UpdatedAt, got.UpdatedAt},
		{"ExpiresAt", sb.ExpiresAt, got.ExpiresAt},
	} {
		if d := c.got.Sub(c.want).Abs(); d >= time.Millisecond {
			t.Errorf("%s = %v, want within 1ms of %v (off by %v)", c.what, c.got, c.want, d)
		}
		if c.got.Location() != time.UTC {
			t.Errorf("%s is in %v, want UTC", c.what, c.got.Location())
		}
	}
	if !got.CreatedAt.Before(got.UpdatedAt) || !got.UpdatedAt.Before(got.ExpiresAt) {
		t.Errorf("times 1ms apart lost their order: %v, %v, %v", got.CreatedAt, got.UpdatedAt, got.ExpiresAt)
	}
}

func testGetUnknown(t *testing.T, s store.Store) {
	mustCreate(t, s, newSandbox(0, sandbox.StateRunning, base(), nil))
	id := sandbox.NewID()
	_, err := s.GetSandbox(t.Context(), id)
	if !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("GetSandbox(unknown) error = %v (code %q), want %s", err, errcode.Of(err), errcode.SandboxNotFound)
	}
}

func testCreateExisting(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(0, sandbox.StateCreating, base(), map[string]string{"a": "1"}))
	dup := newSandbox(1, sandbox.StateRunning, base().Add(time.Hour), map[string]string{"b": "2"})
	dup.ID = sb.ID
	err := s.CreateSandbox(t.Context(), dup, createEvent(dup))
	if !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("CreateSandbox(existing id) error = %v (code %q), want %s", err, errcode.Of(err), errcode.Conflict)
	}
	checkSandbox(t, sb, mustGet(t, s, sb.ID))
	if evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: sb.ID}); len(evs) != 1 {
		t.Errorf("events after a failed duplicate create = %d, want 1", len(evs))
	}
	if got := mustList(t, s, sandbox.ListFilter{Labels: map[string]string{"b": "2"}}); len(got) != 0 {
		t.Errorf("labels of the failed duplicate create are visible: %v", ids(got))
	}
}

func testCreateRequiresVersion1(t *testing.T, s store.Store) {
	for _, v := range []int64{0, 2} {
		sb := newSandbox(0, sandbox.StateCreating, base(), nil)
		sb.Version = v
		if err := s.CreateSandbox(t.Context(), sb, createEvent(sb)); err == nil {
			t.Errorf("CreateSandbox with version %d succeeded, want an error", v)
		}
		if _, err := s.GetSandbox(t.Context(), sb.ID); !errcode.Is(err, errcode.SandboxNotFound) {
			t.Errorf("after rejected create with version %d: GetSandbox error = %v, want %s", v, err, errcode.SandboxNotFound)
		}
	}
}

func testUpdate(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(0, sandbox.StateCreating, base(), map[string]string{"team": "a", "old": "x"}))
	upd, ev := next(sb, sandbox.StateRunning, base().Add(2*time.Second), "agent ready")
	upd.Labels = map[string]string{"team": "b", "new": "y"}
	upd.Env = map[string]string{"K": "v2"}
	upd.ExpiresAt = base().Add(3 * time.Hour)
	upd.CPU, upd.MemoryMB = 2.5, 4096
	upd.Error = "recovered"
	if err := s.UpdateSandbox(t.Context(), upd, ev); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	checkSandbox(t, upd, mustGet(t, s, sb.ID))

	evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: sb.ID})
	if len(evs) != 2 {
		t.Fatalf("ListEvents = %d events, want 2 (create, update)", len(evs))
	}
	checkEvent(t, createEvent(sb), evs[0])
	checkEvent(t, ev, evs[1])

	// The label filter follows the updated labels, not the created ones.
	for _, c := range []struct {
		labels map[string]string
		want   int
	}{
		{map[string]string{"team": "b"}, 1},
		{map[string]string{"new": "y"}, 1},
		{map[string]string{"team": "a"}, 0},
		{map[string]string{"old": "x"}, 0},
	} {
		if got := mustList(t, s, sandbox.ListFilter{Labels: c.labels}); len(got) != c.want {
			t.Errorf("ListSandboxes(labels %v) after update = %v, want %d", c.labels, ids(got), c.want)
		}
	}

	// A second update from the new version works too.
	upd2, ev2 := next(upd, sandbox.StateStopping, base().Add(3*time.Second), "destroy requested")
	if err := s.UpdateSandbox(t.Context(), upd2, ev2); err != nil {
		t.Fatalf("second UpdateSandbox: %v", err)
	}
	if got := mustGet(t, s, sb.ID); got.Version != 3 || got.State != sandbox.StateStopping {
		t.Errorf("after second update: version %d state %s, want 3 stopping", got.Version, got.State)
	}
}

func testUpdateWithoutEvent(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(0, sandbox.StateRunning, base(), nil))
	upd := sb
	upd.Version++
	upd.ExpiresAt = base().Add(24 * time.Hour)
	if err := s.UpdateSandbox(t.Context(), upd, sandbox.Event{}); err != nil {
		t.Fatalf("UpdateSandbox without event: %v", err)
	}
	checkSandbox(t, upd, mustGet(t, s, sb.ID))
	if evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: sb.ID}); len(evs) != 1 {
		t.Errorf("events = %d, want 1: an update with an empty event must not append one", len(evs))
	}
}

func testUpdateStaleVersion(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(0, sandbox.StateCreating, base(), map[string]string{"team": "a"}))
	upd, ev := next(sb, sandbox.StateRunning, base().Add(time.Second), "agent ready")
	if err := s.UpdateSandbox(t.Context(), upd, ev); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	// The store is at version 2. Each of these expects another version.
	for _, v := range []int64{2, 4, 1, 0} {
		stale, sev := next(sb, sandbox.StateFailed, base().Add(time.Minute), "stale writer")
		stale.Version = v
		stale.Labels = map[string]string{"team": "stale"}
		stale.Error = "stale"
		err := s.UpdateSandbox(t.Context(), stale, sev)
		if !errcode.Is(err, errcode.Conflict) {
			t.Errorf("UpdateSandbox with version %d over stored 2: error = %v (code %q), want %s", v, err, errcode.Of(err), errcode.Conflict)
		}
	}
	checkSandbox(t, upd, mustGet(t, s, sb.ID))
	evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: sb.ID})
	if len(evs) != 2 {
		t.Fatalf("events = %d, want 2: a conflicting update must not append its event", len(evs))
	}
	checkEvent(t, ev, evs[1])
	if got := mustList(t, s, sandbox.ListFilter{Labels: map[string]string{"team": "stale"}}); len(got) != 0 {
		t.Errorf("labels of a conflicting update are visible: %v", ids(got))
	}
}

func testUpdateUnknown(t *testing.T, s store.Store) {
	sb := newSandbox(0, sandbox.StateCreating, base(), nil)
	upd, ev := next(sb, sandbox.StateRunning, base(), "agent ready")
	err := s.UpdateSandbox(t.Context(), upd, ev)
	if !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("UpdateSandbox(unknown) error = %v (code %q), want %s", err, errcode.Of(err), errcode.SandboxNotFound)
	}
	if evs := mustEvents(t, s, sandbox.EventFilter{}); len(evs) != 0 {
		t.Errorf("events = %d, want 0", len(evs))
	}
}

func testListSandboxes(t *testing.T, s store.Store) {
	at := func(min int) time.Time { return base().Add(time.Duration(min) * time.Minute) }
	type spec struct {
		name    string
		state   sandbox.State
		created time.Time
		labels  map[string]string
	}
	// Created in an order that is neither creation time nor id order.
	specs := []spec{
		{"d", sandbox.StateFailed, at(3), map[string]string{"team": "a"}},
		{"a", sandbox.StateRunning, at(0), map[string]string{"team": "a", "env": "prod"}},
		{"f", sandbox.StateDestroyed, at(5), nil},
		{"c", sandbox.StateCreating, at(2), map[string]string{"team": "b", "env": "prod"}},
		{"b", sandbox.StateRunning, at(1), map[string]string{"team": "a", "env": "dev"}},
		{"e", sandbox.StateRunning, at(4), map[string]string{"env": "a"}},
		{"g", sandbox.StateRunning, at(4), map[string]string{"team": "a", "env": "prod", "x": "1"}},
	}
	byName := map[string]sandbox.Sandbox{}
	for i, sp := range specs {
		byName[sp.name] = mustCreate(t, s, newSandbox(i, sp.state, sp.created, sp.labels))
	}
	// e and g share created_at: id breaks the tie.
	eg := []string{"e", "g"}
	if byName["g"].ID < byName["e"].ID {
		eg = []string{"g", "e"}
	}
	order := func(names ...string) []string {
		var out []string
		for _, n := range names {
			if n == "eg" {
				for _, m := range eg {
					out = append(out, byName[m].ID)
				}
				continue
			}
			out = append(out, byName[n].ID)
		}
		return out
	}
	cases := []struct {
		name   string
		filter sandbox.ListFilter
		want   []string
	}{
		{"all", sandbox.ListFilter{}, order("a", "b", "c", "d", "eg", "f")},
		{"one state", sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning}}, order("a", "b", "eg")},
		{"two states", sandbox.ListFilter{States: []sandbox.State{sandbox.StateFailed, sandbox.StateCreating}}, order("c", "d")},
		{"state with none", sandbox.ListFilter{States: []sandbox.State{sandbox.StateLost}}, nil},
		{"one label", sandbox.ListFilter{Labels: map[string]string{"team": "a"}}, order("a", "b", "d", "g")},
		{"all labels must match", sandbox.ListFilter{Labels: map[string]string{"team": "a", "env": "prod"}}, order("a", "g")},
		{"label value of another key", sandbox.ListFilter{Labels: map[string]string{"env": "a"}}, order("e")},
		{"unknown label", sandbox.ListFilter{Labels: map[string]string{"team": "zzz"}}, nil},
		{"states and labels", sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning, sandbox.StateFailed},
			Labels: map[string]string{"team": "a"}}, order("a", "b", "d", "g")},
		{"states and labels narrow", sandbox.ListFilter{States: []sandbox.State{sandbox.StateFailed},
			Labels: map[string]string{"team": "a", "env": "prod"}}, nil},
		{"limit", sandbox.ListFilter{Limit: 2}, order("a", "b")},
		{"limit after filter", sandbox.ListFilter{Labels: map[string]string{"team": "a"}, Limit: 3}, order("a", "b", "d")},
		{"limit above count", sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning}, Limit: 50}, order("a", "b", "eg")},
	}
	for _, c := range cases {
		got := ids(mustList(t, s, c.filter))
		if !equalIDs(got, c.want) {
			t.Errorf("%s: ListSandboxes(%+v) = %v, want %v", c.name, c.filter, got, c.want)
		}
	}
}

func testListDefaultBound(t *testing.T, s store.Store) {
	const n = 1001
	created := make([]string, 0, n)
	for i := 0; i < n; i++ {
		sb := mustCreate(t, s, newSandbox(i, sandbox.StateRunning, base().Add(time.Duration(n-i)*time.Second), nil))
		created = append(created, sb.ID)
	}
	// Oldest first: the last one created has the smallest created_at.
	want := make([]string, n)
	for i, id := range created {
		want[n-1-i] = id
	}
	got := ids(mustList(t, s, sandbox.ListFilter{}))
	if len(got) != 1000 {
		t.Fatalf("ListSandboxes with no limit returned %d of %d, want the default bound 1000", len(got), n)
	}
	if !equalIDs(got, want[:1000]) {
		t.Errorf("ListSandboxes with no limit did not return the 1000 oldest, in order")
	}
	if got := mustList(t, s, sandbox.ListFilter{Limit: n}); len(got) != n {
		t.Errorf("ListSandboxes(Limit %d) returned %d", n, len(got))
	}
	evs := mustEvents(t, s, sandbox.EventFilter{})
	if len(evs) != 1000 {
		t.Fatalf("ListEvents with no limit returned %d of %d, want the default bound 1000", len(evs), n)
	}
	if evs[0].SandboxID != created[0] || evs[999].SandboxID != created[999] {
		t.Errorf("ListEvents with no limit did not return the first 1000 events")
	}
}

func testCountLive(t *testing.T, s store.Store) {
	u, err := s.CountLive(t.Context())
	if err != nil || u != (sandbox.Usage{}) {
		t.Fatalf("CountLive on an empty store = %+v, %v; want zero, nil", u, err)
	}
	type spec struct {
		state sandbox.State
		cpu   float64
		mem   int64
		disk  int64
	}
	specs := []spec{
		{sandbox.StateCreating, 0.5, 512, 100},
		{sandbox.StateRunning, 1.25, 1024, 200},
		{sandbox.StateRunning, 2, 2048, 400},
		{sandbox.StateStopping, 0.125, 256, 800},
		{sandbox.StateDestroyed, 8, 8192, 1600},
		{sandbox.StateFailed, 16, 16384, 3200},
		{sandbox.StateLost, 32, 32768, 6400},
	}
	for i, sp := range specs {
		sb := newSandbox(i, sp.state, base(), nil)
		sb.CPU, sb.MemoryMB, sb.DiskMB = sp.cpu, sp.mem, sp.disk
		mustCreate(t, s, sb)
	}
	check := func(when string, want sandbox.Usage) {
		t.Helper()
		u, err := s.CountLive(t.Context())
		if err != nil {
			t.Fatalf("CountLive %s: %v", when, err)
		}
		if u != want {
			t.Errorf("CountLive %s = %+v; want %+v", when, u, want)
		}
	}
	check("after creates", sandbox.Usage{Live: 4, CPU: 3.875, MemoryMB: 3840, DiskMB: 1500})

	// A sandbox leaving the live states stops counting.
	stopping := mustList(t, s, sandbox.ListFilter{States: []sandbox.State{sandbox.StateStopping}})
	if len(stopping) != 1 {
		t.Fatalf("stopping sandboxes = %d, want 1", len(stopping))
	}
	upd, ev := next(stopping[0], sandbox.StateDestroyed, base().Add(time.Minute), "destroyed")
	if err := s.UpdateSandbox(t.Context(), upd, ev); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	check("after one was destroyed", sandbox.Usage{Live: 3, CPU: 3.75, MemoryMB: 3584, DiskMB: 700})
}

func testListEvents(t *testing.T, s store.Store) {
	a := mustCreate(t, s, newSandbox(0, sandbox.StateCreating, base(), nil))
	b := mustCreate(t, s, newSandbox(1, sandbox.StateCreating, base(), nil))
	wantA := []sandbox.Event{createEvent(a)}
	wantB := []sandbox.Event{createEvent(b)}
	// Interleave the two sandboxes' transitions.
	for i, to := range []sandbox.State{sandbox.StateRunning, sandbox.StateStopping, sandbox.StateDestroyed} {
		at := base().Add(time.Duration(i+1) * time.Second)
		var ev sandbox.Event
		a, ev = next(a, to, at, fmt.Sprintf("a step %d", i))
		if err := s.UpdateSandbox(t.Context(), a, ev); err != nil {
			t.Fatalf("UpdateSandbox(a): %v", err)
		}
		wantA = append(wantA, ev)
		if i < 2 {
			b, ev = next(b, to, at, fmt.Sprintf("b step %d", i))
			if err := s.UpdateSandbox(t.Context(), b, ev); err != nil {
				t.Fatalf("UpdateSandbox(b): %v", err)
			}
			wantB = append(wantB, ev)
		}
	}

	all := mustEvents(t, s, sandbox.EventFilter{})
	if len(all) != len(wantA)+len(wantB) {
		t.Fatalf("ListEvents(all) = %d events, want %d", len(all), len(wantA)+len(wantB))
	}
	for i := 1; i < len(all); i++ {
		if all[i].Seq <= all[i-1].Seq {
			t.Fatalf("seq not strictly increasing: %d then %d", all[i-1].Seq, all[i].Seq)
		}
	}

	for _, c := range []struct {
		sb   sandbox.Sandbox
		want []sandbox.Event
	}{{a, wantA}, {b, wantB}} {
		got := mustEvents(t, s, sandbox.EventFilter{SandboxID: c.sb.ID})
		if len(got) != len(c.want) {
			t.Fatalf("ListEvents(%s) = %d events, want %d", c.sb.ID, len(got), len(c.want))
		}
		for i := range got {
			checkEvent(t, c.want[i], got[i])
			if i > 0 && got[i].Seq <= got[i-1].Seq {
				t.Errorf("ListEvents(%s): seq %d after %d", c.sb.ID, got[i].Seq, got[i-1].Seq)
			}
		}
	}
	if got := mustEvents(t, s, sandbox.EventFilter{SandboxID: sandbox.NewID()}); len(got) != 0 {
		t.Errorf("ListEvents(unknown sandbox) = %d events, want 0", len(got))
	}

	// Paging by AfterSeq, two at a time, yields exactly the full list.
	for _, sandboxID := range []string{"", a.ID} {
		full := mustEvents(t, s, sandbox.EventFilter{SandboxID: sandboxID})
		var paged []sandbox.Event
		after := int64(0)
		for pages := 0; ; pages++ {
			if pages > len(full) {
				t.Fatalf("paging %q did not end", sandboxID)
			}
			page := mustEvents(t, s, sandbox.EventFilter{SandboxID: sandboxID, AfterSeq: after, Limit: 2})
			if len(page) > 2 {
				t.Fatalf("page of limit 2 has %d events", len(page))
			}
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			after = page[len(page)-1].Seq
		}
		if len(paged) != len(full) {
			t.Fatalf("paging %q yielded %d events, want %d", sandboxID, len(paged), len(full))
		}
		for i := range full {
			if paged[i].Seq != full[i].Seq || paged[i].SandboxID != full[i].SandboxID {
				t.Errorf("paging %q: event %d is seq %d, want %d", sandboxID, i, paged[i].Seq, full[i].Seq)
			}
		}
	}
	last := all[len(all)-1].Seq
	if got := mustEvents(t, s, sandbox.EventFilter{AfterSeq: last}); len(got) != 0 {
		t.Errorf("ListEvents(AfterSeq=last) = %d events, want 0", len(got))
	}
	if got := mustEvents(t, s, sandbox.EventFilter{AfterSeq: all[2].Seq}); len(got) != len(all)-3 || got[0].Seq != all[3].Seq {
		t.Errorf("ListEvents(AfterSeq=%d) did not start right after it", all[2].Seq)
	}
}

func testPrune(t *testing.T, s store.Store) {
	cutoff := base().Add(24 * time.Hour)
	type spec struct {
		name    string
		state   sandbox.State
		updated time.Time
		pruned  bool
	}
	specs := []spec{
		{"destroyed long ago", sandbox.StateDestroyed, cutoff.Add(-time.Hour), true},
		{"failed just before", sandbox.StateFailed, cutoff.Add(-time.Millisecond), true},
		{"lost long ago", sandbox.StateLost, cutoff.Add(-48 * time.Hour), true},
		{"destroyed at cutoff", sandbox.StateDestroyed, cutoff, false},
		{"destroyed after", sandbox.StateDestroyed, cutoff.Add(time.Hour), false},
		{"running long ago", sandbox.StateRunning, cutoff.Add(-5 * time.Hour), false},
		{"creating long ago", sandbox.StateCreating, cutoff.Add(-5 * time.Hour), false},
		{"stopping long ago", sandbox.StateStopping, cutoff.Add(-5 * time.Hour), false},
	}
	sbs := make([]sandbox.Sandbox, len(specs))
	wantPruned := 0
	for i, sp := range specs {
		sb := newSandbox(i, sp.state, cutoff.Add(-72*time.Hour), map[string]string{"k": "v"})
		sb.UpdatedAt = sp.updated
		sbs[i] = mustCreate(t, s, sb)
		if sp.pruned {
			wantPruned++
		}
	}
	n, err := s.PruneSandboxes(t.Context(), cutoff)
	if err != nil {
		t.Fatalf("PruneSandboxes: %v", err)
	}
	if n != wantPruned {
		t.Errorf("PruneSandboxes = %d, want %d", n, wantPruned)
	}
	for i, sp := range specs {
		_, err := s.GetSandbox(t.Context(), sbs[i].ID)
		evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: sbs[i].ID})
		if sp.pruned {
			if !errcode.Is(err, errcode.SandboxNotFound) {
				t.Errorf("%s: GetSandbox after prune error = %v, want %s", sp.name, err, errcode.SandboxNotFound)
			}
			if len(evs) != 0 {
				t.Errorf("%s: %d events left after prune, want 0", sp.name, len(evs))
			}
		} else {
			if err != nil {
				t.Errorf("%s: pruned, but should be kept: %v", sp.name, err)
			}
			if len(evs) != 1 {
				t.Errorf("%s: %d events, want its 1 kept", sp.name, len(evs))
			}
		}
	}
	if got := mustList(t, s, sandbox.ListFilter{Labels: map[string]string{"k": "v"}}); len(got) != len(specs)-wantPruned {
		t.Errorf("label-filtered list after prune = %d sandboxes, want %d", len(got), len(specs)-wantPruned)
	}
	if evs := mustEvents(t, s, sandbox.EventFilter{}); len(evs) != len(specs)-wantPruned {
		t.Errorf("events after prune = %d, want %d", len(evs), len(specs)-wantPruned)
	}
	if n, err := s.PruneSandboxes(t.Context(), cutoff); err != nil || n != 0 {
		t.Errorf("second PruneSandboxes = %d, %v; want 0, nil", n, err)
	}
}

func testSeqNotReusedAfterPrune(t *testing.T, s store.Store) {
	mustCreate(t, s, newSandbox(0, sandbox.StateRunning, base(), nil))
	old := newSandbox(1, sandbox.StateDestroyed, base(), nil)
	mustCreate(t, s, old)
	evs := mustEvents(t, s, sandbox.EventFilter{})
	maxSeq := evs[len(evs)-1].Seq
	if evs[len(evs)-1].SandboxID != old.ID {
		t.Fatalf("newest event is not the pruned sandbox's")
	}
	if n, err := s.PruneSandboxes(t.Context(), base().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("PruneSandboxes = %d, %v; want 1, nil", n, err)
	}
	fresh := mustCreate(t, s, newSandbox(2, sandbox.StateCreating, base(), nil))
	got := mustEvents(t, s, sandbox.EventFilter{SandboxID: fresh.ID})
	if len(got) != 1 || got[0].Seq <= maxSeq {
		t.Fatalf("event after prune = %+v, want one with seq > %d (a reader that saw seq %d must not miss it)", got, maxSeq, maxSeq)
	}
	if got := mustEvents(t, s, sandbox.EventFilter{AfterSeq: maxSeq}); len(got) != 1 || got[0].SandboxID != fresh.ID {
		t.Errorf("ListEvents(AfterSeq=%d) after prune = %+v, want the new event", maxSeq, got)
	}
}

func testConcurrentUpdateOneWins(t *testing.T, s store.Store) {
	const writers = 8
	sb := mustCreate(t, s, newSandbox(0, sandbox.StateCreating, base(), nil))
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, writers)
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			upd, ev := next(sb, sandbox.StateRunning, base().Add(time.Duration(i+1)*time.Second), fmt.Sprintf("writer %d", i))
			upd.Error = fmt.Sprintf("writer %d", i)
			<-start
			errs[i] = s.UpdateSandbox(context.Background(), upd, ev)
		}()
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Errorf("writers %d and %d both won", winner, i)
			}
			winner = i
		case !errcode.Is(err, errcode.Conflict):
			t.Errorf("writer %d: error = %v (code %q), want nil or %s", i, err, errcode.Of(err), errcode.Conflict)
		}
	}
	if winner < 0 {
		t.Fatalf("no writer won: %v", errs)
	}
	got := mustGet(t, s, sb.ID)
	if got.Version != 2 || got.Error != fmt.Sprintf("writer %d", winner) {
		t.Errorf("stored version %d error %q, want version 2 written by writer %d", got.Version, got.Error, winner)
	}
	evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: sb.ID})
	if len(evs) != 2 {
		t.Fatalf("events = %d, want 2 (create and the winner's)", len(evs))
	}
	if want := fmt.Sprintf("writer %d", winner); evs[1].Reason != want {
		t.Errorf("second event reason %q, want %q", evs[1].Reason, want)
	}
}

func testConcurrentWritersAndReaders(t *testing.T, s store.Store) {
	const writers, perWriter, readers = 8, 15, 4
	ctx := t.Context()
	var wg sync.WaitGroup
	errc := make(chan error, writers*perWriter+readers)
	done := make(chan struct{})
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				sb := newSandbox(w*perWriter+i, sandbox.StateCreating, base().Add(time.Duration(i)*time.Second), map[string]string{"w": fmt.Sprint(w)})
				if err := s.CreateSandbox(ctx, sb, createEvent(sb)); err != nil {
					errc <- fmt.Errorf("writer %d create: %w", w, err)
					return
				}
				upd, ev := next(sb, sandbox.StateRunning, sb.CreatedAt.Add(time.Second), "agent ready")
				if err := s.UpdateSandbox(ctx, upd, ev); err != nil {
					errc <- fmt.Errorf("writer %d update: %w", w, err)
					return
				}
			}
		}()
	}
	var rwg sync.WaitGroup
	for r := 0; r < readers; r++ {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, err := s.ListSandboxes(ctx, sandbox.ListFilter{Labels: map[string]string{"w": fmt.Sprint(r)}}); err != nil {
					errc <- fmt.Errorf("reader %d list: %w", r, err)
					return
				}
				if _, err := s.CountLive(ctx); err != nil {
					errc <- fmt.Errorf("reader %d count: %w", r, err)
					return
				}
				if _, err := s.ListEvents(ctx, sandbox.EventFilter{Limit: 10}); err != nil {
					errc <- fmt.Errorf("reader %d events: %w", r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	rwg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	u, err := s.CountLive(ctx)
	if err != nil || u.Live != writers*perWriter {
		t.Errorf("CountLive = %+v, %v; want %d live, nil", u, err, writers*perWriter)
	}
	evs := mustEvents(t, s, sandbox.EventFilter{Limit: 10 * writers * perWriter})
	if len(evs) != 2*writers*perWriter {
		t.Errorf("events = %d, want %d", len(evs), 2*writers*perWriter)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq <= evs[i-1].Seq {
			t.Fatalf("seq not strictly increasing: %d then %d", evs[i-1].Seq, evs[i].Seq)
		}
	}
}

func idRange(sb sandbox.Sandbox, first, count int64) sandbox.IDRange {
	return sandbox.IDRange{SandboxID: sb.ID, Base: first, Count: count, AllocatedAt: time.Date(2025, 3, 14, 15, 9, 26, 535_000_000, zone())}
}

func mustRanges(t *testing.T, s store.Store) []sandbox.IDRange {
	t.Helper()
	rs, err := s.ListIDRanges(t.Context())
	if err != nil {
		t.Fatalf("ListIDRanges: %v", err)
	}
	return rs
}

func rangeKeys(rs []sandbox.IDRange) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = fmt.Sprintf("%s@%d+%d", r.SandboxID, r.Base, r.Count)
	}
	return out
}

func testIDRangeAllocateListRelease(t *testing.T, s store.Store) {
	ctx := t.Context()
	if rs := mustRanges(t, s); len(rs) != 0 {
		t.Fatalf("ListIDRanges on an empty store = %v", rangeKeys(rs))
	}
	a := mustCreate(t, s, newSandbox(0, sandbox.StateCreating, base(), nil))
	b := mustCreate(t, s, newSandbox(1, sandbox.StateCreating, base(), nil))
	c := mustCreate(t, s, newSandbox(2, sandbox.StateCreating, base(), nil))
	// Allocated out of base order; listed by base.
	want := []sandbox.IDRange{idRange(b, 200000, 65536), idRange(c, 265536, 65536), idRange(a, sandbox.MaxHostID-65536, 65536)}
	for _, r := range []sandbox.IDRange{want[2], want[0], want[1]} {
		if err := s.AllocateIDRange(ctx, r); err != nil {
			t.Fatalf("AllocateIDRange(%+v): %v", r, err)
		}
	}
	got := mustRanges(t, s)
	if len(got) != len(want) {
		t.Fatalf("ListIDRanges = %v, want %v", rangeKeys(got), rangeKeys(want))
	}
	for i := range want {
		if got[i].SandboxID != want[i].SandboxID || got[i].Base != want[i].Base || got[i].Count != want[i].Count {
			t.Errorf("range %d = %+v, want %+v", i, got[i], want[i])
		}
		checkTime(t, "AllocatedAt", want[i].AllocatedAt, got[i].AllocatedAt)
	}

	if err := s.ReleaseIDRange(ctx, b.ID); err != nil {
		t.Fatalf("ReleaseIDRange: %v", err)
	}
	if got := rangeKeys(mustRanges(t, s)); len(got) != 2 || got[0] != rangeKeys(want[1:2])[0] {
		t.Fatalf("after release: %v", got)
	}
	// Releasing what is not held is fine: a release may be retried.
	for _, id := range []string{b.ID, sandbox.NewID()} {
		if err := s.ReleaseIDRange(ctx, id); err != nil {
			t.Errorf("ReleaseIDRange(%s) of nothing held: %v", id, err)
		}
	}
	// A freed range can be allocated again, to another sandbox or the same one.
	d := mustCreate(t, s, newSandbox(3, sandbox.StateCreating, base(), nil))
	if err := s.AllocateIDRange(ctx, idRange(d, 200000, 65536)); err != nil {
		t.Fatalf("reallocating a freed range: %v", err)
	}
	if err := s.AllocateIDRange(ctx, idRange(b, 331072, 65536)); err != nil {
		t.Fatalf("a sandbox that released its range allocating another: %v", err)
	}
	if got := mustRanges(t, s); len(got) != 4 || got[0].SandboxID != d.ID {
		t.Fatalf("after reallocation: %v", rangeKeys(got))
	}
	// Records are independent of ranges: updating a sandbox keeps its range.
	upd, ev := next(a, sandbox.StateRunning, base().Add(time.Second), "agent ready")
	if err := s.UpdateSandbox(ctx, upd, ev); err != nil {
		t.Fatal(err)
	}
	if got := mustRanges(t, s); len(got) != 4 {
		t.Fatalf("an update changed the ranges: %v", rangeKeys(got))
	}
}

func testIDRangeConflicts(t *testing.T, s store.Store) {
	ctx := t.Context()
	holder := mustCreate(t, s, newSandbox(0, sandbox.StateRunning, base(), nil))
	other := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	held := idRange(holder, 1000000, 65536)
	if err := s.AllocateIDRange(ctx, held); err != nil {
		t.Fatal(err)
	}
	conflicts := []struct {
		name string
		r    sandbox.IDRange
	}{
		{"same range, other sandbox", idRange(other, 1000000, 65536)},
		{"overlaps the start", idRange(other, 1000000-10, 11)},
		{"overlaps the end", idRange(other, 1000000+65535, 65536)},
		{"inside", idRange(other, 1000000+1000, 1)},
		{"contains", idRange(other, 0, 1<<31)},
		{"second range of one sandbox", idRange(holder, 5000000, 65536)},
	}
	for _, c := range conflicts {
		if err := s.AllocateIDRange(ctx, c.r); !errcode.Is(err, errcode.Conflict) {
			t.Errorf("%s: AllocateIDRange(%+v) = %v (code %q), want %s", c.name, c.r, err, errcode.Of(err), errcode.Conflict)
		}
	}
	invalid := []sandbox.IDRange{
		idRange(other, 3000000, 0),
		idRange(other, 3000000, -1),
		idRange(other, -65536, 65536),
		idRange(other, sandbox.MaxHostID-10, 11),
		{Base: 3000000, Count: 1},
	}
	for _, r := range invalid {
		if err := s.AllocateIDRange(ctx, r); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("AllocateIDRange(%+v) = %v (code %q), want %s", r, err, errcode.Of(err), errcode.InvalidArgument)
		}
	}
	unknown := sandbox.IDRange{SandboxID: sandbox.NewID(), Base: 3000000, Count: 65536}
	if err := s.AllocateIDRange(ctx, unknown); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("AllocateIDRange for an unknown sandbox = %v (code %q), want %s", err, errcode.Of(err), errcode.SandboxNotFound)
	}
	if got := mustRanges(t, s); len(got) != 1 || got[0].SandboxID != holder.ID || got[0].Base != held.Base {
		t.Fatalf("refused allocations changed the ranges: %v", rangeKeys(got))
	}
	// Adjacent ranges share no id.
	for _, r := range []sandbox.IDRange{idRange(other, 1000000+65536, 65536)} {
		if err := s.AllocateIDRange(ctx, r); err != nil {
			t.Errorf("adjacent AllocateIDRange(%+v): %v", r, err)
		}
	}
	third := mustCreate(t, s, newSandbox(2, sandbox.StateRunning, base(), nil))
	if err := s.AllocateIDRange(ctx, idRange(third, 1000000-65536, 65536)); err != nil {
		t.Errorf("range ending where another starts: %v", err)
	}
}

func testIDRangeConcurrentAllocate(t *testing.T, s store.Store) {
	const n = 8
	sbs := make([]sandbox.Sandbox, n)
	for i := range sbs {
		sbs[i] = mustCreate(t, s, newSandbox(i, sandbox.StateCreating, base(), nil))
	}
	// Everybody races for overlapping ranges: exactly one wins.
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = s.AllocateIDRange(context.Background(), idRange(sbs[i], 200000+int64(i)*1000, 65536))
		}()
	}
	close(start)
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errcode.Is(err, errcode.Conflict):
			t.Errorf("sandbox %d: %v (code %q), want nil or %s", i, err, errcode.Of(err), errcode.Conflict)
		}
	}
	if won != 1 {
		t.Fatalf("%d overlapping allocations succeeded, want exactly 1", won)
	}
	// Disjoint ranges all succeed, concurrently.
	for _, sb := range sbs {
		if err := s.ReleaseIDRange(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.AllocateIDRange(context.Background(), idRange(sbs[i], 200000+int64(i)*65536, 65536))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("disjoint allocation %d: %v", i, err)
		}
	}
	rs := mustRanges(t, s)
	if len(rs) != n {
		t.Fatalf("ranges = %v, want %d", rangeKeys(rs), n)
	}
	for i := 1; i < len(rs); i++ {
		if rs[i-1].Overlaps(rs[i]) || rs[i-1].Base >= rs[i].Base {
			t.Errorf("ranges %v and %v overlap or are out of order", rs[i-1], rs[i])
		}
	}
}

func testIDRangePrune(t *testing.T, s store.Store) {
	ctx := t.Context()
	cutoff := base().Add(24 * time.Hour)
	old := newSandbox(0, sandbox.StateLost, cutoff.Add(-48*time.Hour), nil)
	old.UpdatedAt = cutoff.Add(-time.Hour)
	mustCreate(t, s, old)
	live := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, cutoff.Add(-48*time.Hour), nil))
	if err := s.AllocateIDRange(ctx, idRange(old, 200000, 65536)); err != nil {
		t.Fatal(err)
	}
	if err := s.AllocateIDRange(ctx, idRange(live, 265536, 65536)); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneSandboxes(ctx, cutoff); err != nil || n != 1 {
		t.Fatalf("PruneSandboxes = %d, %v; want 1, nil", n, err)
	}
	rs := mustRanges(t, s)
	if len(rs) != 1 || rs[0].SandboxID != live.ID {
		t.Fatalf("ranges after prune = %v, want only the live sandbox's", rangeKeys(rs))
	}
}

func testOwnerNodeHandleRoundTrip(t *testing.T, s store.Store) {
	sb := newSandbox(0, sandbox.StateCreating, base(), nil)
	sb.Owner, sb.IdempotencyKey, sb.Node = "token:abc", "key-1", "node-a"
	mustCreate(t, s, sb)
	got := mustGet(t, s, sb.ID)
	if got.Owner != sb.Owner || got.IdempotencyKey != sb.IdempotencyKey || got.Node != sb.Node || got.Handle != "" {
		t.Fatalf("owner/key/node/handle = %q/%q/%q/%q, want %q/%q/%q/\"\"", got.Owner, got.IdempotencyKey, got.Node, got.Handle, sb.Owner, sb.IdempotencyKey, sb.Node)
	}
	upd, ev := next(got, sandbox.StateRunning, base().Add(time.Second), "agent ready")
	upd.Handle = "pid=42"
	if err := s.UpdateSandbox(t.Context(), upd, ev); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, sb.ID); got.Handle != "pid=42" || got.Node != "node-a" {
		t.Fatalf("after update: handle %q node %q, want pid=42 node-a", got.Handle, got.Node)
	}
}

func admitEvent(sb sandbox.Sandbox) sandbox.Event {
	return sandbox.Event{SandboxID: sb.ID, Type: "state", To: sb.State, Reason: "create requested", At: sb.CreatedAt}
}

func testAdmitBounds(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := sandbox.Admission{MaxLive: 3, CPU: 2, MemoryMB: 2048, DiskMB: 1 << 20}
	mk := func(n int, node string, cpu float64, mem int64) sandbox.Sandbox {
		sb := newSandbox(n, sandbox.StateCreating, base(), nil)
		sb.Node, sb.CPU, sb.MemoryMB, sb.DiskMB = node, cpu, mem, 10
		return sb
	}
	for i, sb := range []sandbox.Sandbox{mk(0, "a", 1, 512), mk(1, "a", 0.5, 512)} {
		if _, created, err := s.AdmitSandbox(ctx, sb, admitEvent(sb), a); err != nil || !created {
			t.Fatalf("admit %d: created=%v err=%v", i, created, err)
		}
	}
	cases := []struct {
		sb   sandbox.Sandbox
		want string
	}{
		{mk(2, "a", 1, 100), "cpu"},          // 1.5 + 1 > 2
		{mk(3, "a", 0.5, 1500), "memory_mb"}, // 1024 + 1500 > 2048
	}
	for _, c := range cases {
		_, created, err := s.AdmitSandbox(ctx, c.sb, admitEvent(c.sb), a)
		var over *sandbox.OverCapacityError
		if !errors.As(err, &over) || over.Resource != c.want || created {
			t.Fatalf("admit over %s: created=%v err=%v, want an OverCapacityError on %s", c.want, created, err, c.want)
		}
		if _, err := s.GetSandbox(ctx, c.sb.ID); errcode.Of(err) != errcode.SandboxNotFound {
			t.Fatalf("a refused admission wrote %s: %v", c.sb.ID, err)
		}
	}
	// Another node's sandboxes do not count.
	onB := mk(4, "b", 2, 2048)
	if _, created, err := s.AdmitSandbox(ctx, onB, admitEvent(onB), a); err != nil || !created {
		t.Fatalf("admit on node b: created=%v err=%v", created, err)
	}
	third := mk(5, "a", 0.5, 512)
	if _, _, err := s.AdmitSandbox(ctx, third, admitEvent(third), a); err != nil {
		t.Fatal(err)
	}
	fourth := mk(6, "a", 0, 16)
	var over *sandbox.OverCapacityError
	if _, _, err := s.AdmitSandbox(ctx, fourth, admitEvent(fourth), a); !errors.As(err, &over) || over.Resource != "sandboxes" {
		t.Fatalf("fourth live sandbox on a: %v, want OverCapacityError on sandboxes", err)
	}
	// A sandbox that is no longer live frees its share.
	got := mustGet(t, s, third.ID)
	upd, ev := next(got, sandbox.StateFailed, base().Add(time.Second), "create failed")
	if err := s.UpdateSandbox(ctx, upd, ev); err != nil {
		t.Fatal(err)
	}
	if _, created, err := s.AdmitSandbox(ctx, fourth, admitEvent(fourth), a); err != nil || !created {
		t.Fatalf("admit after one failed: created=%v err=%v", created, err)
	}
}

func testAdmitIdempotencyKey(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := newSandbox(0, sandbox.StateCreating, base(), nil)
	first.Owner, first.IdempotencyKey, first.Node = "alice", "k1", "local"
	if _, created, err := s.AdmitSandbox(ctx, first, admitEvent(first), sandbox.Admission{}); err != nil || !created {
		t.Fatalf("first admit: created=%v err=%v", created, err)
	}
	retry := newSandbox(1, sandbox.StateCreating, base(), nil)
	retry.Owner, retry.IdempotencyKey, retry.Node = "alice", "k1", "local"
	got, created, err := s.AdmitSandbox(ctx, retry, admitEvent(retry), sandbox.Admission{MaxLive: 1})
	if err != nil || created || got.ID != first.ID {
		t.Fatalf("retry with the same key: got %s created=%v err=%v, want %s, not created (even past the live bound)", got.ID, created, err, first.ID)
	}
	if _, err := s.GetSandbox(ctx, retry.ID); errcode.Of(err) != errcode.SandboxNotFound {
		t.Fatalf("the retry wrote a second record: %v", err)
	}
	other := newSandbox(2, sandbox.StateCreating, base(), nil)
	other.Owner, other.IdempotencyKey, other.Node = "bob", "k1", "local"
	if got, created, err := s.AdmitSandbox(ctx, other, admitEvent(other), sandbox.Admission{}); err != nil || !created || got.ID != other.ID {
		t.Fatalf("another owner's same key: got %s created=%v err=%v, want a new sandbox", got.ID, created, err)
	}
	dup := newSandbox(3, sandbox.StateCreating, base(), nil)
	dup.Owner, dup.IdempotencyKey = "alice", "k1"
	if err := s.CreateSandbox(ctx, dup, admitEvent(dup)); errcode.Of(err) != errcode.Conflict {
		t.Fatalf("CreateSandbox with a used key: %v, want CONFLICT", err)
	}
}

func testAdmitConcurrentNeverOvershoots(t *testing.T, s store.Store) {
	const workers, bound = 16, 5
	ctx := t.Context()
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := newSandbox(w, sandbox.StateCreating, base(), nil)
			sb.Node = "n"
			_, created, err := s.AdmitSandbox(ctx, sb, admitEvent(sb), sandbox.Admission{MaxLive: bound})
			var over *sandbox.OverCapacityError
			if err != nil && !errors.As(err, &over) {
				t.Errorf("admit %d: %v", w, err)
			}
			if created {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	u, err := s.CountLive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if admitted != bound || u.Live != bound {
		t.Fatalf("admitted %d, live %d; want exactly %d", admitted, u.Live, bound)
	}
}

// testConcurrentAppendsPagingReader: while writers append events, a reader paging with AfterSeq
// (as Service.Subscribe does) sees every event exactly once and in order. A driver whose
// sequence numbers can become visible out of order (a later seq committed before an earlier
// one) fails it.
func testConcurrentAppendsPagingReader(t *testing.T, s store.Store) {
	const writers, perWriter = 6, 20
	ctx := t.Context()
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				sb := newSandbox(w*perWriter+i, sandbox.StateCreating, base(), nil)
				if err := s.CreateSandbox(ctx, sb, createEvent(sb)); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	seen := map[int64]bool{}
	var cursor int64
	finished := false
	for !finished {
		select {
		case <-done:
			finished = true // one more page after the writers stop
		default:
		}
		evs, err := s.ListEvents(ctx, sandbox.EventFilter{AfterSeq: cursor, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Seq <= cursor || seen[ev.Seq] {
				t.Fatalf("event %d seen after cursor %d (out of order or twice)", ev.Seq, cursor)
			}
			seen[ev.Seq] = true
			cursor = ev.Seq
		}
		if finished && len(evs) == 7 {
			finished = false // more pages remain
		}
	}
	if len(seen) != writers*perWriter {
		t.Fatalf("paging reader saw %d events, want %d", len(seen), writers*perWriter)
	}
	all := mustEvents(t, s, sandbox.EventFilter{Limit: 1000})
	for _, ev := range all {
		if !seen[ev.Seq] {
			t.Fatalf("paging reader missed event %d", ev.Seq)
		}
	}
}
