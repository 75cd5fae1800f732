package storetest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// runTests are the cases of the durable runs and batches (runs.Store); Run runs them with the
// rest.
var runTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"RunRoundTrip", testRunRoundTrip},
	{"RunTimesUTCMillis", testRunTimesUTCMillis},
	{"RunUnknown", testRunUnknown},
	{"RunCreateChecks", testRunCreateChecks},
	{"RunIdempotency", testRunIdempotency},
	{"RunIdempotencyConcurrent", testRunIdempotencyConcurrent},
	{"RunUpdateVersionAndEvents", testRunUpdateVersionAndEvents},
	{"RunEventsPaging", testRunEventsPaging},
	{"RunListFilters", testRunListFilters},
	{"RunListPagingAndBounds", testRunListPagingAndBounds},
	{"RunUnsettledOldestFirst", testRunUnsettledOldestFirst},
	{"RunQueuedOldestFirstBounded", testRunQueuedOldestFirstBounded},
	{"RunClaim", testRunClaim},
	{"RunClaimBoundConcurrent", testRunClaimBoundConcurrent},
	{"BatchCreateAndIdempotency", testBatchCreateAndIdempotency},
	{"BatchCreateAtomic", testBatchCreateAtomic},
	{"BatchIdempotencyConcurrent", testBatchIdempotencyConcurrent},
	{"BatchUpdateAndList", testBatchUpdateAndList},
	{"BatchCounts", testBatchCounts},
	{"RunPrune", testRunPrune},
}

func newRunID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "run_" + hex.EncodeToString(b)
}

func newBatchID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "bat_" + hex.EncodeToString(b)
}

// utcBase is base() in UTC: what a store reads back.
func utcBase() time.Time { return base().UTC() }

func tp(t time.Time) *time.Time { return &t }
func ip(n int) *int             { return &n }
func i64p(n int64) *int64       { return &n }

// newRun returns a queued version-1 run of owner created at created, with a spec that fills
// every field of a Spec.
func newRun(owner string, created time.Time) runs.Run {
	return runs.Run{
		ID:    newRunID(),
		Owner: owner,
		State: runs.Queued,
		Spec: runs.Spec{
			RepoURL: "https://git.example/acme/app.git", Ref: "v1.2", RepoSecret: "GH", Dir: "/workspace/app",
			Files: map[string]string{"a/b.txt": "hello\n", "c.sh": "#!/bin/sh\necho ü\n"},
			Agent: &runs.AgentCheckout{RepoURL: "https://git.example/acme/agent.git", Ref: "main", Dir: "/workspace/agent",
				BuildCommand: []string{"sh", "-c", "make"}, RepoSecret: "GH"},
			Setup: []string{"npm", "ci"}, Command: []string{"npm", "test", "--", "--grep", "a b"},
			ValidationCommands: [][]string{{"true"}, {"sh", "-c", "exit 0"}},
			Stdin:              "task text\n", Artifacts: []string{"out/**", "*.log"},
			Env:     map[string]string{"MODE": "ci", "EMPTY": ""},
			Secrets: map[string]sandbox.SecretSpec{"GH": {From: "env:GH_TOKEN", Hosts: []string{"git.example"}, Body: true}},
			Image:   "node:22", Runtime: "runsc", CPU: 1.5, MemoryMB: 2048, DiskMB: 4096,
			Network:        &sandbox.Network{Policy: &egress.Policy{Allow: []string{"git.example:443"}, Deny: []string{}}},
			Requirements:   sandbox.Requirements{Isolation: "kernel", Network: "egress"},
			TimeoutSeconds: 600, PhaseTimeouts: map[string]int64{"setup": 120, "command": 300},
			Retention: runs.RetentionKeep, KeepTTLSeconds: 900,
			Labels: map[string]string{"team": "core"},
		},
		Phases:       []runs.Phase{},
		ChangedFiles: []runs.ChangedFile{},
		Artifacts:    []runs.Artifact{},
		CreatedAt:    created,
		UpdatedAt:    created,
		Version:      1,
	}
}

func queuedEvent(r runs.Run) runs.Event {
	return runs.Event{RunID: r.ID, Time: r.CreatedAt, To: runs.Queued, Reason: "run requested"}
}

func mustCreateRun(t *testing.T, s store.Store, r runs.Run) runs.Run {
	t.Helper()
	got, created, err := s.CreateRun(t.Context(), r, queuedEvent(r))
	if err != nil || !created {
		t.Fatalf("CreateRun(%s) = created %v, %v; want created", r.ID, created, err)
	}
	return got
}

func mustGetRun(t *testing.T, s store.Store, id string) runs.Run {
	t.Helper()
	r, err := s.GetRun(t.Context(), id)
	if err != nil {
		t.Fatalf("GetRun(%s): %v", id, err)
	}
	return r
}

// checkRunEqual compares every field: the JSON of the record (which tells nil from empty and
// every time to the millisecond and zone), and the fields the JSON leaves out.
func checkRunEqual(t *testing.T, want, got runs.Run) {
	t.Helper()
	wj, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	gj, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(wj, gj) {
		t.Errorf("run read back differs:\n got %s\nwant %s", gj, wj)
	}
	if got.Owner != want.Owner || got.Version != want.Version {
		t.Errorf("run owner, version = %q, %d; want %q, %d", got.Owner, got.Version, want.Owner, want.Version)
	}
}

func runIDs(rs []runs.Run) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func mustRunEvents(t *testing.T, s store.Store, id string) []runs.Event {
	t.Helper()
	evs, err := s.RunEvents(t.Context(), id, 0, runs.MaxEventsPage)
	if err != nil {
		t.Fatalf("RunEvents(%s): %v", id, err)
	}
	return evs
}

