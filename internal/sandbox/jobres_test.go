package sandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/metrics"
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
			GuestBinary: testenv.GuestBinary(t), CgroupParent: "abt-" + filepath.Base(root), Subreaper: true})
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
	j, err := e.jobs.WaitJob(context.Background(), sb, jobID, time.Minute)
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
	j, err := e.jobs.StartJob(context.Background(), sb, sandbox.JobStartRequest{Argv: argv})
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
	if r, err := e.jobs.JobStatus(context.Background(), sb.ID, j.ID); err != nil || !r.OOMKilled || r.State != sandbox.JobKilled {
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
		j, err := e.jobs.JobStatus(ctx, sb.ID, burn.ID)
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
			l, err := e.jobs.ListJobs(ctx, sb.ID, 0)
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
	fleet, err := metrics.New(e.svc.Core(), e.st).FleetMetrics(ctx)
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

// TestJobFullDisk: on a real runc sandbox (and gVisor: TestJobFullDiskGVisor) with the smallest
// disk, a job that writes more output than the disk holds fills it with its log; the full disk
// stops the logging, not the job: it runs on to its end (its own exit code), the status and the
// stored record say the log is truncated, job_logs returns what was kept (a prefix of what the
// job wrote, paged to the end), and the sandbox still answers exec.
func TestJobFullDisk(t *testing.T)       { testJobFullDisk(t, newEnv(t, sandbox.Config{})) }
func TestJobFullDiskGVisor(t *testing.T) { testJobFullDisk(t, newGVisorEnv(t, sandbox.Config{})) }

func testJobFullDisk(t *testing.T, e *env) {
	ctx := context.Background()
	sb := e.create(t, sandbox.CreateRequest{DiskMB: sandbox.MinDiskMB})
	// The job sets 2 MiB aside first, writes its numbered lines (22.9 MB, into a 16 MiB
	// disk that its log fills twice over: output and stdout), then frees what it set aside and
	// leaves a marker: work it can do only if it ran on past the full disk.
	const lines = 3000000
	script := `head -c 2097152 /dev/zero > /workspace/aside || exit 90
seq 1 ` + strconv.Itoa(lines) + `
echo after the output >&2
rm /workspace/aside && echo ran on > /workspace/marker || exit 91
exit 7`
	j := e.startJob(t, sb.ID, "sh", "-c", script)
	end, err := e.jobs.WaitJob(ctx, sb.ID, j.ID, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if end.State != sandbox.JobExited || end.ExitCode == nil || *end.ExitCode != 7 || !end.LogTruncated {
		t.Fatalf("the job on a full disk: %s", jobEnd(end))
	}
	var want bytes.Buffer
	for i := 1; i <= lines; i++ {
		want.WriteString(strconv.Itoa(i))
		want.WriteByte('\n')
	}
	if end.LogBytes <= 1<<20 || end.LogBytes >= int64(want.Len()) {
		t.Fatalf("log_bytes %d of the %d written; want more than 1 MiB kept, and not all", end.LogBytes, want.Len())
	}
	if st, err := e.jobs.JobStatus(ctx, sb.ID, j.ID); err != nil || !st.LogTruncated || st.State != sandbox.JobExited {
		t.Errorf("job_status: %s %v", jobEnd(st), err)
	}
	if rec, err := e.st.GetJob(ctx, sb.ID, j.ID); err != nil || !rec.LogTruncated || rec.LogBytes != end.LogBytes {
		t.Errorf("stored record: %s %v", jobEnd(rec), err)
	}
	var got []byte
	for off := int64(0); ; {
		page := int64(sandbox.MaxJobLogBytes)
		l, err := e.jobs.JobLogs(ctx, sb.ID, j.ID, sandbox.JobLogsRequest{Offset: &off, MaxBytes: &page})
		if err != nil {
			t.Fatal(err)
		}
		if !l.Truncated || l.TotalBytes != end.LogBytes || l.Source != "agent" {
			t.Fatalf("job_logs at %d: truncated %v total %d source %q; log_bytes %d", off, l.Truncated, l.TotalBytes, l.Source, end.LogBytes)
		}
		got = append(got, l.Data...)
		if l.NextOffset >= l.TotalBytes || len(l.Data) == 0 {
			break
		}
		off = l.NextOffset
	}
	if int64(len(got)) != end.LogBytes || !bytes.HasPrefix(want.Bytes(), got) {
		t.Fatalf("job_logs gave %d bytes (log_bytes %d), a prefix of the output: %v", len(got), end.LogBytes, bytes.HasPrefix(want.Bytes(), got))
	}
	if r := e.exec(t, sb.ID, argv("cat", "/workspace/marker")); r.ExitCode != 0 || r.Stdout != "ran on\n" {
		t.Fatalf("the sandbox after the full disk: %+v", r)
	}
}

// jobEnd is how a job ended, in a line (not its tail).
func jobEnd(j sandbox.Job) string {
	code := "none"
	if j.ExitCode != nil {
		code = strconv.Itoa(*j.ExitCode)
	}
	return fmt.Sprintf("state %s exit_code %s signal %q log_bytes %d log_truncated %v error %q (want exited 7, log_truncated)", j.State, code, j.Signal, j.LogBytes, j.LogTruncated, j.Error)
}
