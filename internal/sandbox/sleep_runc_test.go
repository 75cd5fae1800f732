package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
)

// hostCgroup returns the host cgroup directory of sandbox id that accounts its memory (cgroup
// v2, or v1's memory controller), and the file holding its usage; "" if there is none.
func hostCgroup(id string) (dir, usage string) {
	for _, l := range testenv.Leaks(id) {
		p, ok := strings.CutPrefix(l, "cgroup: ")
		if !ok {
			continue
		}
		for _, f := range []string{"memory.current", "memory.usage_in_bytes"} {
			if _, err := os.Stat(filepath.Join(p, f)); err == nil {
				return p, filepath.Join(p, f)
			}
		}
	}
	return "", ""
}

// TestSleepWakeRunc: a runc sandbox put to sleep holds nothing on the host but its snapshot
// (its cgroup, processes, mounts and loop device are gone: the memory is released), wakes under
// the same id and id range with its files, owners and modes, and a job running across the sleep
// is settled unknown (runc saves files only here); the woken sandbox runs new work, and nothing is
// left once it is destroyed.
func TestSleepWakeRunc(t *testing.T) {
	testenv.RequireRoot(t)
	snaps := filepath.Join(testenv.ShortTempDir(t, "absleep"), "snapshots")
	e := newEnv(t, sandbox.Config{SnapshotDir: snaps})
	sb := e.create(t, sandbox.CreateRequest{MemoryMB: 256})
	const fingerprint = `cd /workspace && find . -printf '%p %y %#m %U:%G %s\n' | LC_ALL=C sort && find . -type f -exec md5sum {} + | LC_ALL=C sort`
	e.sh(t, sb.ID, "mkdir -p /workspace/d && echo before-sleep > /workspace/f && head -c 1048576 /dev/urandom > /workspace/d/big && chmod 640 /workspace/f && chown 1000:1000 /workspace/d/big")
	before := e.sh(t, sb.ID, fingerprint)
	// 32 MiB resident in the sandbox's memory (tmpfs), and a job that runs across the sleep.
	e.sh(t, sb.ID, "head -c 33554432 /dev/urandom > /dev/shm/resident")
	j := e.startJob(t, sb.ID, "sleep", "1000")
	rng := e.rangeOf(t, sb.ID)

	cg, usage := hostCgroup(sb.ID)
	if cg == "" {
		t.Fatal("no memory cgroup found on the host for the running sandbox (the check below could not fail)")
	}
	b, err := os.ReadFile(usage)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); n < 32<<20 {
		t.Fatalf("running sandbox's cgroup holds %d bytes; want at least the 32 MiB resident", n)
	}

	slept, err := e.svc.Sleep(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if slept.State != sandbox.StateSleeping {
		t.Fatalf("Sleep = %s", slept.State)
	}
	if leaks := testenv.Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("a sleeping sandbox still holds host resources (its memory is not released):\n%s", strings.Join(leaks, "\n"))
	}
	if _, err := os.Stat(cg); !os.IsNotExist(err) {
		t.Fatalf("cgroup %s still there while asleep: %v", cg, err)
	}
	if _, err := os.Stat(filepath.Join(e.root, "sandboxes", sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("the runtime's directory of a sleeping sandbox is still there: %v", err)
	}
	if r, err := e.jobs.JobStatus(context.Background(), sb.ID, j.ID); err != nil || r.State != sandbox.JobUnknown || !strings.Contains(r.Error, "slept without memory") {
		t.Fatalf("job across a files-only sleep = %+v, %v; want unknown saying why", r, err)
	}

	woke, err := e.svc.Wake(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if woke.State != sandbox.StateRunning || woke.ID != sb.ID {
		t.Fatalf("Wake = %+v", woke)
	}
	if got := e.rangeOf(t, sb.ID); got.Base != rng.Base {
		t.Fatalf("id range after wake %+v; want the same %+v", got, rng)
	}
	if got := e.sh(t, sb.ID, fingerprint); got != before {
		t.Fatalf("files after wake differ:\n--- before sleep\n%s\n--- after wake\n%s", before, got)
	}
	if got := e.sh(t, sb.ID, "ls /dev/shm"); strings.Contains(got, "resident") {
		t.Fatal("memory (tmpfs) survived a files-only sleep: the runtime kept more than it said")
	}
	e.sh(t, sb.ID, "echo after-wake >> /workspace/f")
	if got := e.sh(t, sb.ID, "cat /workspace/f"); got != "before-sleep\nafter-wake\n" {
		t.Fatalf("file after wake and a write = %q", got)
	}
	if cg, _ := hostCgroup(sb.ID); cg == "" {
		t.Fatal("woken sandbox has no cgroup")
	}
	if ents, _ := os.ReadDir(snaps); len(ents) != 0 {
		t.Fatalf("sleep snapshot left after the wake: %v", ents)
	}
	// Asleep again, destroyed: nothing left (newEnv's cleanup checks the host).
	if _, err := e.svc.Sleep(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Destroy(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(snaps); len(ents) != 0 {
		t.Fatalf("sleep snapshot left after destroy: %v", ents)
	}
}

// lastCount is the last number a counting job appended to /tmp/count (the sandbox's memory).
func (e *env) lastCount(t *testing.T, id string) int {
	t.Helper()
	out := strings.TrimSpace(e.sh(t, id, "tail -n 1 /tmp/count"))
	n, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("count %q: %v", out, err)
	}
	return n
}

// TestSleepWakeGVisorMemory: on gVisor, whose Capabilities list files+memory, a sleep saves
// memory and processes: the sandbox's cgroup is gone while it sleeps, its job's record stays
// running, and after the wake the same job process counts on from where it was (its count lives
// in memory, on /tmp), under the same id.
func TestSleepWakeGVisorMemory(t *testing.T) {
	snaps := filepath.Join(testenv.ShortTempDir(t, "abgsl"), "snapshots")
	e := newGVisorEnv(t, sandbox.Config{SnapshotDir: snaps})
	sb := e.create(t, sandbox.CreateRequest{MemoryMB: 256})
	j := e.startJob(t, sb.ID, "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i >> /tmp/count; sleep 0.05; done")
	deadline := time.Now().Add(30 * time.Second)
	for e.sh(t, sb.ID, "test -s /tmp/count && echo y || true") != "y\n" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if cg, _ := hostCgroup(sb.ID); cg == "" {
		t.Fatal("no memory cgroup found on the host for the running sandbox (the check below could not fail)")
	}
	before := e.lastCount(t, sb.ID)
	slept, err := e.svc.Sleep(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := e.svc.Events(context.Background(), sandbox.EventFilter{SandboxID: sb.ID})
	if last := evs[len(evs)-1]; last.To != sandbox.StateSleeping || !strings.Contains(last.Reason, "files+memory") {
		t.Fatalf("sleep event %+v; want to sleeping with files+memory", last)
	}
	if leaks := testenv.Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("a sleeping gVisor sandbox still holds host resources:\n%s", strings.Join(leaks, "\n"))
	}
	if r, err := e.jobs.JobStatus(context.Background(), sb.ID, j.ID); err != nil || r.State != sandbox.JobRunning {
		t.Fatalf("job of a sandbox asleep with memory = %+v, %v; want running", r, err)
	}
	if _, err := e.svc.Wake(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	at := e.lastCount(t, sb.ID)
	time.Sleep(time.Second)
	if now := e.lastCount(t, sb.ID); now <= at || at < before {
		t.Fatalf("the job's count was %d before the sleep and went %d → %d after the wake; want it counting on from there", before, at, now)
	}
	if r, err := e.jobs.JobStatus(context.Background(), sb.ID, j.ID); err != nil || r.State != sandbox.JobRunning {
		t.Fatalf("job after a memory wake = %+v, %v; want running", r, err)
	}
	if _, err := os.Stat(filepath.Join(snaps, slept.SleepSnapshot)); !os.IsNotExist(err) {
		t.Fatalf("sleep snapshot left after the wake: %v", err)
	}
	if _, err := e.jobs.CancelJob(context.Background(), sb.ID, j.ID, nil); err != nil {
		t.Fatal(err)
	}
}

// TestSleepEndsRootJobTree: a runc sandbox's sleep (files only here) ends every process of a
// root job, a child that dropped its exec tag, left the session and ignores SIGTERM included:
// the sleeping sandbox holds no process on the host, the job is settled unknown, and after the
// wake no process of the job runs.
func TestSleepEndsRootJobTree(t *testing.T) {
	testenv.RequireRoot(t)
	snaps := filepath.Join(testenv.ShortTempDir(t, "absleep"), "snapshots")
	e := newEnv(t, sandbox.Config{SnapshotDir: snaps})
	sb := e.create(t, sandbox.CreateRequest{})
	const mark = "1000.4343"
	drop := `import os, signal; os.setgroups([]); os.setsid(); signal.signal(signal.SIGTERM, signal.SIG_IGN); os.execvp("sleep", ["sleep", "` + mark + `"])`
	j, err := e.jobs.StartJob(context.Background(), sb.ID, sandbox.JobStartRequest{
		Argv: []string{"sh", "-c", `python3 -c '` + drop + `' & sleep ` + mark + ` & wait`}, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	// sleep's processes with the mark in their argv (the scan's own argv holds a pattern).
	scan := `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f" 2>/dev/null | grep -q '^sleep 1000[.]4343' && echo "${f%/cmdline}"; done; true`
	for deadline := time.Now().Add(20 * time.Second); len(strings.Fields(e.sh(t, sb.ID, scan))) < 2; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the job's two sleeps never showed: %q", e.sh(t, sb.ID, scan))
		}
	}
	if _, err := e.svc.Sleep(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if leaks := testenv.Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("a sleeping sandbox still holds host resources:\n%s", strings.Join(leaks, "\n"))
	}
	if r, err := e.jobs.JobStatus(context.Background(), sb.ID, j.ID); err != nil || r.State != sandbox.JobUnknown {
		t.Fatalf("the job across the sleep = %+v, %v; want unknown", r, err)
	}
	if _, err := e.svc.Wake(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if left := e.sh(t, sb.ID, scan); strings.TrimSpace(left) != "" {
		t.Fatalf("after the sleep and wake the job's processes %q still run", left)
	}
	if _, err := e.svc.Destroy(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
}