func testRunRoundTrip(t *testing.T, s store.Store) {
	at := utcBase()
	r := newRun("alice", at)
	got := mustCreateRun(t, s, r)
	checkRunEqual(t, r, got)
	checkRunEqual(t, r, mustGetRun(t, s, r.ID))

	// A settled run with every field set, nil pointers where a phase has no value.
	r.State, r.Reason, r.Commit, r.AgentCommit = runs.Failed, "validation[1] exited 3", "0123abcd", "fedc9876"
	r.BatchID = "" // stays outside a batch
	r.Phases = []runs.Phase{
		{Name: runs.PhaseSandbox, State: runs.PhaseSucceeded, StartedAt: tp(at), FinishedAt: tp(at.Add(time.Second)), DurationMs: i64p(1000)},
		{Name: runs.PhaseCommand, State: runs.PhaseSucceeded, Argv: []string{"npm", "test"}, JobID: "job_1", ExitCode: ip(0),
			Stdout: "ok\n", Stderr: "warn ü\n", StdoutBytes: 3, StderrBytes: 8, Truncated: true,
			StartedAt: tp(at.Add(2 * time.Second)), FinishedAt: tp(at.Add(3 * time.Second)), DurationMs: i64p(1000)},
		{Name: "validation[1]", State: runs.PhaseFailed, Argv: []string{"sh", "-c", "exit 3"}, ExitCode: ip(3), Signal: "",
			StartedAt: tp(at.Add(4 * time.Second)), Error: "exited 3"},
		{Name: runs.PhaseCollect, State: runs.PhasePending},
		{Name: runs.PhaseCleanup, State: runs.PhaseInterrupted, Signal: "SIGKILL", Error: "server restarted"},
	}
	r.ChangedFiles = []runs.ChangedFile{{Path: "a.go", Status: "modified"}, {Path: "b.go", Status: "renamed", From: "old.go"}}
	r.DiffStat, r.Diff, r.DiffTruncated = " a.go | 2 +-\n", "diff --git a/a.go b/a.go\n", true
	r.Artifacts = []runs.Artifact{{Path: "out/x.bin", Size: 42, SHA256: "ab", URL: "https://h/v1/runs/x", ExpiresAt: at.Add(24 * time.Hour)}}
	r.ArtifactErrors = []string{"*.log matched nothing"}
	r.SandboxID, r.SandboxKept, r.KeptUntil = "sb_1", true, tp(at.Add(time.Hour))
	r.CleanupFailed, r.CleanupError = true, "destroy: busy"
	r.StartedAt, r.FinishedAt, r.DurationMs = tp(at.Add(time.Second)), tp(at.Add(5*time.Second)), i64p(4000)
	r.Success, r.CancelRequested = false, true
	r.UpdatedAt, r.Version = at.Add(5*time.Second), 2
	if err := s.UpdateRun(t.Context(), r); err != nil {
		t.Fatalf("UpdateRun: %v", err)
	}
	checkRunEqual(t, r, mustGetRun(t, s, r.ID))

	// A run with nothing optional: nil slices, maps and pointers read back nil.
	bare := runs.Run{ID: newRunID(), State: runs.Queued, CreatedAt: at, UpdatedAt: at, Version: 1}
	mustCreateRun(t, s, bare)
	checkRunEqual(t, bare, mustGetRun(t, s, bare.ID))
}

func testRunTimesUTCMillis(t *testing.T, s store.Store) {
	at := base().Add(123_456) // +05:30, with microseconds
	r := newRun("", at)
	r.Phases = []runs.Phase{{Name: runs.PhaseCommand, State: runs.PhaseRunning, StartedAt: tp(at)}}
	mustCreateRun(t, s, r)
	got := mustGetRun(t, s, r.ID)
	want := at.Truncate(time.Millisecond)
	checkTime(t, "created_at", want, got.CreatedAt)
	checkTime(t, "updated_at", want, got.UpdatedAt)
	if len(got.Phases) != 1 || got.Phases[0].StartedAt == nil {
		t.Fatalf("phases = %+v", got.Phases)
	}
	checkTime(t, "phase started_at", want, *got.Phases[0].StartedAt)
	if !r.Phases[0].StartedAt.Equal(at) || r.Phases[0].StartedAt.Location() == time.UTC {
		t.Errorf("CreateRun changed the caller's phase time to %v", r.Phases[0].StartedAt)
	}
	evs := mustRunEvents(t, s, r.ID)
	if len(evs) != 1 {
		t.Fatalf("events = %+v, want 1", evs)
	}
	checkTime(t, "event time", want, evs[0].Time)
}

func testRunUnknown(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, err := s.GetRun(ctx, "run_nope"); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("GetRun(unknown) = %v, want RUN_NOT_FOUND", err)
	}
	r := newRun("", utcBase())
	r.Version = 2
	if err := s.UpdateRun(ctx, r); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("UpdateRun(unknown) = %v, want RUN_NOT_FOUND", err)
	}
	if _, err := s.RunEvents(ctx, "run_nope", 0, 10); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("RunEvents(unknown) = %v, want RUN_NOT_FOUND", err)
	}
	if _, _, err := s.ClaimRun(ctx, "run_nope", 0, utcBase(), runs.Event{}); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("ClaimRun(unknown) = %v, want RUN_NOT_FOUND", err)
	}
	if _, err := s.GetBatch(ctx, "bat_nope"); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("GetBatch(unknown) = %v, want RUN_NOT_FOUND", err)
	}
	if _, err := s.BatchCounts(ctx, "bat_nope"); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("BatchCounts(unknown) = %v, want RUN_NOT_FOUND", err)
	}
	if err := s.UpdateBatch(ctx, runs.Batch{ID: "bat_nope", Kind: "batch", Version: 2}); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("UpdateBatch(unknown) = %v, want RUN_NOT_FOUND", err)
	}
}

func testRunCreateChecks(t *testing.T, s store.Store) {
	ctx := t.Context()
	r := newRun("alice", utcBase())
	bad := r
	bad.Version = 2
	if _, _, err := s.CreateRun(ctx, bad, queuedEvent(bad)); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateRun(version 2) = %v, want INVALID_ARGUMENT", err)
	}
	bad = r
	bad.State = runs.Running
	if _, _, err := s.CreateRun(ctx, bad, queuedEvent(bad)); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateRun(running) = %v, want INVALID_ARGUMENT", err)
	}
	bad = r
	bad.ID = ""
	if _, _, err := s.CreateRun(ctx, bad, queuedEvent(bad)); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateRun(no id) = %v, want INVALID_ARGUMENT", err)
	}
	ev := queuedEvent(r)
	ev.RunID = "run_other"
	if _, _, err := s.CreateRun(ctx, r, ev); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateRun(event of another run) = %v, want INVALID_ARGUMENT", err)
	}
	if _, err := s.GetRun(ctx, r.ID); !errcode.Is(err, errcode.RunNotFound) {
		t.Fatalf("a refused create wrote the run: GetRun = %v", err)
	}
	mustCreateRun(t, s, r)
	again := r
	again.Spec.Command = []string{"other"}
	if _, _, err := s.CreateRun(ctx, again, queuedEvent(again)); !errcode.Is(err, errcode.Conflict) {
		t.Errorf("CreateRun(existing id) = %v, want CONFLICT", err)
	}
	checkRunEqual(t, r, mustGetRun(t, s, r.ID))
	if evs := mustRunEvents(t, s, r.ID); len(evs) != 1 || evs[0].To != runs.Queued || evs[0].From != "" || evs[0].Reason != "run requested" || evs[0].RunID != r.ID {
		t.Errorf("events after a refused second create = %+v, want only the first", evs)
	}
}

