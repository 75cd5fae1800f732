package sandbox_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
)

// newGVisorEnv is newEnv on gVisor (runsc) instead of runc.
func newGVisorEnv(t *testing.T, cfg sandbox.Config) *env {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Fatalf("runsc is not installed (make deps installs it): %v", err)
	}
	cfg.DefaultRuntime = "gvisor"
	return newEnvWrapped(t, cfg, func(runtime.Runtime) runtime.Runtime {
		root := testenv.ShortTempDir(t, "abgv")
		rt, err := oci.New(context.Background(), oci.Config{Name: "gvisor", Flavor: oci.FlavorGVisor, Root: root,
			GuestBinary: testenv.Binary(t), CgroupParent: "abt-" + filepath.Base(root), Subreaper: true})
		if err != nil {
			t.Fatal(err)
		}
		if caps := rt.Capabilities(); !caps.Available {
			t.Fatalf("gVisor unavailable: %s", caps.Reason)
		}
		return rt
	})
}

// waitJobEnd waits (at most a minute) for job jobID of sandbox sb to end.
func (e *env) waitJobEnd(t *testing.T, sb, jobID string) sandbox.Job {
	t.Helper()
	j, err := e.svc.WaitJob(context.Background(), sb, jobID, time.Minute)
	if err != nil {
		t.Fatalf("wait %s: %v", jobID, err)
	}
	if j.State.Active() {
		t.Fatalf("job %s still %s after a minute", jobID, j.State)
	}
	return j
}

func (e *env) startJob(t *testing.T, sb string, argv ...string) sandbox.Job {
	t.Helper()
	j, err := e.svc.StartJob(context.Background(), sb, sandbox.JobStartRequest{Argv: argv})
	if err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	return j
}

// testJobOOM: a job allocating 512 MiB in a sandbox of memMB (64 or 128) ends killed, SIGKILL, oom_killed
// (record and reply), and the sandbox runs on; a job that SIGKILLs itself is not an OOM kill.
func testJobOOM(t *testing.T, e *env, memMB int64) {
	sb := e.create(t, sandbox.CreateRequest{MemoryMB: memMB})
	j := e.startJob(t, sb.ID, "python3", "-c", "b = bytearray(512 << 20); print(len(b))")
	j = e.waitJobEnd(t, sb.ID, j.ID)
	if j.State != sandbox.JobKilled || j.Signal != "SIGKILL" || !j.OOMKilled || j.Success {
		t.Fatalf("allocating 512 MiB under a %d MiB limit: %+v (want killed, SIGKILL, oom_killed)", memMB, j)
	}
	if r, err := e.svc.JobStatus(context.Background(), sb.ID, j.ID); err != nil || !r.OOMKilled || r.State != sandbox.JobKilled {
		t.Errorf("job_status after the OOM kill: %+v, %v", r, err)
	}
	self := e.waitJobEnd(t, sb.ID, e.startJob(t, sb.ID, "sh", "-c", "kill -9 $$").ID)
	if self.State != sandbox.JobKilled || self.Signal != "SIGKILL" || self.OOMKilled {
		t.Errorf("a job that SIGKILLs itself: %+v (want killed, SIGKILL, not oom_killed)", self)
	}
	if r := e.exec(t, sb.ID, argv("echo", "alive")); r.Stdout != "alive\n" {
		t.Fatalf("sandbox not alive after the OOM kill: %+v", r)
	}
}

func TestJobOOMKilled(t *testing.T) { testJobOOM(t, newEnv(t, sandbox.Config{}), 64) }

// TestJobOOMKilledGVisor: the same on gVisor, where the host's OOM guard does the kill. 128 MiB:
// gVisor bounds a sandbox's processes by memory_mb/8, and 64 MiB leaves a job too few.
func TestJobOOMKilledGVisor(t *testing.T) { testJobOOM(t, newGVisorEnv(t, sandbox.Config{}), 128) }

// TestJobCPUSeconds: on a real runc sandbox (and gVisor: TestJobCPUSecondsGVisor), a job whose child burns 2 s of CPU reports its
// CPU time while it runs (job_status, job_list) and at least 0.5 s once it ended (the reply
// and the stored record); an idle sleep reports less than 0.2 s.
func TestJobCPUSeconds(t *testing.T)       { testJobCPU(t, newEnv(t, sandbox.Config{})) }
func TestJobCPUSecondsGVisor(t *testing.T) { testJobCPU(t, newGVisorEnv(t, sandbox.Config{})) }

func testJobCPU(t *testing.T, e *env) {
	ctx := context.Background()
	sb := e.create(t, sandbox.CreateRequest{})
	// The burner is sh's child: the running samples find it by the job's process group, the
	// end's rusage through sh's wait.
	burn := e.startJob(t, sb.ID, "sh", "-c", `python3 -c "import time
while time.process_time() < 2.0: pass"; echo done`)
	idle := e.startJob(t, sb.ID, "sleep", "1")
	seen := 0.0
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		j, err := e.svc.JobStatus(ctx, sb.ID, burn.ID)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != sandbox.JobRunning {
			break
		}
		if j.CPUSeconds < seen {
			t.Errorf("cpu_seconds went down while running: %g after %g", j.CPUSeconds, seen)
		}
		seen = j.CPUSeconds
		if seen >= 0.3 {
			l, err := e.svc.ListJobs(ctx, sb.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, lj := range l.Jobs {
				if lj.ID == burn.ID && lj.State == sandbox.JobRunning && lj.CPUSeconds < seen {
					t.Errorf("job_list's cpu_seconds %g for the running burner, less than job_status's %g", lj.CPUSeconds, seen)
				}
			}
			break
		}
	}
	// The fleet's sample says how many jobs each sandbox runs, from one store query.
	fleet, err := e.svc.FleetMetrics(ctx)
	if err != nil || len(fleet.Sandboxes) != 1 || fleet.Sandboxes[0].RunningJobs == nil || *fleet.Sandboxes[0].RunningJobs < 1 {
		t.Errorf("FleetMetrics running jobs: %+v, %v; want 1 or 2 (the burner, and the sleep unless it ended)", fleet, err)
	}
	if seen < 0.3 {
		t.Errorf("the running burner's cpu_seconds never reached 0.3 (last %g)", seen)
	}
	end := e.waitJobEnd(t, sb.ID, burn.ID)
	if end.State != sandbox.JobExited || end.CPUSeconds < 1.5 || end.CPUSeconds > 30 {
		t.Errorf("burner ended %s with cpu_seconds %g; want exited, about 2", end.State, end.CPUSeconds)
	}
	if rec, err := e.st.GetJob(ctx, sb.ID, burn.ID); err != nil || rec.CPUSeconds != end.CPUSeconds {
		t.Errorf("stored record: cpu_seconds %g, %v; want %g", rec.CPUSeconds, err, end.CPUSeconds)
	}
	// A sleeping job costs only its start-up: under gVisor on a loaded host
	// loading the binary alone was measured at 0.22 s, so the bound is half a
	// second and a quarter of what the burner used.
	if j := e.waitJobEnd(t, sb.ID, idle.ID); j.State != sandbox.JobExited || j.CPUSeconds >= 0.5 || j.CPUSeconds >= end.CPUSeconds/4 {
		t.Errorf("sleep 1 ended %s with cpu_seconds %g; want exited, under 0.5 and under a quarter of the burner's %g", j.State, j.CPUSeconds, end.CPUSeconds)
	}
}
