//go:build linux

package remotejobs_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/hostjobs"
	"github.com/agentbox/agentbox/internal/remotejobs"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == hostjobs.SupervisorCommand {
		os.Exit(hostjobs.Supervise(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// machines stands in for machine.Registry: machines served by httptest servers running the
// real job handler, offline when their server is down.
type machines struct {
	mu sync.Mutex
	m  map[string]*fakeMachine
}

type fakeMachine struct {
	rec store.Machine
	srv *httptest.Server
}

func (ms *machines) Client(_ context.Context, ref string) (*http.Client, store.Machine, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, fm := range ms.m {
		if fm.rec.ID == ref || fm.rec.Name == ref {
			if fm.srv == nil {
				return nil, store.Machine{}, errcode.New(errcode.MachineOffline, "machine %s is offline", ref)
			}
			hc := fm.srv.Client()
			base := fm.srv.URL
			hc.Transport = rewrite{base: base, rt: hc.Transport}
			return hc, fm.rec, nil
		}
	}
	return nil, store.Machine{}, errcode.New(errcode.MachineNotFound, "no machine %s", ref)
}

// rewrite sends http://machine/... to the httptest server, as the registry's transport sends it
// over the machine's connection.
type rewrite struct {
	base string
	rt   http.RoundTripper
}

func (r rewrite) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host = "http", strings.TrimPrefix(r.base, "http://")
	return r.rt.RoundTrip(req)
}

// standInGPUs puts the stand-in nvidia-smi (testdata) first on PATH and reads it as a
// machine's heartbeat does (gpu.Query).
func standInGPUs(t *testing.T) []gpu.GPU {
	t.Helper()
	td, _ := filepath.Abs("testdata")
	t.Setenv("PATH", td+string(os.PathListSeparator)+os.Getenv("PATH"))
	gpus, err := gpu.Query(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 2 || gpus[1].Index != 1 || gpus[1].Name != "NVIDIA A100-SXM4-80GB" {
		t.Fatalf("stand-in nvidia-smi: %+v", gpus)
	}
	return gpus
}

type env struct {
	ms      *machines
	dbPath  string
	st      *sqlite.Store
	svc     *remotejobs.Service
	mgr     *hostjobs.Manager
	machine store.Machine
}

func setup(t *testing.T) *env {
	t.Helper()
	mgr, err := hostjobs.NewManager(hostjobs.Options{Dir: filepath.Join(t.TempDir(), "jobs"), NoSystemdScope: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(hostjobs.NewHandler(mgr))
	t.Cleanup(srv.Close)
	rec := store.Machine{ID: "m-0001", Name: "gpubox", Platform: "linux", GPUs: standInGPUs(t)}
	e := &env{ms: &machines{m: map[string]*fakeMachine{"m-0001": {rec: rec, srv: srv}}}, mgr: mgr, machine: rec,
		dbPath: filepath.Join(t.TempDir(), "state.db")}
	e.open(t)
	return e
}

// open opens the store and a service on it (again, after close: a server restart).
func (e *env) open(t *testing.T) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), e.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e.st, e.svc = st, remotejobs.New(e.ms, st, remotejobs.Options{Owner: ownerOf})
}

func waitState(t *testing.T, svc *remotejobs.Service, id, state string) remotejobs.Job {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		j, err := svc.Status(context.Background(), "gpubox", id)
		if err != nil {
			t.Fatal(err)
		}
		if j.State == state {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s is %s, want %s", id, j.State, state)
		}
	}
}

func reservations(t *testing.T, st store.RemoteJobStore, machine string) map[int]string {
	t.Helper()
	rs, err := st.GPUReservations(context.Background(), machine)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, r := range rs {
		out[r.GPUIndex] = r.JobID
	}
	return out
}

func gpuIdx(n int) *int { return &n }

type ownerKey struct{}

// owned is ctx of a caller named who (serve uses sandbox.OwnerFrom).
func owned(ctx context.Context, who string) context.Context {
	return context.WithValue(ctx, ownerKey{}, who)
}

func ownerOf(ctx context.Context) string { s, _ := ctx.Value(ownerKey{}).(string); return s }

// TestGPUReservation: exclusive per GPU, GPU_BUSY naming the holder, an index the machine never
// reported refused before anything is recorded, released on cancel and on the job's own end.
func TestGPUReservation(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	done := filepath.Join(t.TempDir(), "done")
	wait := "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; while [ ! -e " + done + " ]; do sleep 0.05; done"
	a, err := e.svc.Start(owned(ctx, "alice"), "gpubox", remotejobs.StartRequest{Command: "exec sleep 300", GPUIndex: gpuIdx(0)})
	if err != nil || a.State != "running" {
		t.Fatalf("start on GPU 0: %+v %v", a, err)
	}
	_, err = e.svc.Start(owned(ctx, "bob"), "gpubox", remotejobs.StartRequest{Command: "true", GPUIndex: gpuIdx(0)})
	if ec, ok := errcode.As(err); !ok || ec.Code != errcode.GPUBusy || ec.Details["job_id"] != a.JobID {
		t.Fatalf("second job on GPU 0: %v", err)
	}
	_, err = e.svc.Start(owned(ctx, "bob"), "gpubox", remotejobs.StartRequest{Command: "true", GPUIndex: gpuIdx(2)})
	if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), "0, 1") {
		t.Fatalf("GPU 2 of a two-GPU machine: %v", err)
	}
	if recs, _, _ := e.st.ListRemoteJobs(ctx, e.machine.ID, 1000); len(recs) != 1 {
		t.Fatalf("%d records after refused starts, want 1", len(recs))
	}
	if l, _ := e.mgr.List(ctx, 1000); len(l.Jobs) != 1 {
		t.Fatalf("the machine has %d jobs, want 1 (nothing phantom started)", len(l.Jobs))
	}
	d, err := e.svc.Start(owned(ctx, "bob"), "gpubox", remotejobs.StartRequest{Command: wait, GPUIndex: gpuIdx(1), Shell: "bash"})
	if err != nil {
		t.Fatal(err)
	}
	if r := reservations(t, e.st, e.machine.ID); r[0] != a.JobID || r[1] != d.JobID {
		t.Fatalf("reservations: %v", r)
	}
	// Cancel releases GPU 0.
	c, err := e.svc.Cancel(ctx, "gpubox", a.JobID, time.Second)
	if err != nil || c.State != "canceled" || c.Success {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	b, err := e.svc.Start(owned(ctx, "bob"), "gpubox", remotejobs.StartRequest{Command: "exec sleep 300", GPUIndex: gpuIdx(0)})
	if err != nil {
		t.Fatalf("GPU 0 after its job was canceled: %v", err)
	}
	// D's own end releases GPU 1, learned from a status call.
	os.WriteFile(done, nil, 0o600)
	j := waitState(t, e.svc, d.JobID, "exited")
	if !j.Success || *j.ExitCode != 0 {
		t.Fatalf("job on GPU 1: %+v", j)
	}
	logs, err := e.svc.Logs(ctx, "gpubox", d.JobID, remotejobs.LogsRequest{})
	if err != nil || string(logs.Data) != "CUDA_VISIBLE_DEVICES=1\n" {
		t.Fatalf("logs: %q %v", logs.Data, err)
	}
	if r := reservations(t, e.st, e.machine.ID); len(r) != 1 || r[0] != b.JobID {
		t.Fatalf("reservations after the GPU 1 job ended: %v", r)
	}
	list, err := e.svc.List(ctx, "gpubox", 2)
	if err != nil || len(list.Jobs) != 2 || list.Omitted != 1 || list.Jobs[0].JobID != b.JobID || list.Jobs[0].Owner != "bob" {
		t.Fatalf("list: %+v %v", list, err)
	}
	e.svc.Cancel(ctx, "gpubox", b.JobID, 0)
}

// TestReservationSurvivesServerRestart: the record and its reservation outlive the service
// and its store; the restarted server still refuses the GPU, and its background check releases
// it once the job ended while nobody asked.
func TestReservationSurvivesServerRestart(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	done := filepath.Join(t.TempDir(), "done")
	a, err := e.svc.Start(owned(ctx, "alice"), "gpubox", remotejobs.StartRequest{Command: "while [ ! -e " + done + " ]; do sleep 0.05; done", GPUIndex: gpuIdx(1)})
	if err != nil {
		t.Fatal(err)
	}
	e.st.Close()
	e.open(t)
	if _, err := e.svc.Start(owned(ctx, "bob"), "gpubox", remotejobs.StartRequest{Command: "true", GPUIndex: gpuIdx(1)}); !errcode.Is(err, errcode.GPUBusy) {
		t.Fatalf("GPU 1 after a server restart: %v", err)
	}
	os.WriteFile(done, nil, 0o600)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		e.svc.Reconcile(ctx)
		if len(reservations(t, e.st, e.machine.ID)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reservation was not released after the job ended")
		}
	}
	rec, _ := e.st.GetRemoteJob(ctx, a.JobID)
	if rec.State != store.RemoteJobExited || rec.ExitCode == nil || *rec.ExitCode != 0 {
		t.Fatalf("record: %+v", rec)
	}
}