func testRunIdempotency(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := newRun("alice", utcBase())
	first.Spec.IdempotencyKey = "k1"
	mustCreateRun(t, s, first)

	second := newRun("alice", utcBase().Add(time.Second))
	second.Spec.IdempotencyKey = "k1"
	second.Spec.Command = []string{"different"}
	got, created, err := s.CreateRun(ctx, second, queuedEvent(second))
	if err != nil || created {
		t.Fatalf("CreateRun(same owner and key) = created %v, %v; want the existing run", created, err)
	}
	checkRunEqual(t, first, got)
	if _, err := s.GetRun(ctx, second.ID); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("the second create inserted its run: GetRun = %v", err)
	}
	if evs := mustRunEvents(t, s, first.ID); len(evs) != 1 {
		t.Errorf("the second create appended an event: %+v", evs)
	}

	// Another owner's key is its own; an empty key never matches.
	other := newRun("bob", utcBase())
	other.Spec.IdempotencyKey = "k1"
	mustCreateRun(t, s, other)
	for range 2 {
		mustCreateRun(t, s, newRun("alice", utcBase()))
	}
	l, err := s.ListRuns(ctx, runs.Filter{Owner: "alice"})
	if err != nil || len(l.Runs) != 3 {
		t.Errorf("alice's runs = %d, %v; want 3", len(l.Runs), err)
	}
}

func testRunIdempotencyConcurrent(t *testing.T, s store.Store) {
	const n = 16
	var wg sync.WaitGroup
	var createdN atomic.Int32
	ids := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := newRun("alice", utcBase())
			r.Spec.IdempotencyKey = "same"
			got, created, err := s.CreateRun(t.Context(), r, queuedEvent(r))
			if created {
				createdN.Add(1)
			}
			ids[i], errs[i] = got.ID, err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("create %d: %v", i, err)
		}
	}
	if createdN.Load() != 1 {
		t.Errorf("%d concurrent creates with one key inserted %d runs, want 1", n, createdN.Load())
	}
	for i := range ids {
		if ids[i] != ids[0] {
			t.Errorf("create %d returned run %s, create 0 %s; want the same run", i, ids[i], ids[0])
		}
	}
	l, err := s.ListRuns(t.Context(), runs.Filter{Owner: "alice", Limit: runs.MaxList})
	if err != nil || len(l.Runs) != 1 {
		t.Errorf("runs stored = %d, %v; want 1", len(l.Runs), err)
	}
}

func testRunUpdateVersionAndEvents(t *testing.T, s store.Store) {
	ctx := t.Context()
	r := mustCreateRun(t, s, newRun("alice", utcBase()))
	at := utcBase().Add(time.Second)
	r.State, r.Version, r.UpdatedAt = runs.Running, 2, at
	evs := []runs.Event{
		{Time: at, From: runs.Queued, To: runs.Preparing, Phase: runs.PhaseSandbox, Reason: "claimed"},
		{Time: at, From: runs.Preparing, To: runs.Running, Phase: runs.PhaseCommand, Reason: "command started"},
	}
	if err := s.UpdateRun(ctx, r, evs...); err != nil {
		t.Fatalf("UpdateRun: %v", err)
	}
	got := mustRunEvents(t, s, r.ID)
	if len(got) != 3 {
		t.Fatalf("events = %+v, want 3", got)
	}
	for i, ev := range got[1:] {
		want := evs[i]
		if ev.RunID != r.ID || ev.From != want.From || ev.To != want.To || ev.Phase != want.Phase || ev.Reason != want.Reason ||
			!ev.Time.Equal(want.Time) || ev.Seq <= got[i].Seq {
			t.Errorf("event %d = %+v, want %+v after seq %d", i+1, ev, want, got[i].Seq)
		}
	}

	// A stale version writes nothing: neither the record nor its events.
	stale := r
	stale.State, stale.Reason = runs.Canceled, "stale writer"
	err := s.UpdateRun(ctx, stale, runs.Event{From: runs.Running, To: runs.Canceled, Reason: "stale"})
	if !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("UpdateRun(stale version) = %v, want CONFLICT", err)
	}
	checkRunEqual(t, r, mustGetRun(t, s, r.ID))
	if n := len(mustRunEvents(t, s, r.ID)); n != 3 {
		t.Errorf("a refused update appended events: %d, want 3", n)
	}
	// A bad event refuses the whole update.
	r.Version = 3
	if err := s.UpdateRun(ctx, r, runs.Event{To: "bogus"}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("UpdateRun(bad event) = %v, want INVALID_ARGUMENT", err)
	}
	if got := mustGetRun(t, s, r.ID); got.Version != 2 {
		t.Errorf("a refused update wrote version %d", got.Version)
	}
	// An update without events, and one event defaulting To to the record's state.
	if err := s.UpdateRun(ctx, r); err != nil {
		t.Fatalf("UpdateRun(no events): %v", err)
	}
	r.Version = 4
	if err := s.UpdateRun(ctx, r, runs.Event{Phase: runs.PhaseCommand, Reason: "note"}); err != nil {
		t.Fatalf("UpdateRun(note): %v", err)
	}
	all := mustRunEvents(t, s, r.ID)
	if last := all[len(all)-1]; len(all) != 4 || last.To != runs.Running || last.Reason != "note" || last.Time.IsZero() {
		t.Errorf("events = %+v, want a 4th note to running with a time", all)
	}
}

