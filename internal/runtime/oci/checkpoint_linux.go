package oci

// Memory snapshots (runtime.SnapshotFilesMemory): the disk as snapshot_linux.go saves it, and
// beside it, in the snapshot's memory/ directory, the image of every process of the sandbox.
//
// gVisor: `runsc checkpoint --image-path=memory/` saves the sentry's whole kernel (its tasks,
// their memory, the sandbox's tmpfs mounts, open files by path), and `runsc restore --detach
// --image-path=memory/` starts a sandbox from it, under any container id, from a new bundle
// whose disk is a copy of the saved one. The restore runs with the same top-level flags as the
// original run (the runtime's globalArgs and createFlags, which are the same for every sandbox of
// a Runtime), and the new sandbox gets what a run gives one: its gofer recorded, its OOM guard,
// its init record.
//
// What cannot be saved: a socket bound to a host path. The agent's listening socket is one (the
// gofer binds it on the host for the sentry: --host-uds), and so is every connection the host
// made to it ("Cannot save endpoint with bound host socket", measured with the pinned runsc). The
// agent therefore lets go of them first: the runtime sends it guest.SignalQuiesce (runsc kill
// <id> USR1) and waits for the socket file to vanish; after the checkpoint it sends
// guest.SignalRelisten (USR2) to the sandbox that ran on and to every restored one, and waits
// for the agent to answer a dial. A restored gVisor agent needs no signal: it listens again as
// soon as the restored kernel runs (gVisor's checkpoint waiter, guest.SignalRelisten's comment),
// while the host records the sandbox's init and OOM guard; a restore then only dials it, and
// signals it after relistenGrace if it has not answered (an agent of an older version). The
// `runsc kill` is off the wake's critical path. Requests in flight at that moment fail; upgraded streams (a
// terminal, the egress session) end and are opened again by their clients. Processes started by
// the agent (exec'd commands, jobs) are not touched and continue.
//
// Consistency: the disk copy and the memory image are of one instant. Without Release: the
// sandbox is quiesced, paused (Pauser), checkpointed with --leave-running (the kernel stays
// paused: runsc resumes it only with the final resume), its disk synced and copied, then resumed.
// The checkpoint is before the copy because saving flushes what the sentry still holds of the
// sandbox's file writes to the gofer. With Release (sleep): checkpointed without
// --leave-running, which ends the sandbox once it is saved; its disk is then moved into the
// snapshot (releaseInto) and every host resource of the sandbox deleted: no sentry, no gofer, no
// cgroup is left.
//
// runc and crun: CRIU (`runc checkpoint`/`runc restore`) where `criu check` passes; the same
// quiesce and order. Not exercised here: Debian 12's CRIU 3.17 fails `criu check` on kernels
// ≥ 6.13 (their vDSO layout changed; fixed in CRIU 4.1), and MemorySnapshotReason says so.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

const (
	// memoryDirName, in a snapshot's directory, holds the checkpoint image.
	memoryDirName = "memory"
	// memorySpecName, in memory/, is the saved sandbox's OCI spec: a restore compares its limits.
	memorySpecName = "sandbox-config.json"
	// quiesceTimeout bounds the wait for the agent to let go of its host sockets, and
	// relistenTimeout the wait for it to answer again.
	quiesceTimeout  = 10 * time.Second
	relistenTimeout = 15 * time.Second
	// checkpointTimeout bounds a checkpoint or restore command (memory_mb of pages to write).
	checkpointTimeout = 2 * time.Minute
)

