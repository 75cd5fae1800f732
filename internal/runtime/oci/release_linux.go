package oci

// Finishing a releasing snapshot (a sleep) whose caller died: the server was SIGKILLed while
// the runtime stopped (or checkpointed) the sandbox and moved its disk into the snapshot. The
// control plane, restarted, finds the sandbox recorded running with a sleep snapshot that has
// no snapshot.json. What the runtime left is one of:
//
//   - a checkpoint still in flight: `runsc checkpoint` is the server's child, and goes on
//     without it; the sentry ends the sandbox once saved (AwaitSave waits for both);
//   - the sandbox running (the kill came before the stop or checkpoint began, or the
//     checkpoint failed): nothing to finish, the sandbox runs on;
//   - the sandbox stopped, its disk still in its directory, or already moved into the
//     snapshot: FinishRelease moves it (releaseStopped, the order a sleep uses), writes the
//     snapshot's info and returns it. The disk was synced before the move (or is synced now,
//     with no writer left), so the snapshot is whole.
//
// Memory is never claimed: a checkpoint whose exit status nobody saw cannot be told from one
// that failed half-way (runsc writes no completion mark), so the finished snapshot is of kind
// files and its memory/ directory is deleted. The sandbox wakes with its disk; its processes
// are gone (the control plane settles its jobs unknown).

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// saveInFlight reports whether a checkpoint command of this runtime for sandbox id is running
// (the command line names this runtime's --root, the checkpoint verb and the id last).
func (r *Runtime) saveInFlight(id string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 2 && args[len(args)-1] == id && slices.Contains(args, "checkpoint") && slices.Contains(args, r.stateDir()) {
			return true
		}
	}
	return false
}

// AwaitSave waits (up to the checkpoint's own bound) for a checkpoint of sandbox id that a dead
// server started to end, and then for the sandbox it ended to be gone; with none in flight it
// returns at once.
func (r *Runtime) AwaitSave(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if !r.saveInFlight(id) {
		return nil
	}
	r.log.Warn("a checkpoint of the sandbox is still running (its server died during a sleep); waiting for it", "sandbox_id", id)
	deadline := time.Now().Add(checkpointTimeout)
	for r.saveInFlight(id) {
		if time.Now().After(deadline) {
			return errcode.New(errcode.RuntimeUnavailable, "a checkpoint of sandbox %s did not end within %s; retry", id, checkpointTimeout)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A checkpoint that saved ends the sandbox: its init exits right after.
	if pid := readPid(filepath.Join(r.sandboxDir(id), "init.pid")); pid > 0 && r.ownsProcess(pid, id) {
		for deadline := time.Now().Add(stopTimeout); !r.initGone(pid) && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// FinishRelease completes the releasing snapshot of stopped sandbox id into dir (which has no
// snapshot info) with m, the sandbox's id range: its disk is moved into dir if it is not there
// yet, the rest of the sandbox deleted, and the snapshot's info (kind files) written and
// returned. ok is false when there is no disk to finish with (dir and the sandbox hold none).
func (r *Runtime) FinishRelease(ctx context.Context, id, dir string, m runtime.IDMap) (info runtime.SnapshotInfo, ok bool, err error) {
	if err := checkID(id); err != nil {
		return info, false, err
	}
	if err := r.checkAvailable(); err != nil {
		return info, false, err
	}
	if st, err := r.State(ctx, id); err == nil && st == runtime.StatusRunning {
		return info, false, errcode.New(errcode.Conflict, "sandbox %s is running; only a stopped sandbox's release can be finished", id)
	}
	dst := filepath.Join(dir, diskImageName)
	var st unix.Stat_t
	if err := unix.Lstat(dst, &st); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return info, false, err
		}
		if err := unix.Lstat(filepath.Join(r.sandboxDir(id), diskImageName), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			return info, false, nil // no disk anywhere
		}
		if _, err := r.releaseStopped(ctx, id, dst); err != nil {
			return info, false, err
		}
		if err := unix.Lstat(dst, &st); err != nil {
			return info, false, fmt.Errorf("the released disk of sandbox %s: %w", id, err)
		}
	} else if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return info, false, nil
	} else if err := r.Delete(ctx, id); err != nil { // what the release had left to delete
		return info, false, err
	}
	if err := os.RemoveAll(filepath.Join(dir, memoryDirName)); err != nil {
		return info, false, err
	}
	if err := syncPath(dst); err != nil {
		return info, false, err
	}
	info = runtime.SnapshotInfo{Kind: runtime.SnapshotFiles, DiskMB: st.Size >> 20, IDMap: m, SizeBytes: allocatedBytes(dir)}
	if err := writeSnapshotInfo(dir, info); err != nil {
		return runtime.SnapshotInfo{}, false, err
	}
	r.log.Warn("finished the sleep snapshot of a sandbox whose server died during the sleep (files kept; memory, if it was being saved, not)", "sandbox_id", id, "dir", dir)
	return info, true, nil
}