func testRunEventsPaging(t *testing.T, s store.Store) {
	ctx := t.Context()
	r := mustCreateRun(t, s, newRun("", utcBase()))
	other := mustCreateRun(t, s, newRun("", utcBase()))
	for i := range 9 {
		r.Version++
		o := other
		o.Version = other.Version + 1
		other = o
		if err := s.UpdateRun(ctx, r, runs.Event{Reason: fmt.Sprint("n", i)}); err != nil {
			t.Fatal(err)
		}
		if err := s.UpdateRun(ctx, other, runs.Event{Reason: "other"}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	var after int64
	for page := 0; ; page++ {
		evs, err := s.RunEvents(ctx, r.ID, after, 4)
		if err != nil {
			t.Fatalf("RunEvents(after %d): %v", after, err)
		}
		if len(evs) > 4 {
			t.Fatalf("page of %d events, limit 4", len(evs))
		}
		if len(evs) == 0 {
			break
		}
		for _, ev := range evs {
			if ev.RunID != r.ID || ev.Seq <= after {
				t.Fatalf("event %+v on a page after %d of run %s", ev, after, r.ID)
			}
			after = ev.Seq
			seen = append(seen, ev.Reason)
		}
		if page > 5 {
			t.Fatal("paging does not end")
		}
	}
	want := []string{"run requested", "n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"}
	if !slices.Equal(seen, want) {
		t.Errorf("events paged = %q, want %q", seen, want)
	}
	for _, lim := range []int{-1, runs.MaxEventsPage + 1} {
		if _, err := s.RunEvents(ctx, r.ID, 0, lim); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("RunEvents(limit %d) = %v, want INVALID_ARGUMENT", lim, err)
		}
	}
	if _, err := s.RunEvents(ctx, r.ID, -1, 10); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("RunEvents(after -1) = %v, want INVALID_ARGUMENT", err)
	}
	if evs, err := s.RunEvents(ctx, r.ID, 0, 0); err != nil || len(evs) != 10 {
		t.Errorf("RunEvents(limit 0: the default) = %d events, %v; want 10", len(evs), err)
	}
	if evs, err := s.RunEvents(ctx, r.ID, after, 10); err != nil || evs == nil || len(evs) != 0 {
		t.Errorf("RunEvents(after the last) = %v, %v; want an empty, non-nil page", evs, err)
	}
}

func testRunListFilters(t *testing.T, s store.Store) {
	ctx := t.Context()
	at := utcBase()
	b := runs.Batch{ID: newBatchID(), Owner: "alice", Kind: "batch", MaxParallel: 2, CreatedAt: at, Version: 1}
	var inBatch []runs.Run
	var evs []runs.Event
	for i := range 3 {
		r := newRun("alice", at.Add(time.Duration(i)*time.Second))
		r.BatchID = b.ID
		inBatch = append(inBatch, r)
		evs = append(evs, queuedEvent(r))
	}
	if _, created, err := s.CreateBatch(ctx, b, inBatch, evs); err != nil || !created {
		t.Fatalf("CreateBatch = %v, %v", created, err)
	}
	a1 := newRun("alice", at.Add(10*time.Second))
	a1.Spec.Labels = map[string]string{"team": "core", "a.b\"c": "x y"}
	mustCreateRun(t, s, a1)
	a2 := newRun("alice", at.Add(11*time.Second))
	a2.Spec.Labels = map[string]string{"team": "web"}
	mustCreateRun(t, s, a2)
	bob := newRun("bob", at.Add(12*time.Second))
	mustCreateRun(t, s, bob)
	// a2 settles.
	a2.State, a2.Version, a2.FinishedAt = runs.Succeeded, 2, tp(at.Add(20*time.Second))
	if err := s.UpdateRun(ctx, a2); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		f    runs.Filter
		want []string
	}{
		{"all", runs.Filter{}, []string{bob.ID, a2.ID, a1.ID, inBatch[2].ID, inBatch[1].ID, inBatch[0].ID}},
		{"owner", runs.Filter{Owner: "bob"}, []string{bob.ID}},
		{"batch", runs.Filter{BatchID: b.ID}, []string{inBatch[2].ID, inBatch[1].ID, inBatch[0].ID}},
		{"batch of another owner", runs.Filter{BatchID: b.ID, Owner: "bob"}, []string{}},
		{"state", runs.Filter{States: []runs.State{runs.Succeeded}}, []string{a2.ID}},
		{"states", runs.Filter{States: []runs.State{runs.Succeeded, runs.Queued}, Owner: "alice"},
			[]string{a2.ID, a1.ID, inBatch[2].ID, inBatch[1].ID, inBatch[0].ID}},
		// newRun labels every run team=core; a2 says web.
		{"label", runs.Filter{Labels: map[string]string{"team": "core"}}, []string{bob.ID, a1.ID, inBatch[2].ID, inBatch[1].ID, inBatch[0].ID}},
		{"labels all must match", runs.Filter{Labels: map[string]string{"team": "core", "a.b\"c": "x y"}}, []string{a1.ID}},
		{"label value differs", runs.Filter{Labels: map[string]string{"a.b\"c": "x"}}, []string{}},
		{"label unknown", runs.Filter{Labels: map[string]string{"nope": ""}}, []string{}},
	}
	for _, c := range cases {
		l, err := s.ListRuns(ctx, c.f)
		if err != nil {
			t.Errorf("%s: ListRuns: %v", c.name, err)
			continue
		}
		if got := runIDs(l.Runs); !slices.Equal(got, c.want) || l.Next != "" {
			t.Errorf("%s: ListRuns = %v next %q, want %v", c.name, got, l.Next, c.want)
		}
	}
	if _, err := s.ListRuns(ctx, runs.Filter{States: []runs.State{"bogus"}}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("ListRuns(bad state) = %v, want INVALID_ARGUMENT", err)
	}
}

func testRunListPagingAndBounds(t *testing.T, s store.Store) {
	ctx := t.Context()
	at := utcBase()
	const n = runs.DefaultList + 5
	for i := range n {
		// Pairs share a creation time: ties are ordered by id.
		mustCreateRun(t, s, newRun("alice", at.Add(time.Duration(i/2)*time.Millisecond)))
	}
	all, err := s.ListRuns(ctx, runs.Filter{Limit: runs.MaxList})
	if err != nil || len(all.Runs) != n || all.Next != "" {
		t.Fatalf("ListRuns(max) = %d runs next %q, %v; want %d, no next", len(all.Runs), all.Next, err, n)
	}
	for i := 1; i < n; i++ {
		p, q := all.Runs[i-1], all.Runs[i]
		if p.CreatedAt.Before(q.CreatedAt) || p.CreatedAt.Equal(q.CreatedAt) && p.ID < q.ID {
			t.Fatalf("runs %d and %d are out of order: %s %v then %s %v", i-1, i, p.ID, p.CreatedAt, q.ID, q.CreatedAt)
		}
	}
	def, err := s.ListRuns(ctx, runs.Filter{})
	if err != nil || len(def.Runs) != runs.DefaultList || def.Next != def.Runs[runs.DefaultList-1].ID {
		t.Fatalf("ListRuns(default) = %d runs next %q, %v; want %d and the last's id", len(def.Runs), def.Next, err, runs.DefaultList)
	}
	var paged []string
	before := ""
	for page := 0; ; page++ {
		l, err := s.ListRuns(ctx, runs.Filter{Before: before, Limit: 4})
		if err != nil {
			t.Fatalf("ListRuns(before %q): %v", before, err)
		}
		if len(l.Runs) > 4 {
			t.Fatalf("page of %d, limit 4", len(l.Runs))
		}
		paged = append(paged, runIDs(l.Runs)...)
		if l.Next == "" {
			break
		}
		before = l.Next
		if page > n {
			t.Fatal("paging does not end")
		}
	}
	if !slices.Equal(paged, runIDs(all.Runs)) {
		t.Errorf("paged = %v\nwant %v", paged, runIDs(all.Runs))
	}
	for _, lim := range []int{-1, runs.MaxList + 1} {
		if _, err := s.ListRuns(ctx, runs.Filter{Limit: lim}); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("ListRuns(limit %d) = %v, want INVALID_ARGUMENT", lim, err)
		}
	}
	if _, err := s.ListRuns(ctx, runs.Filter{Before: "run_unknown"}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("ListRuns(before unknown) = %v, want INVALID_ARGUMENT", err)
	}
	if l, err := s.ListRuns(ctx, runs.Filter{Owner: "nobody"}); err != nil || l.Runs == nil || len(l.Runs) != 0 {
		t.Errorf("ListRuns(no match) = %+v, %v; want an empty, non-nil list", l, err)
	}
}