// probeMemorySnapshots fills Capabilities.Snapshots and MemorySnapshotReason: every flavour
// takes files snapshots; gVisor takes memory ones where its runsc has checkpoint and restore
// with the flags used here (the pinned runsc has; the tests exercise them), runc and crun where
// CRIU is installed and `criu check` passes.
func (r *Runtime) probeMemorySnapshots(ctx context.Context) {
	if !slices.Contains(r.caps.Snapshots, runtime.SnapshotFiles) {
		r.caps.Snapshots = append(r.caps.Snapshots, runtime.SnapshotFiles)
	}
	reason := r.probeCheckpoint(ctx)
	r.caps.MemorySnapshotReason = reason
	if reason == "" && !slices.Contains(r.caps.Snapshots, runtime.SnapshotFilesMemory) {
		r.caps.Snapshots = append(r.caps.Snapshots, runtime.SnapshotFilesMemory)
	}
	if reason != "" {
		r.log.Info("no memory snapshots", "reason", reason)
	}
}

// probeCheckpoint returns why this flavour cannot checkpoint and restore memory here, or "".
func (r *Runtime) probeCheckpoint(ctx context.Context) string {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if r.flavor == FlavorGVisor {
		// runsc prints a command's flags for --help (and exits non-zero).
		ck, _ := exec.CommandContext(cctx, r.binary, "checkpoint", "--help").CombinedOutput()
		rs, _ := exec.CommandContext(cctx, r.binary, "restore", "--help").CombinedOutput()
		for _, f := range []string{"-image-path", "-leave-running"} {
			if !bytes.Contains(ck, []byte(f)) {
				return fmt.Sprintf("%s %s has no `checkpoint %s`; install the runsc agentbox pins (%s)", r.binary, r.caps.Version, f, r.flavor.InstallHint())
			}
		}
		for _, f := range []string{"-image-path", "-detach"} {
			if !bytes.Contains(rs, []byte(f)) {
				return fmt.Sprintf("%s %s has no `restore %s`; install the runsc agentbox pins (%s)", r.binary, r.caps.Version, f, r.flavor.InstallHint())
			}
		}
		return ""
	}
	return probeCRIU(cctx)
}

// probeCRIU says why runc and crun cannot checkpoint with CRIU here, or "".
func probeCRIU(ctx context.Context) string {
	criu, err := exec.LookPath("criu")
	if err != nil {
		for _, p := range []string{"/usr/sbin/criu", "/sbin/criu"} {
			if _, serr := os.Stat(p); serr == nil {
				criu, err = p, nil
				break
			}
		}
	}
	if err != nil {
		return "memory snapshots of runc and crun sandboxes need CRIU, which is not installed (apt-get install criu; it must pass `criu check`); take a files snapshot (memory: false)"
	}
	ver, _ := exec.CommandContext(ctx, criu, "--version").CombinedOutput()
	version := strings.TrimSpace(strings.TrimPrefix(firstLine(string(ver)), "Version:"))
	out, err := exec.CommandContext(ctx, criu, "check").CombinedOutput()
	msg := strings.TrimSpace(string(out))
	// criu check exits 0 even when it cannot start; its verdict is in its output.
	if err == nil && strings.Contains(msg, "Looks good") {
		return ""
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	kernel := unix.ByteSliceToString(uts.Release[:])
	detail := firstLine(lastLines(msg, 4))
	if strings.Contains(msg, "vdso") || strings.Contains(msg, "vDSO") {
		return fmt.Sprintf("memory snapshots of runc and crun sandboxes need CRIU, and `criu check` fails here: CRIU %s cannot parse the vDSO of kernel %s (its layout changed in 6.13; fixed in CRIU 4.1): %s; install CRIU 4.1 or later (criu.org, or a newer distribution's package), or take a files snapshot (memory: false)",
			version, kernel, detail)
	}
	return fmt.Sprintf("memory snapshots of runc and crun sandboxes need CRIU, and `criu check` (CRIU %s, kernel %s) fails here: %s; install a CRIU that passes `criu check`, or take a files snapshot (memory: false)",
		version, kernel, detail)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(l)
}

// lastLines is the first of the last n lines of s that names an error, or the last line.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	lines = lines[max(0, len(lines)-n):]
	for _, l := range lines {
		if strings.Contains(l, "Error") {
			return l
		}
	}
	return lines[len(lines)-1]
}