// TestCrashBetweenRecordAndStart: a record left `starting` converges: to failed (and its GPU
// released) when the machine never heard of it, to running when the start reached it.
func TestCrashBetweenRecordAndStart(t *testing.T) {
	now := time.Now()
	e := setup(t)
	ctx := context.Background()
	old := now.Add(-3 * time.Minute)
	never := store.RemoteJob{ID: "rjob-00000000000000aa", MachineID: e.machine.ID, Command: "true", Shell: "sh", GPUIndex: gpuIdx(0),
		State: store.RemoteJobStarting, CreatedAt: old, UpdatedAt: old}
	started := store.RemoteJob{ID: "rjob-00000000000000bb", MachineID: e.machine.ID, Command: "exec sleep 300", Shell: "sh", GPUIndex: gpuIdx(1),
		State: store.RemoteJobStarting, CreatedAt: old, UpdatedAt: old}
	recent := store.RemoteJob{ID: "rjob-00000000000000cc", MachineID: e.machine.ID, Command: "true", Shell: "sh",
		State: store.RemoteJobStarting, CreatedAt: now, UpdatedAt: now}
	for _, r := range []store.RemoteJob{never, started, recent} {
		if err := e.st.CreateRemoteJob(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.mgr.Start(ctx, hostjobs.StartRequest{JobID: started.ID, Command: started.Command, GPUIndex: gpuIdx(1)}); err != nil {
		t.Fatal(err)
	}
	e.open(t) // the restarted server
	e.svc.Reconcile(ctx)
	for id, want := range map[string]string{never.ID: store.RemoteJobFailed, started.ID: store.RemoteJobRunning, recent.ID: store.RemoteJobStarting} {
		if rec, _ := e.st.GetRemoteJob(ctx, id); rec.State != want {
			t.Errorf("%s: %s, want %s", id, rec.State, want)
		}
	}
	if r := reservations(t, e.st, e.machine.ID); len(r) != 1 || r[1] != started.ID {
		t.Fatalf("reservations: %v", r)
	}
	e.svc.Cancel(ctx, "gpubox", started.ID, 0)
	if r := reservations(t, e.st, e.machine.ID); len(r) != 0 {
		t.Fatalf("reservations after cancel: %v", r)
	}
}

// TestRefusedStart: a job the machine refuses is recorded failed and holds nothing; one for
// the wrong platform's shell, a bad argument or an offline machine records nothing at all.
func TestRefusedStart(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	_, err := e.svc.Start(owned(ctx, "a"), "gpubox", remotejobs.StartRequest{Command: "true", Cwd: "/nonexistent/dir", GPUIndex: gpuIdx(0)})
	if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), "cwd") {
		t.Fatalf("missing cwd: %v", err)
	}
	recs, _, _ := e.st.ListRemoteJobs(ctx, e.machine.ID, 10)
	if len(recs) != 1 || recs[0].State != store.RemoteJobFailed || len(reservations(t, e.st, e.machine.ID)) != 0 {
		t.Fatalf("after a refused start: %+v", recs)
	}
	for name, req := range map[string]remotejobs.StartRequest{
		"powershell on linux": {Command: "true", Shell: "powershell"},
		"empty command":       {Command: " "},
		"relative cwd":        {Command: "true", Cwd: "x"},
	} {
		if _, err := e.svc.Start(owned(ctx, "a"), "gpubox", req); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	e.ms.m["m-0001"].srv = nil
	if _, err := e.svc.Start(owned(ctx, "a"), "gpubox", remotejobs.StartRequest{Command: "true"}); !errcode.Is(err, errcode.MachineOffline) {
		t.Errorf("offline: %v", err)
	}
	if recs, _, _ := e.st.ListRemoteJobs(ctx, e.machine.ID, 10); len(recs) != 1 {
		t.Fatalf("%d records, want 1", len(recs))
	}
	if _, err := e.svc.List(ctx, "gpubox", 0); !errcode.Is(err, errcode.MachineOffline) {
		t.Errorf("list offline: %v", err)
	}
	if _, err := e.svc.List(ctx, "gpubox", 1001); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("list limit: %v", err)
	}
}