func testRunUnsettledOldestFirst(t *testing.T, s store.Store) {
	ctx := t.Context()
	at := utcBase()
	var want []string
	for i, st := range []runs.State{runs.Running, runs.Succeeded, runs.Queued, runs.Failed, runs.Cleaning, runs.Canceled} {
		r := mustCreateRun(t, s, newRun("", at.Add(time.Duration(5-i)*time.Second)))
		if st != runs.Queued {
			r.State, r.Version = st, 2
			if err := s.UpdateRun(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if !st.Settled() {
			want = append([]string{r.ID}, want...)
		}
	}
	got, err := s.UnsettledRuns(ctx)
	if err != nil || !slices.Equal(runIDs(got), want) {
		t.Errorf("UnsettledRuns = %v, %v; want %v", runIDs(got), err, want)
	}
}

func testRunQueuedOldestFirstBounded(t *testing.T, s store.Store) {
	ctx := t.Context()
	at := utcBase()
	var want []string
	for i, st := range []runs.State{runs.Queued, runs.Running, runs.Queued, runs.Succeeded, runs.Queued, runs.Queued} {
		r := mustCreateRun(t, s, newRun("", at.Add(time.Duration(10-i)*time.Second)))
		if st != runs.Queued {
			r.State, r.Version = st, 2
			if err := s.UpdateRun(ctx, r); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want = append([]string{r.ID}, want...)
	}
	ids := func(qs []runs.QueuedRun) []string {
		var out []string
		for _, q := range qs {
			out = append(out, q.ID)
		}
		return out
	}
	got, err := s.QueuedRuns(ctx, 100)
	if err != nil || !slices.Equal(ids(got), want) {
		t.Errorf("QueuedRuns(100) = %v, %v; want %v", ids(got), err, want)
	}
	got, err = s.QueuedRuns(ctx, 2)
	if err != nil || !slices.Equal(ids(got), want[:2]) {
		t.Errorf("QueuedRuns(2) = %v, %v; want %v", ids(got), err, want[:2])
	}
	if got, err := s.QueuedRuns(ctx, 0); err != nil || len(got) != 0 {
		t.Errorf("QueuedRuns(0) = %v, %v; want none", ids(got), err)
	}
	// A claimed run is no longer queued.
	if _, claimed, err := s.ClaimRun(ctx, want[0], 0, at.Add(time.Minute), runs.Event{Reason: "worker"}); err != nil || !claimed {
		t.Fatalf("ClaimRun = %v, %v", claimed, err)
	}
	if got, err := s.QueuedRuns(ctx, 100); err != nil || !slices.Equal(ids(got), want[1:]) {
		t.Errorf("QueuedRuns after a claim = %v, %v; want %v", ids(got), err, want[1:])
	}
}

func testRunClaim(t *testing.T, s store.Store) {
	ctx := t.Context()
	at := utcBase().Add(time.Minute)
	r := mustCreateRun(t, s, newRun("", utcBase()))
	got, claimed, err := s.ClaimRun(ctx, r.ID, 0, at, runs.Event{Reason: "worker 1"})
	if err != nil || !claimed {
		t.Fatalf("ClaimRun(queued, no batch) = %v, %v; want claimed", claimed, err)
	}
	want := r
	want.State, want.Version, want.StartedAt, want.UpdatedAt = runs.Preparing, 2, tp(at), at
	checkRunEqual(t, want, got)
	checkRunEqual(t, want, mustGetRun(t, s, r.ID))
	evs := mustRunEvents(t, s, r.ID)
	if len(evs) != 2 || evs[1].From != runs.Queued || evs[1].To != runs.Preparing || evs[1].Reason != "worker 1" || !evs[1].Time.Equal(at) {
		t.Errorf("events = %+v, want the claim queued → preparing at %v", evs, at)
	}
	// A run no longer queued is not claimed, and nothing is written.
	again, claimed, err := s.ClaimRun(ctx, r.ID, 0, at, runs.Event{})
	if err != nil || claimed || again.State != runs.Preparing || again.Version != 2 {
		t.Errorf("ClaimRun(preparing) = %v, %+v, %v; want not claimed, the stored run", claimed, again.State, err)
	}
	if n := len(mustRunEvents(t, s, r.ID)); n != 2 {
		t.Errorf("a refused claim appended an event (%d events)", n)
	}
	if _, _, err := s.ClaimRun(ctx, r.ID, -1, at, runs.Event{}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("ClaimRun(max_parallel -1) = %v, want INVALID_ARGUMENT", err)
	}

	// A batch at its bound: the claim is refused and the run stays queued.
	b := runs.Batch{ID: newBatchID(), Kind: "batch", MaxParallel: 1, CreatedAt: utcBase(), Version: 1}
	rs := []runs.Run{newRun("", utcBase()), newRun("", utcBase())}
	rs[0].Owner, rs[1].Owner = "", ""
	if _, _, err := s.CreateBatch(ctx, b, rs, []runs.Event{queuedEvent(rs[0]), queuedEvent(rs[1])}); err != nil {
		t.Fatal(err)
	}
	if _, claimed, err := s.ClaimRun(ctx, rs[0].ID, 1, at, runs.Event{}); err != nil || !claimed {
		t.Fatalf("ClaimRun(first of batch) = %v, %v", claimed, err)
	}
	held, claimed, err := s.ClaimRun(ctx, rs[1].ID, 1, at, runs.Event{})
	if err != nil || claimed || held.State != runs.Queued || held.Version != 1 {
		t.Errorf("ClaimRun(batch at bound) = %v, %s v%d, %v; want not claimed, queued v1", claimed, held.State, held.Version, err)
	}
	if n := len(mustRunEvents(t, s, rs[1].ID)); n != 1 {
		t.Errorf("a refused claim appended an event (%d events)", n)
	}
	// Unbounded (0) claims past it; so does a bound of 2.
	if _, claimed, err := s.ClaimRun(ctx, rs[1].ID, 2, at, runs.Event{}); err != nil || !claimed {
		t.Errorf("ClaimRun(bound 2, 1 active) = %v, %v; want claimed", claimed, err)
	}
}

// testRunClaimBoundConcurrent: 30 goroutines race to claim a batch of 12 runs under
// max_parallel 3, each settling what it claimed; after every claim, no more than 3 of the
// batch's runs are active, and every run is claimed exactly once.
func testRunClaimBoundConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	const total, bound, workers = 12, 3, 30
	b := runs.Batch{ID: newBatchID(), Owner: "alice", Kind: "batch", MaxParallel: bound, CreatedAt: utcBase(), Version: 1}
	var rs []runs.Run
	var evs []runs.Event
	for range total {
		r := newRun("alice", utcBase())
		rs = append(rs, r)
		evs = append(evs, queuedEvent(r))
	}
	if _, _, err := s.CreateBatch(ctx, b, rs, evs); err != nil {
		t.Fatal(err)
	}
	var holding, maxHolding, claims, settled atomic.Int32
	claimedBy := make([]atomic.Int32, total)
	errc := make(chan error, workers*4)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(30 * time.Second)
			for i := w; settled.Load() < total; i++ {
				if time.Now().After(deadline) {
					errc <- fmt.Errorf("worker %d: the batch did not finish in 30 s", w)
					return
				}
				k := i % total
				r, claimed, err := s.ClaimRun(ctx, rs[k].ID, bound, time.Now(), runs.Event{Reason: fmt.Sprint("worker ", w)})
				if err != nil {
					errc <- err
					return
				}
				if !claimed {
					time.Sleep(100 * time.Microsecond)
					continue
				}
				claims.Add(1)
				claimedBy[k].Add(1)
				h := holding.Add(1)
				for m := maxHolding.Load(); h > m && !maxHolding.CompareAndSwap(m, h); m = maxHolding.Load() {
				}
				counts, err := s.BatchCounts(ctx, b.ID)
				if err != nil {
					errc <- err
					return
				}
				active := 0
				for _, st := range runs.ActiveStates {
					active += counts[st]
				}
				if active > bound || h > bound {
					errc <- fmt.Errorf("after a claim: %d runs active in the store, %d held by workers; the bound is %d", active, h, bound)
				}
				time.Sleep(time.Millisecond)
				holding.Add(-1) // before the store hears of it, so holding never exceeds the store's count
				r.State, r.Version, r.FinishedAt = runs.Succeeded, r.Version+1, tp(time.Now())
				if err := s.UpdateRun(ctx, r, runs.Event{From: runs.Preparing, To: runs.Succeeded}); err != nil {
					errc <- err
					return
				}
				settled.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if claims.Load() != total {
		t.Errorf("%d claims succeeded, want %d", claims.Load(), total)
	}
	for k := range claimedBy {
		if n := claimedBy[k].Load(); n != 1 {
			t.Errorf("run %d was claimed %d times, want once", k, n)
		}
	}
	if maxHolding.Load() < 1 {
		t.Errorf("no run was ever held")
	}
	counts, err := s.BatchCounts(ctx, b.ID)
	if err != nil || counts[runs.Succeeded] != total || len(counts) != 1 {
		t.Errorf("BatchCounts = %v, %v; want %d succeeded", counts, err, total)
	}
}

func newBatchWithRuns(owner, key string, n int, at time.Time) (runs.Batch, []runs.Run, []runs.Event) {
	b := runs.Batch{ID: newBatchID(), Owner: owner, IdempotencyKey: key, Kind: "matrix", MaxParallel: 4,
		SubmissionFailures: []runs.SubmissionFailure{{Index: n, Error: "spec.image: empty", Code: "INVALID_ARGUMENT"}},
		Axes:               []string{"env.MODE"}, Labels: map[string]string{"exp": "1"}, CreatedAt: at, Version: 1}
	var rs []runs.Run
	var evs []runs.Event
	for i := range n {
		r := newRun(owner, at)
		r.BatchID = b.ID
		rs = append(rs, r)
		evs = append(evs, queuedEvent(r))
		b.Runs = append(b.Runs, runs.BatchRun{RunID: r.ID, Index: i, State: runs.Queued})
		b.Matrix = append(b.Matrix, runs.Cell{Values: map[string]json.RawMessage{"env.MODE": json.RawMessage(fmt.Sprintf(`"m%d"`, i))},
			RunID: r.ID, State: runs.Queued, ExitCodes: map[string]*int{"command": nil, "setup": ip(0)}})
	}
	return b, rs, evs
}

func checkBatchEqual(t *testing.T, want, got runs.Batch) {
	t.Helper()
	wj, _ := json.Marshal(want)
	gj, _ := json.Marshal(got)
	if !bytes.Equal(wj, gj) {
		t.Errorf("batch read back differs:\n got %s\nwant %s", gj, wj)
	}
	if got.Owner != want.Owner || got.IdempotencyKey != want.IdempotencyKey || got.Version != want.Version {
		t.Errorf("batch owner, key, version = %q, %q, %d; want %q, %q, %d", got.Owner, got.IdempotencyKey, got.Version,
			want.Owner, want.IdempotencyKey, want.Version)
	}
}

func testBatchCreateAndIdempotency(t *testing.T, s store.Store) {
	ctx := t.Context()
	b, rs, evs := newBatchWithRuns("alice", "exp-1", 3, utcBase())
	got, created, err := s.CreateBatch(ctx, b, rs, evs)
	if err != nil || !created {
		t.Fatalf("CreateBatch = %v, %v", created, err)
	}
	checkBatchEqual(t, b, got)
	stored, err := s.GetBatch(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	checkBatchEqual(t, b, stored)
	for _, r := range rs {
		checkRunEqual(t, r, mustGetRun(t, s, r.ID))
		if evs := mustRunEvents(t, s, r.ID); len(evs) != 1 || evs[0].To != runs.Queued {
			t.Errorf("events of %s = %+v, want its first", r.ID, evs)
		}
	}

	b2, rs2, evs2 := newBatchWithRuns("alice", "exp-1", 2, utcBase().Add(time.Second))
	got, created, err = s.CreateBatch(ctx, b2, rs2, evs2)
	if err != nil || created {
		t.Fatalf("CreateBatch(same key) = %v, %v; want the existing batch", created, err)
	}
	checkBatchEqual(t, b, got)
	if _, err := s.GetBatch(ctx, b2.ID); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("the second batch was inserted: %v", err)
	}
	for _, r := range rs2 {
		if _, err := s.GetRun(ctx, r.ID); !errcode.Is(err, errcode.RunNotFound) {
			t.Errorf("a run of the refused batch was inserted: %v", err)
		}
	}
	// Another owner's key is its own; an empty batch (every spec refused) is a record too.
	b3, rs3, evs3 := newBatchWithRuns("bob", "exp-1", 0, utcBase())
	if _, created, err := s.CreateBatch(ctx, b3, rs3, evs3); err != nil || !created {
		t.Fatalf("CreateBatch(bob, empty) = %v, %v", created, err)
	}
	if c, err := s.BatchCounts(ctx, b3.ID); err != nil || len(c) != 0 {
		t.Errorf("BatchCounts(empty batch) = %v, %v", c, err)
	}
}

func testBatchCreateAtomic(t *testing.T, s store.Store) {
	ctx := t.Context()
	taken := newRun("alice", utcBase())
	taken.Spec.IdempotencyKey = "run-key"
	mustCreateRun(t, s, taken)

	b, rs, evs := newBatchWithRuns("alice", "", 3, utcBase())
	rs[2].Spec.IdempotencyKey = "run-key" // collides: the whole batch is refused
	if _, _, err := s.CreateBatch(ctx, b, rs, evs); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("CreateBatch(a run's key taken) = %v, want CONFLICT", err)
	}
	if _, err := s.GetBatch(ctx, b.ID); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("a refused batch was written: %v", err)
	}
	for _, r := range rs[:2] {
		if _, err := s.GetRun(ctx, r.ID); !errcode.Is(err, errcode.RunNotFound) {
			t.Errorf("a run of a refused batch was written: %v", err)
		}
	}
	b, rs, evs = newBatchWithRuns("alice", "", 2, utcBase())
	if _, _, err := s.CreateBatch(ctx, b, rs, evs[:1]); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateBatch(2 runs, 1 event) = %v, want INVALID_ARGUMENT", err)
	}
	rs[1].Owner = "bob"
	if _, _, err := s.CreateBatch(ctx, b, rs, evs); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateBatch(a run of another owner) = %v, want INVALID_ARGUMENT", err)
	}
	rs[1].Owner, rs[1].BatchID = "alice", "bat_other"
	if _, _, err := s.CreateBatch(ctx, b, rs, evs); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateBatch(a run of another batch) = %v, want INVALID_ARGUMENT", err)
	}
	big, rsBig, evsBig := newBatchWithRuns("alice", "", max(runs.MaxBatchRuns, runs.MaxMatrixCells)+1, utcBase())
	if _, _, err := s.CreateBatch(ctx, big, rsBig, evsBig); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("CreateBatch(%d runs) = %v, want INVALID_ARGUMENT", len(rsBig), err)
	}
	if l, err := s.ListRuns(ctx, runs.Filter{}); err != nil || len(l.Runs) != 1 {
		t.Errorf("runs after refused batches = %d, %v; want 1", len(l.Runs), err)
	}
}

