package microvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/microvm/vminit"
)

// Files snapshots of a VM: its data disk (the root's writable overlay, /workspace, the homes,
// the agent's job logs), taken consistent by the guest writing back its page cache (the agent's
// sync) and the VM pausing (QMP stop: the vCPUs stop and QEMU drains the disks' I/O) while the
// disk is copied. Memory is not saved (QEMU migration to a file is not wired): a sandbox made
// from the snapshot boots a fresh kernel and agent on the saved disk.

// snapshotDisk is the data disk's name in a snapshot's directory.
const snapshotDisk = "data.ext4"

// memorySnapshotReason is why a vm sandbox's snapshot holds no memory.
const memorySnapshotReason = "the vm runtime saves a VM's disk, not its memory (QEMU migration to a file is not wired)"

// Snapshot saves running sandbox id's disk into dir (runtime.Snapshotter).
func (r *Runtime) Snapshot(ctx context.Context, id, dir string, opts runtime.SnapshotOptions) (runtime.SnapshotInfo, error) {
	var info runtime.SnapshotInfo
	if err := r.checkID(id); err != nil {
		return info, err
	}
	if opts.Memory {
		return info, errcode.New(errcode.UnsupportedOp, "sandbox %s: %s; take a files snapshot (memory: false)", id, memorySnapshotReason)
	}
	if err := checkSnapshotDir(dir); err != nil {
		return info, err
	}
	unlock := r.lock(id)
	defer unlock()
	rec, err := r.readRecord(id)
	if err != nil {
		return info, err
	}
	if p, ok := r.readProc(id); !ok || !p.alive() {
		return info, errcode.New(errcode.SandboxNotRunning, "sandbox %s's VM is not running", id)
	}
	// 1. The guest writes back what its kernel holds in memory.
	dial, err := r.Agent(ctx, id)
	if err != nil {
		return info, err
	}
	gc := guest.NewClient(guest.Dialer(dial))
	err = gc.Sync(ctx)
	gc.Close()
	if err != nil {
		return info, fmt.Errorf("vm runtime: sync the guest's file systems: %w", err)
	}
	// 2. The VM pauses: nothing writes the disk while it is read.
	if _, err := r.qmpRun(ctx, id, map[string]any{"execute": "stop"}); err != nil {
		return info, fmt.Errorf("vm runtime: pause the VM: %w", err)
	}
	disk := filepath.Join(r.dir(id), "data.ext4")
	dst := filepath.Join(dir, snapshotDisk)
	if opts.Release {
		// 3. Sleep: the VM ends and its disk moves into the snapshot; the rest is deleted.
		if err := r.stop(ctx, id); err != nil {
			_, _ = r.qmpRun(context.WithoutCancel(ctx), id, map[string]any{"execute": "cont"}) // it runs on
			return info, err
		}
		if err := os.Rename(disk, dst); err != nil {
			return info, fmt.Errorf("vm runtime: move the disk into the snapshot: %w", err)
		}
		if err := r.deleteLocked(ctx, id); err != nil {
			return info, err
		}
	} else {
		// 3. Fork: the paused VM's disk is copied (sparse), then the VM goes on.
		err := copySparse(ctx, disk, dst)
		if _, cerr := r.qmpRun(context.WithoutCancel(ctx), id, map[string]any{"execute": "cont"}); cerr != nil && err == nil {
			err = fmt.Errorf("vm runtime: resume the VM after its snapshot: %w", cerr)
		}
		if err != nil {
			_ = os.Remove(dst)
			return info, err
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(dst, &st); err != nil {
		return info, err
	}
	info = runtime.SnapshotInfo{Kind: runtime.SnapshotFiles, SizeBytes: st.Blocks * 512, DiskMB: rec.DiskMB, IDMap: rec.IDMap}
	b, _ := json.Marshal(info)
	if err := writeAtomic(filepath.Join(dir, runtime.SnapshotInfoFile), b, 0o600); err != nil {
		return info, err
	}
	return info, nil
}

// checkSnapshotDir: a snapshot's dir is absolute, exists and is empty.
func checkSnapshotDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return errcode.New(errcode.InvalidArgument, "snapshot dir %q must be an absolute path", dir)
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return errcode.New(errcode.InvalidArgument, "snapshot dir %s does not exist", dir)
	}
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		return errcode.New(errcode.InvalidArgument, "snapshot dir %s is not empty", dir)
	}
	return nil
}