// memoryCapable reports whether this runtime takes memory snapshots here.
func (r *Runtime) memoryCapable() bool {
	return slices.Contains(r.caps.Snapshots, runtime.SnapshotFilesMemory)
}

// saveMemory takes a files+memory snapshot of running sandbox id into dir (see the file's
// comment for the order). On failure dir is emptied and, unless its own checkpoint ended it,
// the sandbox runs on with its agent listening.
func (r *Runtime) saveMemory(ctx context.Context, id, dir string, opts runtime.SnapshotOptions) (info runtime.SnapshotInfo, err error) {
	if !r.memoryCapable() {
		return info, errcode.New(errcode.UnsupportedOp, "runtime %s cannot snapshot the memory of sandbox %s: %s", r.name, id, r.memorySnapshotReason()).
			With("argument", "memory")
	}
	sdir := r.sandboxDir(id)
	img := filepath.Join(sdir, diskImageName)
	var ist unix.Stat_t
	if err := unix.Lstat(img, &ist); err != nil || ist.Mode&unix.S_IFMT != unix.S_IFREG {
		return info, errcode.New(errcode.SandboxNotRunning, "sandbox %s has no disk in runtime %s", id, r.name)
	}
	info = runtime.SnapshotInfo{Kind: runtime.SnapshotFilesMemory, DiskMB: ist.Size >> 20, IDMap: r.sandboxIDMap(id)}
	began := time.Now()
	ended := false // a releasing checkpoint ended the sandbox: the directory is all that is left of it
	defer func() {
		if err != nil && !ended {
			clearDir(dir)
		}
		if err != nil && ended {
			r.log.Error("memory snapshot failed after its checkpoint ended the sandbox; the directory holds what was saved, but no snapshot", "sandbox_id", id, "dir", dir, "err", err)
		}
	}()
	mem := filepath.Join(dir, memoryDirName)
	if err := os.Mkdir(mem, 0o700); err != nil {
		return info, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot make the memory directory of the snapshot of sandbox %s", id)
	}
	spec, err := os.ReadFile(filepath.Join(sdir, "config.json"))
	if err == nil {
		err = os.WriteFile(filepath.Join(mem, memorySpecName), spec, 0o600)
	}
	if err != nil {
		return info, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot save the spec of sandbox %s", id)
	}
	if err := r.quiesceAgent(ctx, id); err != nil {
		r.relistenAfter(ctx, id)
		return info, err
	}
	dst := filepath.Join(dir, diskImageName)
	if opts.Release {
		ended, err = r.checkpointRelease(ctx, id, mem, dst)
	} else {
		err = r.checkpointRunning(ctx, id, mem, img, dst, ist.Size)
	}
	if err != nil {
		return runtime.SnapshotInfo{}, err
	}
	if err := syncPath(dst); err != nil {
		return runtime.SnapshotInfo{}, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot write the snapshot of sandbox %s to disk", id)
	}
	synced := time.Now()
	defer func() { r.log.Debug("memory snapshot synced", "sandbox_id", id, "took", time.Since(synced)) }()
	if err := syncTree(mem); err != nil {
		return runtime.SnapshotInfo{}, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot write the memory image of sandbox %s to disk", id)
	}
	info.SizeBytes = allocatedBytes(dir) + allocatedBytes(mem)
	if err := writeSnapshotInfo(dir, info); err != nil {
		return runtime.SnapshotInfo{}, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot record the snapshot of sandbox %s", id)
	}
	r.log.Debug("memory snapshot", "sandbox_id", id, "release", opts.Release, "size_bytes", info.SizeBytes, "took", time.Since(began))
	return info, nil
}