func testBatchIdempotencyConcurrent(t *testing.T, s store.Store) {
	const n = 8
	var wg sync.WaitGroup
	var createdN atomic.Int32
	ids := make([]string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, rs, evs := newBatchWithRuns("alice", "same", 2, utcBase())
			got, created, err := s.CreateBatch(t.Context(), b, rs, evs)
			if err != nil {
				t.Errorf("CreateBatch %d: %v", i, err)
			}
			if created {
				createdN.Add(1)
			}
			ids[i] = got.ID
		}()
	}
	wg.Wait()
	if createdN.Load() != 1 {
		t.Errorf("%d concurrent batch creates with one key inserted %d, want 1", n, createdN.Load())
	}
	for i := range ids {
		if ids[i] != ids[0] {
			t.Errorf("create %d returned %s, create 0 %s", i, ids[i], ids[0])
		}
	}
	if l, err := s.ListRuns(t.Context(), runs.Filter{}); err != nil || len(l.Runs) != 2 {
		t.Errorf("runs stored = %d, %v; want the one batch's 2", len(l.Runs), err)
	}
}

func testBatchUpdateAndList(t *testing.T, s store.Store) {
	ctx := t.Context()
	var bs []runs.Batch
	for i := range 5 {
		owner := "alice"
		if i == 2 {
			owner = "bob"
		}
		b, rs, evs := newBatchWithRuns(owner, "", 1, utcBase().Add(time.Duration(i)*time.Second))
		if _, _, err := s.CreateBatch(ctx, b, rs, evs); err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	b := bs[0]
	b.Settled, b.SettledAt, b.Version = true, tp(base().Add(time.Minute)), 2
	b.Counts = map[runs.State]int{runs.Succeeded: 1}
	b.Compare = &runs.Comparison{Task: "fix it", Invocation: []string{"omp"}, Sides: []runs.SideSummary{{Side: "candidate",
		RepoURL: "https://x", Counts: map[runs.State]int{runs.Succeeded: 1}, Passed: 1, MedianTaskMs: i64p(5),
		Repetitions: []runs.RepetitionSummary{{RunID: "r", State: runs.Succeeded, Validations: []runs.PhaseOutcome{{State: runs.PhaseSucceeded, ExitCode: ip(0)}}}}}}}
	if err := s.UpdateBatch(ctx, b); err != nil {
		t.Fatalf("UpdateBatch: %v", err)
	}
	got, err := s.GetBatch(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := b
	want.SettledAt = tp(base().Add(time.Minute).UTC())
	checkBatchEqual(t, want, got)
	stale := b
	stale.Settled = false
	if err := s.UpdateBatch(ctx, stale); !errcode.Is(err, errcode.Conflict) {
		t.Errorf("UpdateBatch(stale) = %v, want CONFLICT", err)
	}
	if got, _ := s.GetBatch(ctx, b.ID); !got.Settled {
		t.Errorf("a stale update was written")
	}

	l, err := s.ListBatches(ctx, "alice", "", 2)
	if err != nil || len(l.Batches) != 2 || l.Batches[0].ID != bs[4].ID || l.Batches[1].ID != bs[3].ID || l.Next != bs[3].ID {
		t.Fatalf("ListBatches(alice, 2) = %+v, %v", l, err)
	}
	l, err = s.ListBatches(ctx, "alice", l.Next, 2)
	if err != nil || len(l.Batches) != 2 || l.Batches[0].ID != bs[1].ID || l.Batches[1].ID != bs[0].ID || l.Next != "" {
		t.Fatalf("ListBatches(alice, page 2) = %+v, %v; want %s %s and no next", l, err, bs[1].ID, bs[0].ID)
	}
	if l, err := s.ListBatches(ctx, "", "", 0); err != nil || len(l.Batches) != 5 {
		t.Errorf("ListBatches(every owner) = %d, %v; want 5", len(l.Batches), err)
	}
	if _, err := s.ListBatches(ctx, "", "", runs.MaxList+1); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("ListBatches(limit past max) = %v, want INVALID_ARGUMENT", err)
	}
	if _, err := s.ListBatches(ctx, "", "bat_unknown", 1); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("ListBatches(before unknown) = %v, want INVALID_ARGUMENT", err)
	}
}

