package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime/microvm"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/imagelab"
	"github.com/agentbox/agentbox/internal/wire"
)

// requireVM skips only when QEMU or the guest kernel is absent (make deps installs both).
func requireVM(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps: hack/vm-deps.sh)")
	}
	if _, err := os.Stat(microvm.DefaultKernel); err != nil {
		t.Skipf("no guest kernel at %s (make deps: hack/vm-deps.sh)", microvm.DefaultKernel)
	}
}

// qemuPID is the QEMU process of vm sandbox id under state dir dir.
func qemuPID(t *testing.T, dir, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "runtimes", "vm", "sandboxes", id, "qemu.json"))
	if err != nil {
		t.Fatal(err)
	}
	var p struct{ PID int }
	if err := json.Unmarshal(b, &p); err != nil || p.PID <= 0 {
		t.Fatalf("qemu.json %q: %v", b, err)
	}
	return p.PID
}

// qemuUID is the real uid of process pid (its effective, saved and filesystem uids must agree).
func qemuUID(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 5 && f[0] == "Uid:" {
			if f[1] != f[2] || f[1] != f[3] || f[1] != f[4] {
				t.Fatalf("process %d's uids differ: %q", pid, l)
			}
			u, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return u
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return 0
}

// TestVMCLI is the README's CLI loop on `serve --runtime vm`: sandboxes are QEMU microVMs
// (TCG here), and exec, stdin, users, files and jobs work as on the other runtimes; a VM whose
// QEMU is SIGKILLed becomes lost; a SIGKILLed server adopts the running VMs; nothing is left.
func TestVMCLI(t *testing.T) {
	requireVM(t)
	dir := testenv.ShortTempDir(t, "abvm")
	s := startServer(t, dir, "--runtime", "vm", "--ready-timeout", "60s")
	id, errOut, code := s.cli("", "sandbox", "create", "--memory-mb", "256", "--env", "FOO=bar")
	id = strings.TrimSpace(id)
	if code != 0 || !sandbox.ValidID(id) {
		t.Fatalf("create printed %q (stderr %q, exit %d)\n%s", id, errOut, code, s.Logs)
	}
	if out, _, _ := s.cli("", "sandbox", "get", id); !strings.Contains(out, "vm (vm isolation)") {
		t.Fatalf("get: %q", out)
	}
	if out, _, code := s.cli("", "exec", id, "--", "sh", "-c", "echo $FOO; uname -n; exit 7"); out != "bar\n"+id+"\n" || code != 7 {
		t.Fatalf("exec: %q exit %d", out, code)
	}
	if out, _, code := s.cli("piped input", "exec", id, "--", "cat"); out != "piped input" || code != 0 {
		t.Fatalf("exec stdin: %q %d", out, code)
	}
	if out, e, code := s.cli("", "exec", id, "--", "id", "-un"); out != "agent\n" || code != 0 {
		t.Fatalf("default user: %q %q %d", out, e, code)
	}
	if out, e, code := s.cli("", "exec", "--user", "root", id, "--", "sh", "-c", "id -u; touch /root/ok"); out != "0\n" || code != 0 {
		t.Fatalf("--user root: %q %q %d", out, e, code)
	}
	local := filepath.Join(t.TempDir(), "notes.bin")
	data := make([]byte, 1<<20)
	rand.Read(data)
	os.WriteFile(local, data, 0o640)
	if _, e, code := s.cli("", "cp", local, id+":/workspace/notes.bin"); code != 0 {
		t.Fatalf("cp in: %s", e)
	}
	back := filepath.Join(t.TempDir(), "back.bin")
	if _, e, code := s.cli("", "cp", id+":/workspace/notes.bin", back); code != 0 {
		t.Fatalf("cp out: %s", e)
	}
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Fatal("cp round trip differs")
	}
	job, e, code := s.cli("", "job", "start", id, "--", "sh", "-c", "echo job-out; exit 3")
	job = strings.TrimSpace(job)
	if code != 0 || job == "" {
		t.Fatalf("job start: %q %q %d", job, e, code)
	}
	if _, _, code := s.cli("", "job", "wait", "--timeout", "60", id, job); code != 3 {
		t.Fatalf("job wait: exit %d, want the job's 3", code)
	}
	if out, _, _ := s.cli("", "logs", id, job); out != "job-out\n" {
		t.Fatalf("logs: %q", out)
	}
	// Files snapshots: a fork boots a VM of its own on a copy of the disk (its own hostname, the
	// files written before); sleep ends the VM keeping its disk, wake boots it again.
	forks, e, code := s.cli("", "fork", id)
	fork := strings.TrimSpace(forks)
	if code != 0 || !sandbox.ValidID(fork) {
		t.Fatalf("fork of a vm sandbox: %q %q %d", forks, e, code)
	}
	if out, e, code := s.cli("", "exec", fork, "--", "sh", "-c", "uname -n; cmp /workspace/notes.bin /workspace/notes.bin && echo has-notes"); out != fork+"\nhas-notes\n" || code != 0 {
		t.Fatalf("exec in the fork: %q %q %d", out, e, code)
	}
	if _, e, code := s.cli("", "sandbox", "rm", fork); code != 0 {
		t.Fatalf("destroy the fork: %s", e)
	}
	if out, e, code := s.cli("", "sleep", id); code != 0 || !strings.Contains(out, "sleeping") {
		t.Fatalf("sleep: %q %q %d", out, e, code)
	}
	if out, e, code := s.cli("", "wake", id); code != 0 || !strings.Contains(out, "running") {
		t.Fatalf("wake: %q %q %d", out, e, code)
	}
	if out, e, code := s.cli("", "exec", "--user", "root", id, "--", "sh", "-c", "uname -n; test -e /root/ok && echo root-ok"); out != id+"\nroot-ok\n" || code != 0 {
		t.Fatalf("exec after wake: %q %q %d", out, e, code)
	}

	// A second sandbox, asked for by isolation: the server kill below must adopt it.
	ctx := context.Background()
	c := s.client()
	sb2, err := c.Create(ctx, wire.CreateRequest{MemoryMB: 256, Requirements: wire.Requirements{Isolation: "vm"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb2.Runtime != "vm" || !strings.Contains(strings.Join(sb2.Hardening, " "), "vm:qemu-microvm") {
		t.Fatalf("isolation vm gave runtime %s, hardening %v", sb2.Runtime, sb2.Hardening)
	}
	if _, err := c.Exec(ctx, sb2.ID, apiExec("sh", "-c", "echo kept > /workspace/state.txt"), nil); err != nil {
		t.Fatal(err)
	}
	// Each VM's QEMU runs as the base of its own id range: two uids from the server's pool, and
	// the disk is that uid's alone.
	uid1, uid2 := qemuUID(t, qemuPID(t, dir, id)), qemuUID(t, qemuPID(t, dir, sb2.ID))
	for _, u := range []int64{uid1, uid2} {
		if u < sandbox.DefaultIDPoolBase || (u-sandbox.DefaultIDPoolBase)%sandbox.IDRangeSize != 0 {
			t.Errorf("qemu runs as uid %d, not the base of a range of the pool from %d", u, sandbox.DefaultIDPoolBase)
		}
	}
	if uid1 == uid2 {
		t.Errorf("two VMs' QEMUs share uid %d", uid1)
	}
	if !strings.Contains(strings.Join(sb2.Hardening, " "), "qemu:unprivileged(uid=base-of-sandbox-id-range)") {
		t.Errorf("hardening %v does not name the per-sandbox uid", sb2.Hardening)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "runtimes", "vm", "sandboxes", sb2.ID, "data.ext4"), &st); err != nil ||
		int64(st.Uid) != uid2 || st.Mode&0o777 != 0o600 {
		t.Errorf("%s's disk: uid %d mode %o %v, want uid %d mode 600", sb2.ID, st.Uid, st.Mode&0o777, err, uid2)
	}

	// An OCI image from a registry: its layers merged into the VM's root disk, its files and its
	// default user (root: the image names none) the VM's.
	reg := imagelab.Start(t)
	reg.Push(t, "e2e/busybox:1", imagelab.Busybox(t))
	if out, errOut, code := s.cli("", "image", "pull", reg.Ref("e2e/busybox:1")); code != 0 {
		t.Fatalf("image pull: %d %s %s", code, out, errOut)
	}
	sb3, err := c.Create(ctx, wire.CreateRequest{MemoryMB: 256, Image: reg.Ref("e2e/busybox:1")})
	if err != nil {
		t.Fatalf("a vm sandbox of an OCI image: %v\n%s", err, s.Logs)
	}
	if res, err := c.Exec(ctx, sb3.ID, apiExec("sh", "-c", "id -u; grep -c agent /etc/passwd; ls -d /home/agent"), nil); err != nil || res.Stdout != "0\n1\n/home/agent\n" {
		t.Fatalf("exec in the image's VM: %+v %v", res, err)
	}
	if _, err := c.Destroy(ctx, sb3.ID); err != nil {
		t.Fatal(err)
	}

	// QEMU dies behind the server's back: the sandbox becomes lost.
	if err := syscall.Kill(qemuPID(t, dir, id), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		sb, err := c.Get(ctx, id)
		if err == nil && sb.State == wire.StateLost {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after QEMU's SIGKILL: %+v %v", sb, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	s.kill()
	s2 := startServer(t, dir, "--runtime", "vm", "--ready-timeout", "60s")
	c2 := s2.client()
	if sb, err := c2.Get(ctx, sb2.ID); err != nil || sb.State != wire.StateRunning {
		t.Fatalf("after the server's restart %s: %+v %v\n%s", sb2.ID, sb, err, s2.Logs)
	}
	if res, err := c2.Exec(ctx, sb2.ID, apiExec("cat", "/workspace/state.txt"), nil); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("exec after restart: %+v %v", res, err)
	}
	if u := qemuUID(t, qemuPID(t, dir, sb2.ID)); u != uid2 {
		t.Errorf("the adopted VM's qemu runs as uid %d, want %d", u, uid2)
	}
	for _, x := range []string{id, sb2.ID} {
		if _, err := c2.Destroy(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	s2.stop()
	if d, _ := filepath.Glob(filepath.Join(dir, "runtimes", "vm", "sandboxes", "*")); len(d) > 0 {
		t.Errorf("vm sandbox dirs left: %v", d)
	}
	if leaks := testenv.Leaks(id, sb2.ID, sb3.ID, fork); len(leaks) > 0 {
		t.Errorf("host leaks:\n%s", strings.Join(leaks, "\n"))
	}
}