// checkpointRunning saves sandbox id's memory into mem and copies its disk image img (size
// bytes) to dst, of one instant, and leaves it running (resumed, its agent listening again).
func (r *Runtime) checkpointRunning(ctx context.Context, id, mem, img, dst string, size int64) error {
	defer r.relistenAfter(ctx, id)
	// The checkpoint first: saving flushes the sandbox's pending file writes to its disk.
	return r.copyFrozen(ctx, id, img, dst, size, func() error { return r.checkpoint(ctx, id, mem, true) })
}

// checkpointRelease saves sandbox id's memory into mem, which ends the sandbox, then moves its
// disk to dst and deletes the rest of it (releaseStopped). A checkpoint that fails leaves the
// sandbox running, its agent listening again; ended reports that the checkpoint ended it.
func (r *Runtime) checkpointRelease(ctx context.Context, id, mem, dst string) (ended bool, err error) {
	if err := r.checkpoint(ctx, id, mem, false); err != nil {
		if st, serr := r.State(context.WithoutCancel(ctx), id); serr == nil && st == runtime.StatusRunning {
			r.relistenAfter(ctx, id)
			return false, err
		}
		return true, err
	}
	// The checkpoint ends the sandbox: its init (runsc's sandbox process) exits once saved, and
	// the runtime's kill no longer reaches it. Wait for it (reaping it) and its gofer.
	if pid := readPid(filepath.Join(r.sandboxDir(id), "init.pid")); pid > 0 {
		deadline := time.Now().Add(stopTimeout)
		killed := false
		for !r.initGone(pid) {
			if time.Now().After(deadline) {
				if killed || !r.ownsProcess(pid, id) {
					return true, errcode.New(errcode.RuntimeUnavailable, "sandbox %s did not end after its checkpoint; retry", id)
				}
				_ = unix.Kill(pid, unix.SIGKILL)
				killed, deadline = true, time.Now().Add(stopTimeout)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	// From here on the memory image is the sandbox: a cancelled caller must not lose it half-way.
	ctx = context.WithoutCancel(ctx)
	r.reapHelpers(ctx, id)
	// The disk's loop device lets go once the mount namespace the sandbox's processes lived in
	// (their create's private one) is torn down, which the kernel finishes after they exit: on
	// a loaded host later than removeDisk waits. Retry while it is only that.
	for deadline := time.Now().Add(releaseTimeout); ; time.Sleep(50 * time.Millisecond) {
		moved, err := r.releaseStopped(ctx, id, dst)
		if err == nil || moved || time.Now().After(deadline) {
			return true, err
		}
		r.log.Debug("release after a checkpoint: retrying", "sandbox_id", id, "err", err)
	}
}

// releaseTimeout bounds the retries of a release after a checkpoint ended the sandbox.
const releaseTimeout = 20 * time.Second

// checkpoint runs the OCI runtime's checkpoint of sandbox id into mem.
func (r *Runtime) checkpoint(ctx context.Context, id, mem string, leaveRunning bool) error {
	args := []string{"checkpoint", "--image-path", mem}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	if r.flavor != FlavorGVisor {
		// CRIU: the agent's socket and the container's stdio are files of the host.
		args = append(args, "--ext-unix-sk", "--file-locks")
	}
	start := time.Now()
	_, err := r.commandFor(ctx, checkpointTimeout, append(args, id)...)
	r.log.Debug("checkpoint", "sandbox_id", id, "leave_running", leaveRunning, "took", time.Since(start), "err", err)
	if err != nil {
		r.log.Warn("checkpoint failed", "sandbox_id", id, "err", err)
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "%s could not save the memory of sandbox %s; the server log has the runtime's error", r.name, id)
	}
	return nil
}

// quiesceAgent asks sandbox id's agent to close its host sockets and waits until it has (its
// socket file is gone).
func (r *Runtime) quiesceAgent(ctx context.Context, id string) error {
	sock := r.SocketPath(id)
	// The marker says the agent may be deaf: a server killed before the relisten leaves it,
	// and Adopt wakes such an agent (relistenIfQuiesced).
	if err := os.WriteFile(filepath.Join(r.sandboxDir(id), quiescedMarker), nil, 0o600); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot mark sandbox %s quiesced", id)
	}
	if _, err := r.command(ctx, "kill", id, "USR1"); err != nil {
		return r.classify(err, "quiesce the agent of", id)
	}
	deadline := time.Now().Add(quiesceTimeout)
	for {
		if _, err := os.Lstat(sock); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return errcode.New(errcode.RuntimeUnavailable, "the agent of sandbox %s did not close its socket within %s of being asked to (before a memory snapshot); is it an agentbox agent of this version?", id, quiesceTimeout)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// relistenAgent asks sandbox id's agent to listen again and waits until it answers a dial.
func (r *Runtime) relistenAgent(ctx context.Context, id string) error {
	return r.relistenAgentAfter(ctx, id, 0)
}

// relistenAgentAfter is relistenAgent that first gives the agent grace to listen again on its
// own (after a restore, gVisor's checkpoint waiter wakes it: guest.SignalRelisten's comment),
// and signals it only if it has not answered by then.
func (r *Runtime) relistenAgentAfter(ctx context.Context, id string, grace time.Duration) error {
	signal := func() error {
		if _, err := r.command(ctx, "kill", id, "USR2"); err != nil {
			return r.classify(err, "wake the agent of", id)
		}
		return nil
	}
	signalled := grace <= 0
	if signalled {
		if err := signal(); err != nil {
			return err
		}
	}
	dial := r.dialer(id)
	start := time.Now()
	deadline := start.Add(grace + relistenTimeout)
	for {
		if !signalled && time.Since(start) >= grace {
			r.log.Debug("the agent did not listen again on its own after a restore; signalling it", "sandbox_id", id, "grace", grace)
			if err := signal(); err != nil {
				return err
			}
			signalled = true
		}
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := dial(dctx)
		cancel()
		if err == nil {
			_ = c.Close()
			_ = os.Remove(filepath.Join(r.sandboxDir(id), quiescedMarker))
			return nil
		}
		var ee *errcode.Error
		if errors.As(err, &ee) && ee.Code == errcode.SandboxNotRunning {
			return err // another process holds the socket
		}
		if time.Now().After(deadline) {
			return errcode.Wrap(errcode.RuntimeUnavailable, err, "the agent of sandbox %s did not listen again within %s of a checkpoint", id, relistenTimeout)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// relistenAfter is relistenAgent on a context that outlives the caller's (a cancelled snapshot
// must not leave the agent deaf); a failure is logged.
func (r *Runtime) relistenAfter(ctx context.Context, id string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), relistenTimeout+commandTimeout)
	defer cancel()
	if err := r.relistenAgent(rctx, id); err != nil {
		r.log.Error("the agent did not listen again after a memory snapshot", "sandbox_id", id, "err", err)
	}
}

// restoreMemory checks a create's Spec.Snapshot with Memory: this runtime takes memory
// snapshots, and src is one (its memory/ image and saved spec are there).
func (r *Runtime) restoreMemory(src *runtime.SnapshotSource) error {
	if !r.memoryCapable() {
		return errcode.New(errcode.UnsupportedOp, "runtime %s cannot restore memory from a snapshot: %s", r.name, r.memorySnapshotReason()).
			With("argument", "memory")
	}
	if src.Info.Kind != runtime.SnapshotFilesMemory {
		return errcode.New(errcode.InvalidArgument, "snapshot kind %q holds no memory; restore it without memory, or take a %q snapshot", src.Info.Kind, runtime.SnapshotFilesMemory).
			With("argument", "snapshot")
	}
	if fi, err := os.Stat(filepath.Join(src.Dir, memoryDirName, memorySpecName)); err != nil || !fi.Mode().IsRegular() {
		return errcode.New(errcode.InvalidArgument, "snapshot directory %s holds no memory image", src.Dir).With("argument", "snapshot")
	}
	return nil
}

// restoreVerb is the OCI runtime's verb and flags that start a sandbox from snapshot src's
// memory instead of `run --detach`. --background lets the sandbox run while its pages are still
// read in (the image is uncompressed); the restore holds the pages file open, so the snapshot's
// directory may be removed as soon as the sandbox runs (a wake's caller does).
func restoreVerb(src *runtime.SnapshotSource) []string {
	return []string{"restore", "--detach", "--background", "--image-path", filepath.Join(src.Dir, memoryDirName)}
}

// checkRestoreSpec refuses a memory restore whose limits differ from the saved sandbox's: the
// saved kernel was sized for them (memory_mb, cpu and pids are the saved ones or
// INVALID_ARGUMENT).
func checkRestoreSpec(src *runtime.SnapshotSource, s *specs.Spec) error {
	b, err := os.ReadFile(filepath.Join(src.Dir, memoryDirName, memorySpecName))
	if err != nil {
		return errcode.New(errcode.InvalidArgument, "snapshot directory %s holds no memory image", src.Dir).With("argument", "snapshot")
	}
	var saved specs.Spec
	if err := json.Unmarshal(b, &saved); err != nil {
		return errcode.Wrap(errcode.InvalidArgument, err, "the saved spec in snapshot %s is unreadable", src.Dir).With("argument", "snapshot")
	}
	got, want := limitsOf(s), limitsOf(&saved)
	if got != want {
		return errcode.New(errcode.InvalidArgument, "a memory restore needs the snapshotted sandbox's limits (memory %d bytes, cpu quota %d per %d µs, pids %d); the request asks for memory %d bytes, cpu quota %d per %d µs, pids %d",
			want.memory, want.quota, want.period, want.pids, got.memory, got.quota, got.period, got.pids).With("argument", "memory_mb")
	}
	return nil
}

type specLimits struct {
	memory, quota, pids int64
	period              uint64
}

func limitsOf(s *specs.Spec) specLimits {
	var l specLimits
	if s.Linux == nil || s.Linux.Resources == nil {
		return l
	}
	res := s.Linux.Resources
	if res.Memory != nil && res.Memory.Limit != nil {
		l.memory = *res.Memory.Limit
	}
	if res.CPU != nil {
		if res.CPU.Quota != nil {
			l.quota = *res.CPU.Quota
		}
		if res.CPU.Period != nil {
			l.period = *res.CPU.Period
		}
	}
	if res.Pids != nil && res.Pids.Limit != nil {
		l.pids = *res.Pids.Limit
	}
	return l
}

// quiescedMarker, in a sandbox's directory, is written before the agent is asked to let go of
// its socket and removed once it listens again.
const quiescedMarker = "quiesced"

// relistenIfQuiesced wakes sandbox id's agent if a memory snapshot may have left it deaf (its
// marker is there: the server died between the quiesce and the relisten).
func (r *Runtime) relistenIfQuiesced(ctx context.Context, id string) error {
	if _, err := os.Stat(filepath.Join(r.sandboxDir(id), quiescedMarker)); err != nil {
		return nil
	}
	r.log.Warn("the agent was left quiesced (a memory snapshot's server died); waking it", "sandbox_id", id)
	return r.relistenAgent(ctx, id)
}

// relistenGrace is how long a restore waits for its agent to listen again on its own before
// it sends guest.SignalRelisten.
const relistenGrace = 250 * time.Millisecond

// afterRestore waits for the restored sandbox's agent to listen again (it was quiesced when
// saved; on gVisor it does by itself as the restored kernel starts, meanwhile the caller
// recorded the sandbox's init, which the dial checks the socket's peer against; else it is
// signalled after relistenGrace).
func (r *Runtime) afterRestore(ctx context.Context, id string) error {
	return r.relistenAgentAfter(ctx, id, relistenGrace)
}

// syncTree fsyncs the regular files directly in dir, then dir.
func syncTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			if err := syncPath(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
