package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

// Remote jobs: store.RemoteJobStore.

var remoteJobTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"RemoteJobRoundTripAndList", testRemoteJobRoundTrip},
	{"RemoteJobGPUExclusiveAndReleased", testRemoteJobGPU},
	{"RemoteJobConcurrentReservationsOneWins", testRemoteJobGPUConcurrent},
	{"RemoteJobEndedIsFinal", testRemoteJobEndedFinal},
}

func remoteJob(n int, machine string, gpu *int) store.RemoteJob {
	at := base().Add(time.Duration(n) * time.Second)
	return store.RemoteJob{ID: fmt.Sprintf("rjob-%016x", n), MachineID: machine, Owner: "owner", Command: fmt.Sprintf("train --epoch %d", n),
		Shell: "bash", GPUIndex: gpu, State: store.RemoteJobStarting, CreatedAt: at, UpdatedAt: at}
}

func testRemoteJobRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, err := s.GetRemoteJob(ctx, "rjob-0000000000000001"); !errcode.Is(err, errcode.JobNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
	for i := 1; i <= 5; i++ {
		if err := s.CreateRemoteJob(ctx, remoteJob(i, "m1", nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateRemoteJob(ctx, remoteJob(6, "m2", ip(0))); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateRemoteJob(ctx, remoteJob(1, "m1", nil)); err == nil {
		t.Fatal("a second record of one id was accepted")
	}
	g, err := s.GetRemoteJob(ctx, remoteJob(6, "", nil).ID)
	want := remoteJob(6, "m2", ip(0))
	if err != nil || g.MachineID != "m2" || g.Owner != "owner" || g.Command != want.Command || g.Shell != "bash" ||
		g.GPUIndex == nil || *g.GPUIndex != 0 || g.State != store.RemoteJobStarting || g.ExitCode != nil || g.EndedAt != nil {
		t.Fatalf("round trip: %+v %v", g, err)
	}
	checkTime(t, "created_at", want.CreatedAt, g.CreatedAt)
	jobs, omitted, err := s.ListRemoteJobs(ctx, "m1", 3)
	if err != nil || len(jobs) != 3 || omitted != 2 || jobs[0].ID != remoteJob(5, "", nil).ID || jobs[2].ID != remoteJob(3, "", nil).ID {
		t.Fatalf("list: %d jobs, %d omitted, %v", len(jobs), omitted, err)
	}
	ended := remoteJob(2, "m1", nil)
	at := base().Add(time.Hour)
	ended.State, ended.ExitCode, ended.Message, ended.UpdatedAt, ended.EndedAt = store.RemoteJobExited, ip(3), "exited 3", at, &at
	if _, err := s.UpdateRemoteJob(ctx, ended); err != nil {
		t.Fatal(err)
	}
	g, _ = s.GetRemoteJob(ctx, ended.ID)
	if g.State != store.RemoteJobExited || g.ExitCode == nil || *g.ExitCode != 3 || g.Message != "exited 3" || g.EndedAt == nil {
		t.Fatalf("after update: %+v", g)
	}
	checkTime(t, "ended_at", at, *g.EndedAt)
	active, err := s.ActiveRemoteJobs(ctx, 100)
	if err != nil || len(active) != 5 || active[0].ID != remoteJob(1, "", nil).ID {
		t.Fatalf("active: %d %v", len(active), err)
	}
	if _, err := s.UpdateRemoteJob(ctx, remoteJob(99, "m1", nil)); !errcode.Is(err, errcode.JobNotFound) {
		t.Fatalf("update unknown: %v", err)
	}
}

func testRemoteJobGPU(t *testing.T, s store.Store) {
	ctx := t.Context()
	a, b, other, otherMachine := remoteJob(1, "m1", ip(1)), remoteJob(2, "m1", ip(1)), remoteJob(3, "m1", ip(0)), remoteJob(4, "m2", ip(1))
	if err := s.CreateRemoteJob(ctx, a); err != nil {
		t.Fatal(err)
	}
	err := s.CreateRemoteJob(ctx, b)
	e, ok := errcode.As(err)
	if !ok || e.Code != errcode.GPUBusy || e.Details["job_id"] != a.ID {
		t.Fatalf("second job on GPU 1: %v", err)
	}
	if _, err := s.GetRemoteJob(ctx, b.ID); !errcode.Is(err, errcode.JobNotFound) {
		t.Fatalf("a refused job was recorded: %v", err)
	}
	for _, j := range []store.RemoteJob{other, otherMachine} {
		if err := s.CreateRemoteJob(ctx, j); err != nil {
			t.Fatalf("%s on GPU %d of %s: %v", j.ID, *j.GPUIndex, j.MachineID, err)
		}
	}
	rs, err := s.GPUReservations(ctx, "m1")
	if err != nil || len(rs) != 2 || rs[0].GPUIndex != 0 || rs[0].JobID != other.ID || rs[1].GPUIndex != 1 || rs[1].JobID != a.ID {
		t.Fatalf("reservations: %+v %v", rs, err)
	}
	// Running keeps it; canceling releases it.
	a.State = store.RemoteJobRunning
	if _, err := s.UpdateRemoteJob(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateRemoteJob(ctx, b); !errcode.Is(err, errcode.GPUBusy) {
		t.Fatalf("GPU 1 while its job runs: %v", err)
	}
	at := base().Add(time.Minute)
	a.State, a.EndedAt = store.RemoteJobCanceled, &at
	if _, err := s.UpdateRemoteJob(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateRemoteJob(ctx, b); err != nil {
		t.Fatalf("GPU 1 after its job was canceled: %v", err)
	}
	rs, _ = s.GPUReservations(ctx, "m1")
	if len(rs) != 2 || rs[1].JobID != b.ID {
		t.Fatalf("reservations after release: %+v", rs)
	}
}

func testRemoteJobGPUConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = s.CreateRemoteJob(ctx, remoteJob(i+1, "m1", ip(0))) })
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errcode.Is(err, errcode.GPUBusy):
			t.Errorf("unexpected error: %v", err)
		}
	}
	rs, _ := s.GPUReservations(ctx, "m1")
	if won != 1 || len(rs) != 1 {
		t.Fatalf("%d of %d concurrent reservations won, %d held; want exactly 1", won, n, len(rs))
	}
}

func testRemoteJobEndedFinal(t *testing.T, s store.Store) {
	ctx := t.Context()
	j := remoteJob(1, "m1", ip(2))
	if err := s.CreateRemoteJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	at := base().Add(time.Minute)
	j.State, j.Message, j.EndedAt = store.RemoteJobUnknown, "no exit record", &at
	if _, err := s.UpdateRemoteJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	j.State, j.ExitCode, j.EndedAt = store.RemoteJobRunning, nil, nil
	got, err := s.UpdateRemoteJob(ctx, j)
	if err != nil || got.State != store.RemoteJobUnknown || got.Message != "no exit record" {
		t.Fatalf("an ended job moved on: %+v %v", got, err)
	}
	if rs, _ := s.GPUReservations(ctx, "m1"); len(rs) != 0 {
		t.Fatalf("an ended job still holds %+v", rs)
	}
}