// checkSnapshotSource checks a create's snapshot: absolute, complete, of files, of the create's
// disk size (0 takes the snapshot's). It returns the disk size.
func checkSnapshotSource(src *runtime.SnapshotSource, diskMB int64) (int64, error) {
	if src.Memory {
		return 0, errcode.New(errcode.UnsupportedOp, "%s; create it from the snapshot's files (memory: false)", memorySnapshotReason)
	}
	if !filepath.IsAbs(src.Dir) {
		return 0, errcode.New(errcode.InvalidArgument, "snapshot dir %q must be an absolute path", src.Dir)
	}
	if src.Info.Kind != runtime.SnapshotFiles {
		return 0, errcode.New(errcode.InvalidArgument, "snapshot kind %q: the vm runtime makes sandboxes from %q snapshots", src.Info.Kind, runtime.SnapshotFiles)
	}
	if _, err := os.Stat(filepath.Join(src.Dir, runtime.SnapshotInfoFile)); err != nil {
		return 0, errcode.New(errcode.InvalidArgument, "snapshot dir %s holds no complete snapshot", src.Dir)
	}
	if _, err := os.Stat(filepath.Join(src.Dir, snapshotDisk)); err != nil {
		return 0, errcode.New(errcode.InvalidArgument, "snapshot dir %s holds no disk", src.Dir)
	}
	if diskMB != 0 && diskMB != src.Info.DiskMB {
		return 0, errcode.New(errcode.InvalidArgument, "disk_mb %d: a sandbox made from this snapshot has its disk of %d MiB", diskMB, src.Info.DiskMB)
	}
	return src.Info.DiskMB, nil
}

// diskFromSnapshot makes data, a sandbox's data disk, from snapshot src: a hard link to the
// snapshot's disk in place (a wake: the same sandbox, its config as saved), else a sparse copy
// whose VM config (stage's files, under .agentbox) is rewritten for the new sandbox.
func diskFromSnapshot(ctx context.Context, src *runtime.SnapshotSource, data, stage string) error {
	from := filepath.Join(src.Dir, snapshotDisk)
	if src.InPlace {
		return os.Link(from, data)
	}
	if err := copySparse(ctx, from, data); err != nil {
		return err
	}
	// debugfs rewrites the files in the copy without mounting it: its commands, one a line.
	var script strings.Builder
	script.WriteString("cd /" + filepath.Dir(vminit.ConfigPath) + "\n")
	writes := 0
	for _, name := range []string{vminit.ConfigPath, vminit.CABundleFile} {
		host := filepath.Join(stage, name)
		if _, err := os.Stat(host); err != nil {
			continue
		}
		// rm first: write does not replace (an rm of a file the disk lacks only complains).
		fmt.Fprintf(&script, "rm %s\nwrite %s %s\n", filepath.Base(name), host, filepath.Base(name))
		writes++
	}
	cmds := filepath.Join(stage, "debugfs.cmds")
	if err := os.WriteFile(cmds, []byte(script.String()), 0o600); err != nil {
		return err
	}
	// debugfs exits 0 whatever its commands did: each write that worked says so on stdout.
	out, err := exec.CommandContext(ctx, "debugfs", "-w", "-f", cmds, data).CombinedOutput()
	if err != nil || strings.Count(string(out), "Allocated inode:") != writes {
		return fmt.Errorf("vm runtime: write the VM's config into the copied disk: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copySparse copies file from to to, holes kept (cp --sparse=always).
func copySparse(ctx context.Context, from, to string) error {
	if out, err := exec.CommandContext(ctx, "cp", "--sparse=always", from, to).CombinedOutput(); err != nil {
		_ = os.Remove(to)
		return fmt.Errorf("vm runtime: copy the disk: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
