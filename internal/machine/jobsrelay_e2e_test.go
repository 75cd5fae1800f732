package machine_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/machinelab"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestJobsAndRelayBetweenJoinedMachines runs the real binary: `agentbox serve` over TLS on a
// bridge of the test's own and two machines, each `agentbox join` in a network namespace with
// its own address. The GPU machine has a stand-in nvidia-smi on its PATH (recorded output of a
// two-GPU machine). A remote job reserves GPU 1 (a second job wanting it is GPU_BUSY, GPU 7 is
// refused), outlives a SIGKILL of the machine's agent and the agent's restart, ends with its
// output and frees the GPU; a job SIGKILLed from outside is `unknown`, never a success. A
// 50 MiB binary file is pulled from one machine, pushed to the other (new file 0600; a replaced
// file keeps its 0755) and downloaded, byte-exact.
func TestJobsAndRelayBetweenJoinedMachines(t *testing.T) {
	testenv.RequireRoot(t)
	lab := machinelab.New(t)
	bin := testenv.Binary(t)
	host := lab.ServerAddr().String()
	listen := net.JoinHostPort(host, strconv.Itoa(freePort(t, host)))
	srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abjr-"), "jr-token-"+strconv.FormatInt(time.Now().UnixNano(), 36),
		"--listen", listen, "--allow-remote", "--allow-private-network", "--tls-self-signed")
	cl := srv.Client()
	ctx := t.Context()
	tok, err := cl.CreateJoinToken(ctx, wire.TokenRequest{Uses: 2})
	if err != nil {
		t.Fatal(err)
	}
	standIn, err := filepath.Abs("../remotejobs/testdata")
	if err != nil {
		t.Fatal(err)
	}
	gpuEnv := append(os.Environ(), "PATH="+standIn+string(os.PathListSeparator)+os.Getenv("PATH"))
	ma, mb := lab.AddMachine(), lab.AddMachine()
	dirA, dirB := filepath.Join(testenv.ShortTempDir(t, "abjra-"), "m"), filepath.Join(testenv.ShortTempDir(t, "abjrb-"), "m")
	joinA := func(args ...string) *joinProc {
		return startJoinEnv(t, ma, bin, gpuEnv, append([]string{srv.URL, "--state-dir", dirA, "--fingerprint", srv.Fingerprint}, args...)...)
	}
	a := joinA("--token", tok.Secret, "--name", "gpubox")
	startJoin(t, mb, bin, srv.URL, "--token", tok.Secret, "--name", "storage", "--state-dir", dirB, "--fingerprint", srv.Fingerprint)
	twoGPUs := func(m wire.Machine) bool { return m.Online && len(m.GPUs) == 2 }
	if g := waitMachine(t, cl, "gpubox", "online with two GPUs", 30*time.Second, twoGPUs).GPUs[1]; g.Index != 1 || g.Name != "NVIDIA A100-SXM4-80GB" {
		t.Fatalf("GPU 1: %+v", g)
	}
	waitMachine(t, cl, "storage", "online", 30*time.Second, func(m wire.Machine) bool { return m.Online })

	t.Run("jobs", func(t *testing.T) {
		gpu := func(n int) *int { return &n }
		done := filepath.Join(t.TempDir(), "done")
		j, err := cl.StartRemoteJob(ctx, "gpubox", wire.RemoteJobStart{Shell: "bash", GPUIndex: gpu(1),
			Command: "echo gpu=$CUDA_VISIBLE_DEVICES; while [ ! -e " + done + " ]; do sleep 0.05; done; echo bye"})
		if err != nil || j.State != "running" {
			t.Fatalf("start: %+v %v", j, err)
		}
		if _, err := cl.StartRemoteJob(ctx, "gpubox", wire.RemoteJobStart{Command: "true", GPUIndex: gpu(1)}); errcode.Of(err) != errcode.GPUBusy {
			t.Fatalf("GPU 1 while its job runs: %v", err)
		}
		if _, err := cl.StartRemoteJob(ctx, "gpubox", wire.RemoteJobStart{Command: "true", GPUIndex: gpu(7)}); errcode.Of(err) != errcode.InvalidArgument {
			t.Fatalf("GPU 7 of a two-GPU machine: %v", err)
		}

		// The machine's agent dies (SIGKILL: no goodbye) and starts again on its state dir,
		// without a token. The job ran on; the new agent adopts it.
		a.cmd.Process.Kill()
		a.wait(t, 10*time.Second)
		waitMachine(t, cl, "gpubox", "offline after its agent died", 30*time.Second, func(m wire.Machine) bool { return !m.Online })
		if _, err := cl.RemoteJobStatus(ctx, "gpubox", j.JobID); errcode.Of(err) != errcode.MachineOffline {
			t.Fatalf("status while the machine is offline: %v", err)
		}
		a = joinA()
		waitMachine(t, cl, "gpubox", "back online", 30*time.Second, twoGPUs)
		got, err := cl.RemoteJobStatus(ctx, "gpubox", j.JobID)
		if err != nil || got.State != "running" || got.GPUIndex == nil || *got.GPUIndex != 1 {
			t.Fatalf("after the agent's restart: %+v %v", got, err)
		}
		if err := os.WriteFile(done, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		got = waitJob(t, cl, "gpubox", j.JobID)
		if got.State != "exited" || !got.Success || got.ExitCode == nil || *got.ExitCode != 0 {
			t.Fatalf("ended: %+v", got)
		}
		if l, err := cl.RemoteJobLogs(ctx, "gpubox", j.JobID, wire.RemoteJobLogsRequest{}); err != nil || string(l.Data) != "gpu=1\nbye\n" {
			t.Fatalf("logs: %q %v", l.Data, err)
		}
		// Its GPU is free again.
		again, err := cl.StartRemoteJob(ctx, "gpubox", wire.RemoteJobStart{Command: "echo $CUDA_VISIBLE_DEVICES", GPUIndex: gpu(1)})
		if err != nil {
			t.Fatalf("GPU 1 after its job ended: %v", err)
		}
		if got := waitJob(t, cl, "gpubox", again.JobID); got.State != "exited" || !got.Success {
			t.Fatalf("second GPU 1 job: %+v", got)
		}

		// A job SIGKILLed from outside (as the OOM killer does) left no exit record of its own:
		// unknown, never a success.
		k, err := cl.StartRemoteJob(ctx, "gpubox", wire.RemoteJobStart{Command: "exec sleep 300"})
		if err != nil || k.PID <= 0 {
			t.Fatalf("start: %+v %v", k, err)
		}
		// The job's shell execs sleep: wait for it (its cmdline is the shell's, or empty, until then).
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(k.PID) + "/cmdline")
			if bytes.HasPrefix(cmdline, []byte("sleep\x00300")) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pid %d is %q, not the job", k.PID, cmdline)
			}
		}
		if err := syscall.Kill(k.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if got := waitJob(t, cl, "gpubox", k.JobID); got.State != "unknown" || got.Success || got.ExitCode != nil {
			t.Fatalf("SIGKILLed job: %+v", got)
		}
		list, err := cl.ListRemoteJobs(ctx, "gpubox", 2)
		if err != nil || len(list.Jobs) != 2 || list.Omitted != 1 || list.Jobs[0].JobID != k.JobID {
			t.Fatalf("list with limit 2: %+v %v", list, err)
		}
	})

	t.Run("relay", func(t *testing.T) {
		data := make([]byte, 50<<20)
		rand.Read(data)
		sum := sha256.Sum256(data)
		src := filepath.Join(t.TempDir(), "model.bin")
		if err := os.WriteFile(src, data, 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := cl.RemotePull(ctx, "gpubox", src)
		if err != nil || b.Size != int64(len(data)) || b.SHA256 != hex.EncodeToString(sum[:]) || b.URL == "" {
			t.Fatalf("pull: %+v %v", b, err)
		}
		destDir := t.TempDir()
		dest := filepath.Join(destDir, "model.bin")
		p, err := cl.RemotePush(ctx, "storage", b.BlobID, dest)
		if err != nil || p.Size != b.Size || p.Mode != "0600" || p.Replaced {
			t.Fatalf("push: %+v %v", p, err)
		}
		sameFile(t, dest, data, 0o600)
		// A replaced file keeps its permission bits.
		old := filepath.Join(destDir, "run.sh")
		if err := os.WriteFile(old, []byte("old"), 0o755); err != nil {
			t.Fatal(err)
		}
		if p, err := cl.RemotePush(ctx, "storage", b.BlobID, old); err != nil || p.Mode != "0755" || !p.Replaced {
			t.Fatalf("push over a 0755 file: %+v %v", p, err)
		}
		sameFile(t, old, data, 0o755)
		// A destination whose parent does not exist is refused, and nothing is written.
		if _, err := cl.RemotePush(ctx, "storage", b.BlobID, filepath.Join(destDir, "no", "such")); errcode.Of(err) != errcode.FileNotFound {
			t.Fatalf("a push under a missing directory: %v", err)
		}
		if left, _ := os.ReadDir(destDir); len(left) != 2 {
			t.Fatalf("the destination directory holds %d entries, want the 2 pushed", len(left))
		}
		rc, n, digest, err := cl.DownloadBlob(ctx, b.BlobID)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || n != int64(len(data)) || digest != b.SHA256 || !bytes.Equal(got, data) {
			t.Fatalf("download: %d of %d bytes (%v), digest %s", len(got), n, err, digest)
		}
	})
}

// waitJob polls a remote job until it is no longer running.
func waitJob(t *testing.T, cl *client.Client, m, id string) wire.RemoteJob {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		j, err := cl.RemoteJobStatus(t.Context(), m, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != "running" {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still running after 30 s: %+v", id, j)
		}
	}
}

// sameFile checks a file's bytes and permission bits.
func sameFile(t *testing.T, path string, want []byte, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) || fi.Mode().Perm() != mode {
		t.Fatalf("%s: %d bytes (want %d, equal %v), mode %v (want %v), %v", path, len(got), len(want), bytes.Equal(got, want), fi.Mode().Perm(), mode, err)
	}
}