func testBatchCounts(t *testing.T, s store.Store) {
	ctx := t.Context()
	b, rs, evs := newBatchWithRuns("alice", "", 5, utcBase())
	if _, _, err := s.CreateBatch(ctx, b, rs, evs); err != nil {
		t.Fatal(err)
	}
	mustCreateRun(t, s, newRun("alice", utcBase())) // outside the batch
	for i, st := range []runs.State{runs.Running, runs.Failed, runs.Failed} {
		r := rs[i]
		r.State, r.Version = st, 2
		if err := s.UpdateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.BatchCounts(ctx, b.ID)
	want := map[runs.State]int{runs.Running: 1, runs.Failed: 2, runs.Queued: 2}
	if err != nil || len(got) != len(want) || got[runs.Running] != 1 || got[runs.Failed] != 2 || got[runs.Queued] != 2 {
		t.Errorf("BatchCounts = %v, %v; want %v", got, err, want)
	}
}

func testRunPrune(t *testing.T, s store.Store) {
	ctx := t.Context()
	at := utcBase()
	cut := at.Add(time.Hour)
	settle := func(r runs.Run, st runs.State, finished time.Time) runs.Run {
		t.Helper()
		r.State, r.Version, r.FinishedAt, r.UpdatedAt = st, r.Version+1, tp(finished), finished
		if err := s.UpdateRun(ctx, r, runs.Event{To: st}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	old := settle(mustCreateRun(t, s, newRun("", at)), runs.Succeeded, at.Add(time.Minute))
	recent := settle(mustCreateRun(t, s, newRun("", at)), runs.Failed, cut.Add(time.Minute))
	oldUnsettled := mustCreateRun(t, s, newRun("", at))

	gone, rsGone, evsGone := newBatchWithRuns("", "", 2, at)
	if _, _, err := s.CreateBatch(ctx, gone, rsGone, evsGone); err != nil {
		t.Fatal(err)
	}
	settle(rsGone[0], runs.Canceled, at.Add(time.Minute))
	settle(rsGone[1], runs.TimedOut, at.Add(2*time.Minute))
	gone.Settled, gone.SettledAt, gone.Version = true, tp(at.Add(2*time.Minute)), 2
	if err := s.UpdateBatch(ctx, gone); err != nil {
		t.Fatal(err)
	}
	kept, rsKept, evsKept := newBatchWithRuns("", "", 2, at)
	if _, _, err := s.CreateBatch(ctx, kept, rsKept, evsKept); err != nil {
		t.Fatal(err)
	}
	settle(rsKept[0], runs.Succeeded, at.Add(time.Minute)) // rsKept[1] is still queued
	empty, _, _ := newBatchWithRuns("", "", 0, at)
	empty.Settled, empty.SettledAt = true, tp(at)
	if _, _, err := s.CreateBatch(ctx, empty, nil, nil); err != nil {
		t.Fatal(err)
	}
	lastSeq := mustRunEvents(t, s, recent.ID)
	maxSeq := lastSeq[len(lastSeq)-1].Seq

	ids, err := s.PruneRuns(ctx, cut)
	if err != nil {
		t.Fatalf("PruneRuns: %v", err)
	}
	wantGone := []string{old.ID, rsGone[0].ID, rsGone[1].ID, rsKept[0].ID}
	slices.Sort(ids)
	slices.Sort(wantGone)
	if !slices.Equal(ids, wantGone) {
		t.Errorf("PruneRuns = %v, want %v", ids, wantGone)
	}
	for _, id := range wantGone {
		if _, err := s.GetRun(ctx, id); !errcode.Is(err, errcode.RunNotFound) {
			t.Errorf("pruned run %s: GetRun = %v", id, err)
		}
		if _, err := s.RunEvents(ctx, id, 0, 10); !errcode.Is(err, errcode.RunNotFound) {
			t.Errorf("pruned run %s: RunEvents = %v", id, err)
		}
	}
	for _, id := range []string{recent.ID, oldUnsettled.ID, rsKept[1].ID} {
		mustGetRun(t, s, id)
	}
	for _, id := range []string{gone.ID, empty.ID} {
		if _, err := s.GetBatch(ctx, id); !errcode.Is(err, errcode.RunNotFound) {
			t.Errorf("batch %s with no runs left: GetBatch = %v, want pruned", id, err)
		}
	}
	if _, err := s.GetBatch(ctx, kept.ID); err != nil {
		t.Errorf("batch with a run left was pruned: %v", err)
	}
	if ids, err := s.PruneRuns(ctx, cut); err != nil || ids == nil || len(ids) != 0 {
		t.Errorf("second PruneRuns = %v, %v; want an empty, non-nil list", ids, err)
	}
	// Seqs are never reused after a prune.
	recent.Version++
	if err := s.UpdateRun(ctx, recent, runs.Event{Reason: "after prune"}); err != nil {
		t.Fatal(err)
	}
	evs := mustRunEvents(t, s, recent.ID)
	if last := evs[len(evs)-1]; last.Seq <= maxSeq {
		t.Errorf("event after prune has seq %d, not past %d", last.Seq, maxSeq)
	}
}
