package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/text"
)

// Sleep and wake.
//
// Sleep saves a running sandbox into a sleep snapshot (runtime.Snapshotter with Release: the
// runtime stops it and deletes every host resource of it but the snapshot) and records it
// sleeping: it holds no memory, CPU or process, only its snapshot (disk) and its id range. Wake
// creates it again from the snapshot under the same id and id range (Spec.Snapshot InPlace: the
// snapshot's disk is hard-linked, the snapshot stays whole until the sandbox runs) and deletes
// the snapshot once it runs.
//
// Intent is written before every act, so a server killed at any point converges:
//
//	sleep: running, SleepSnapshot set (and its record, creating) → runtime saves and releases →
//	       snapshot record ready → sleeping (SleptAt)
//	wake:  sleeping → creating (admission of cpu and memory, SleepSnapshot still set) → runtime
//	       creates from the snapshot, agent answers → running → snapshot deleted, SleepSnapshot
//	       cleared
//
// What the control loop (Reconcile at start, Converge on every tick) does with a sandbox no
// call is working on:
//
//	running, SleepSnapshot set, container running → a sleep that never released (or a wake
//	    that ran but did not delete its snapshot): the snapshot is deleted, the sandbox runs on
//	running, SleepSnapshot set, container gone, snapshot complete (snapshot.json) → sleeping
//	running, SleepSnapshot set, a checkpoint of it still in flight (the dead server's child)
//	    → waited for, then as below
//	running, SleepSnapshot set, container gone, no complete snapshot, its disk whole (moved
//	    into the snapshot, or still in the runtime's directory) → the runtime finishes the
//	    snapshot with the disk (kind files: a memory image whose save nobody saw end is not
//	    trusted) → sleeping, its jobs settled unknown
//	running, SleepSnapshot set, container gone, no complete snapshot, no disk → lost (the
//	    partial snapshot is deleted)
//	creating, SleepSnapshot set (a wake interrupted, or past its deadline) → the runtime's
//	    leftovers deleted (the snapshot's disk is a hard link: the snapshot stays whole) →
//	    sleeping again
//	sleeping, snapshot incomplete or gone → lost
//	sleeping, ttl_while_sleeping and expired → stopping → destroyed (snapshot deleted, id
//	    range freed)
//
// TTL: by default the time a sandbox sleeps does not count (its expiry moves on by the time
// slept when it wakes, and a sleeping sandbox never expires); with ttl_while_sleeping the TTL
// runs on while it sleeps and an expired sleeping sandbox is destroyed.

// Bounds of sleep and wake.
const (
	// sleepTimeout bounds one sleep (saving memory may take a while).
	sleepTimeout = 5 * time.Minute
)

// WakeAdmitter is the part of a Store that admits a wake in one transaction with the count of
// what the node's live sandboxes hold.
type WakeAdmitter interface {
	// AdmitWake writes sb's state, updated_at and version (sb.Version-1 must be stored, else
	// CONFLICT) and appends ev if sb's cpu and memory_mb, added to what the other live
	// sandboxes of sb.Node hold, fit a's CPU and MemoryMB; else it writes nothing and returns
	// an *OverCapacityError.
	AdmitWake(ctx context.Context, sb Sandbox, ev Event, a Admission) error
}

// sleepingErr is what a call that needs a running sandbox gets from a sleeping one without
// auto_wake.
func sleepingErr(id string) error {
	return errcode.New(errcode.SandboxNotRunning, "sandbox %s is sleeping; wake it (%s) and retry (a sandbox created with auto_wake wakes on its first call)", id, WakeHow(id)).
		With("state", string(StateSleeping))
}

type noAutoWakeKey struct{}

// WithoutAutoWake returns ctx marked so that the service's calls on it never wake a sleeping
// sandbox, auto_wake or not (a watch stream polling a job's log must not keep it awake).
func WithoutAutoWake(ctx context.Context) context.Context {
	return context.WithValue(ctx, noAutoWakeKey{}, true)
}

func autoWakeAllowed(ctx context.Context) bool { return ctx.Value(noAutoWakeKey{}) == nil }

// wakeForCall readies sandbox id for a call that needs it running and checks its state under
// its own lock (expose, network changes): a sleeping sandbox with auto_wake is woken; one
// without is SANDBOX_NOT_RUNNING saying to wake it. Other states are the call's to judge.
func (s *Service) wakeForCall(ctx context.Context, id string) error {
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil || sb.State != StateSleeping {
		return err
	}
	if !sb.AutoWake || !autoWakeAllowed(ctx) {
		return sleepingErr(id)
	}
	_, err = s.Wake(ctx, id)
	return err
}

// sleepDir is the directory of sleep snapshot snapID.
func (s *Service) sleepDir(snapID string) string { return s.snapshotDir(snapID) }

// snapshotDir is the directory of snapshot id (of any purpose): Config.SnapshotDir/<id>, 0700,
// which the runtime fills.
func (s *Service) snapshotDir(id string) string { return filepath.Join(s.cfg.SnapshotDir, id) }

// snapshotter returns sb's runtime as a Snapshotter, or UNSUPPORTED_OPERATION naming it.
func (s *Service) snapshotter(sb Sandbox, op string) (runtime.Runtime, runtime.Snapshotter, error) {
	rt, err := s.runtimeOf(sb)
	if err != nil {
		return nil, nil, err
	}
	sn, ok := rt.(runtime.Snapshotter)
	if !ok || !slices.Contains(rt.Capabilities().Snapshots, runtime.SnapshotFiles) {
		return nil, nil, errcode.New(errcode.UnsupportedOp, "runtime %s cannot save a sandbox (it takes no snapshots), so sandbox %s cannot %s", sb.Runtime, sb.ID, op).
			With("runtime", sb.Runtime)
	}
	if s.cfg.SnapshotDir == "" {
		return nil, nil, errcode.New(errcode.UnsupportedOp, "this server has no snapshot directory, so sandbox %s cannot %s", sb.ID, op)
	}
	return rt, sn, nil
}

// readSnapshotInfo reads a complete snapshot's info (runtime.SnapshotInfoFile); ok is false
// when dir holds no complete snapshot.
func readSnapshotInfo(dir string) (info runtime.SnapshotInfo, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, runtime.SnapshotInfoFile))
	if errors.Is(err, os.ErrNotExist) {
		return info, false, nil
	}
	if err != nil {
		return info, false, err
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, false, fmt.Errorf("snapshot %s: %s: %w", filepath.Base(dir), runtime.SnapshotInfoFile, err)
	}
	return info, true, nil
}

// Sleep saves running sandbox id and releases its memory, CPU and processes; it returns the
// record, state sleeping. A sleeping sandbox is returned as it is. The runtime saves memory and
// processes where it can (Capabilities.Snapshots lists files+memory), else files only: then
// the sandbox's processes end, and its running jobs are settled unknown.
func (s *Service) Sleep(ctx context.Context, id string) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	// From here on nothing depends on the caller staying.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sleepTimeout)
	defer cancel()
	unlock := s.lock(id)
	defer unlock()
	sb, err := s.store.GetSandbox(wctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	switch sb.State {
	case StateSleeping:
		return sb, nil
	case StateRunning:
	default:
		return sb, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a running sandbox can sleep", id, sb.State).With("state", string(sb.State))
	}
	return s.sleep(wctx, sb, "sleep requested")
}

// sleep is Sleep of running sb; the caller holds its lock. why begins the sleep's event.
func (s *Service) sleep(wctx context.Context, sb Sandbox, why string) (Sandbox, error) {
	id := sb.ID
	rt, sn, err := s.snapshotter(sb, "sleep")
	if err != nil {
		return sb, err
	}
	memory := slices.Contains(rt.Capabilities().Snapshots, runtime.SnapshotFilesMemory)
	kind := runtime.SnapshotFiles
	if memory {
		kind = runtime.SnapshotFilesMemory
	}
	// A sleep that cannot be written whole would end with the sandbox stopped and nothing
	// saved: refuse it while the sandbox still runs.
	if err := s.checkSleepRoom(sb, memory); err != nil {
		return sb, err
	}

	// 1. Intent: the sandbox names its sleep snapshot, the record says creating.
	snapID := NewSnapshotID()
	now := s.stamp()
	sb.SleepSnapshot, sb.UpdatedAt = snapID, now
	sb.Version++
	ev := Event{SandboxID: id, Type: "sleep", From: StateRunning, To: StateRunning, At: now,
		Reason: why + ": saving " + kind + " to snapshot " + snapID}
	if err := s.store.UpdateSandbox(wctx, sb, ev); err != nil {
		return sb, fmt.Errorf("sleep %s: %w", id, err)
	}
	s.bus.publish()
	rec := Snapshot{ID: snapID, SandboxID: id, State: SnapshotCreating, Kind: kind, Purpose: SnapshotPurposeSleep,
		Runtime: sb.Runtime, Image: sb.Image, ImageDigest: sb.ImageDigest, CPU: sb.CPU, MemoryMB: sb.MemoryMB,
		DiskMB: sb.DiskMB, Node: sb.Node, CreatedAt: now, Version: 1}
	if sb.Network.Policy != nil {
		n := sb.Network
		rec.Network = &n
	}
	if err := s.store.CreateSnapshot(wctx, rec); err != nil {
		return s.sleepFailed(wctx, sb, rt, fmt.Errorf("record snapshot %s: %w", snapID, err))
	}
	dir := s.sleepDir(snapID)
	if err := os.MkdirAll(s.cfg.SnapshotDir, 0o700); err != nil {
		return s.sleepFailed(wctx, sb, rt, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return s.sleepFailed(wctx, sb, rt, err)
	}

	// 2. The runtime saves and releases. The agent's client and the network session end
	// first; the exit watch sees the sandbox sleeping when its init exits and leaves it.
	s.dropGuest(id)
	began := time.Now()
	info, err := sn.Snapshot(wctx, id, dir, runtime.SnapshotOptions{Memory: memory, Release: true})
	if err != nil {
		return s.sleepFailed(wctx, sb, rt, err)
	}
	s.log.Info("sandbox saved for sleep", "sandbox_id", id, "snapshot_id", snapID, "kind", info.Kind,
		"size_bytes", info.SizeBytes, "took", time.Since(began))

	// 3. The snapshot is complete: its record is ready, the sandbox sleeps.
	return s.finishSleep(wctx, sb, info, "sleep: "+info.Kind+" saved to snapshot "+snapID)
}

// sleepHeadroom is what a sleep needs free on the snapshot dir's file system besides its
// memory image: the snapshot's description, the store's records, what the disk's move writes.
const sleepHeadroom = 32 << 20

// checkSleepRoom refuses (RESOURCE_EXHAUSTED) a sleep of sb whose snapshot would not fit on
// the snapshot dir's file system: its memory (when memory is saved) and sleepHeadroom.
func (s *Service) checkSleepRoom(sb Sandbox, memory bool) error {
	dir := s.cfg.SnapshotDir
	for dir != "" && dir != "/" {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		dir = filepath.Dir(dir)
	}
	free, err := freeBytes(dir)
	if err != nil {
		return nil // not known here: the sleep finds out
	}
	need := int64(sleepHeadroom)
	if memory {
		need += sb.MemoryMB << 20
	}
	if free >= need {
		return nil
	}
	return errcode.New(errcode.ResourceExhausted, "sandbox %s cannot sleep: the state dir's file system (%s) has %d MiB free and its snapshot needs about %d MiB; free %d MiB there and retry (the sandbox runs on)",
		sb.ID, dir, free>>20, (need+1<<20-1)>>20, (need-free+1<<20-1)>>20).
		With("path", dir).With("need_bytes", need).With("free_bytes", free).With("state", string(StateRunning))
}

// finishSleep records running sb, whose sleep snapshot is complete (info), as sleeping, and
// settles its jobs.
func (s *Service) finishSleep(ctx context.Context, sb Sandbox, info runtime.SnapshotInfo, reason string) (Sandbox, error) {
	if rec, err := s.store.GetSnapshot(ctx, sb.SleepSnapshot); err == nil {
		rec.State, rec.Kind, rec.SizeBytes, rec.IDBase = SnapshotReady, info.Kind, info.SizeBytes, int64(info.IDMap.UIDBase)
		rec.Version++
		if err := s.store.UpdateSnapshot(ctx, rec); err != nil {
			s.log.Warn("record sleep snapshot ready", "snapshot_id", rec.ID, "err", err)
		}
	}
	sb.SleptAt = s.stamp()
	sb.Handle = ""
	sb.Error = ""
	out, err := s.transition(ctx, sb, StateSleeping, reason, "")
	if err != nil {
		return out, err
	}
	s.hooks.slept(ctx, out, info.Kind == runtime.SnapshotFilesMemory) // its jobs settled
	return out, nil
}

// sleepFailed undoes a sleep that failed (cause): the snapshot's directory and record are
// deleted and the sandbox runs on, or is recorded lost if the failure stopped it.
func (s *Service) sleepFailed(ctx context.Context, sb Sandbox, rt runtime.Runtime, cause error) (Sandbox, error) {
	s.log.Warn("sleep failed", "sandbox_id", sb.ID, "snapshot_id", sb.SleepSnapshot, "err", cause)
	if err := s.deleteSleepSnapshot(ctx, sb.SleepSnapshot); err != nil {
		s.log.Warn("delete a failed sleep's snapshot (the control loop retries)", "sandbox_id", sb.ID, "err", err)
		return sb, s.sleepErr(sb, cause)
	}
	st, serr := rt.State(ctx, sb.ID)
	sb.SleepSnapshot = ""
	if serr == nil && st != runtime.StatusRunning {
		out, err := s.transition(ctx, sb, StateLost, "sleep failed and stopped the sandbox: "+text.Truncate(errcode.Message(cause), 512), "the sandbox stopped while it was being put to sleep")
		if err != nil {
			return out, err
		}
		return out, errcode.Wrap(errcode.SandboxNotRunning, cause, "sandbox %s could not sleep and stopped: %s", sb.ID, errcode.Message(cause)).With("state", string(StateLost))
	}
	sb.UpdatedAt = s.stamp()
	sb.Version++
	ev := Event{SandboxID: sb.ID, Type: "sleep", From: StateRunning, To: StateRunning, At: sb.UpdatedAt,
		Reason: text.Truncate("sleep failed; the sandbox runs on: "+errcode.Message(cause), 1024)}
	if err := s.store.UpdateSandbox(ctx, sb, ev); err != nil {
		s.log.Warn("record failed sleep (the control loop settles it)", "sandbox_id", sb.ID, "err", err)
	} else {
		s.bus.publish()
	}
	s.hooks.resumed(ctx, sb, rt) // its network session, reopened in the background
	return sb, s.sleepErr(sb, cause)
}

func (s *Service) sleepErr(sb Sandbox, cause error) error {
	if errcode.Of(cause) == errcode.UnsupportedOp {
		return cause
	}
	if errors.Is(cause, syscall.ENOSPC) {
		return errcode.Wrap(errcode.ResourceExhausted, cause, "sandbox %s could not sleep: the state dir's file system is full; free space there and retry (it runs on)", sb.ID).
			With("path", s.cfg.SnapshotDir).With("state", string(StateRunning))
	}
	return errcode.Wrap(errcode.RuntimeUnavailable, cause, "sandbox %s could not sleep: %s; it runs on", sb.ID, errcode.Message(cause))
}

// deleteSleepSnapshot deletes a sleep snapshot's directory, then its record.
func (s *Service) deleteSleepSnapshot(ctx context.Context, snapID string) error {
	if snapID == "" {
		return nil
	}
	if err := os.RemoveAll(s.sleepDir(snapID)); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", snapID, err)
	}
	if err := s.store.DeleteSnapshot(ctx, snapID); err != nil && errcode.Of(err) != errcode.SnapshotNotFound {
		return fmt.Errorf("delete snapshot record %s: %w", snapID, err)
	}
	return nil
}

// Wake restores sleeping sandbox id under its id and returns it running, its agent answering.
// A running sandbox is returned as it is. A wake the budgets cannot take is CAPACITY_UNAVAILABLE
// and the sandbox sleeps on; so does one whose runtime fails (RUNTIME_UNAVAILABLE): its
// snapshot is intact.
func (s *Service) Wake(ctx context.Context, id string) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ReadyTimeout+sleepTimeout)
	defer cancel()
	unlock := s.lock(id)
	defer unlock()
	sb, err := s.store.GetSandbox(wctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	switch sb.State {
	case StateRunning:
		return sb, nil
	case StateSleeping:
	default:
		return sb, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a sleeping sandbox can be woken", id, sb.State).With("state", string(sb.State))
	}
	return s.wake(wctx, sb)
}

// wake is Wake of sleeping sb; the caller holds its lock.
func (s *Service) wake(ctx context.Context, sb Sandbox) (Sandbox, error) {
	id := sb.ID
	if sb.TTLWhileSleeping && !sb.ExpiresAt.After(s.now()) {
		return sb, errcode.New(errcode.SandboxNotRunning, "sandbox %s's TTL ran out at %s while it slept (ttl_while_sleeping); it is being destroyed", id, sb.ExpiresAt.UTC().Format(time.RFC3339)).
			With("state", string(sb.State))
	}
	rt, _, err := s.snapshotter(sb, "wake")
	if err != nil {
		return sb, err
	}
	dir := s.sleepDir(sb.SleepSnapshot)
	info, ok, err := readSnapshotInfo(dir)
	if err != nil {
		return sb, errcode.Wrap(errcode.RuntimeUnavailable, err, "sandbox %s: its sleep snapshot %s is unreadable", id, sb.SleepSnapshot)
	}
	if sb.SleepSnapshot == "" || !ok {
		out, terr := s.transition(ctx, sb, StateLost, "wake: its sleep snapshot "+sb.SleepSnapshot+" is gone", "the sandbox's sleep snapshot was gone when it was woken")
		if terr != nil {
			return out, terr
		}
		return out, errcode.New(errcode.SandboxNotRunning, "sandbox %s cannot be woken: its sleep snapshot is gone; create a new sandbox", id).With("state", string(StateLost))
	}
	if err := s.local.checkHeadroom(ctx); err != nil {
		return sb, err
	}
	var idmap runtime.IDMap
	if rt.Capabilities().TakesIDRange() {
		if idmap, err = s.idMapOf(ctx, id); err != nil {
			return sb, err
		}
	}
	var pinned *pinnedImage
	if sb.Image != "" && sb.Image != image.Host {
		ref := sb.Image
		if sb.ImageDigest != "" {
			ref = digestRef(ref, sb.ImageDigest) // the image it slept on, wherever its tag moved since
		}
		if pinned, err = s.resolveImage(ctx, ref); err != nil {
			return sb, err
		}
		defer pinned.release()
		if sb.ImageDigest != "" && pinned.img.Digest != sb.ImageDigest {
			return sb, errcode.New(errcode.RuntimeUnavailable, "sandbox %s cannot be woken: its image %q resolves to %s, not the %s it was created from", id, text.Truncate(sb.Image, 128), pinned.img.Digest, sb.ImageDigest)
		}
	}

	// 1. Intent and admission: the sandbox leaves sleeping for creating if cpu and memory fit.
	slept := sb
	sb.State, sb.UpdatedAt = StateCreating, s.stamp()
	sb.Version++
	ev := Event{SandboxID: id, Type: "state", From: StateSleeping, To: StateCreating, At: sb.UpdatedAt,
		Reason: "wake requested: restoring " + info.Kind + " from snapshot " + slept.SleepSnapshot}
	if err := s.admitWake(ctx, sb, ev); err != nil {
		return slept, err
	}
	s.bus.publish()

	// 2. The runtime creates it from the snapshot, in place, and its agent answers.
	src := &runtime.SnapshotSource{Dir: dir, Info: info, Memory: info.Kind == runtime.SnapshotFilesMemory, InPlace: true}
	began := time.Now()
	handle, _, err := s.bringUp(ctx, rt, sb, idmap, pinned, src)
	if err != nil {
		s.log.Warn("wake failed", "sandbox_id", id, "err", err)
		out, aerr := s.backToSleep(ctx, sb, rt, "wake failed: "+text.Truncate(errcode.Message(err), 512))
		if aerr != nil {
			s.log.Error("return a failed wake to sleep (the control loop retries)", "sandbox_id", id, "err", aerr)
		}
		if errcode.Of(err) == errcode.Internal {
			err = errcode.Wrap(errcode.RuntimeUnavailable, err, "sandbox %s could not be woken by runtime %s; it sleeps on with its snapshot intact; see the server log", id, sb.Runtime)
		}
		return out, err
	}

	// 3. Running: the TTL moves on by the time slept, unless it ran on during the sleep; a
	// sandbox that slept at its expiry (on_expiry sleep) has its TTL again.
	now := s.stamp()
	sleptFor := now.Sub(slept.SleptAt)
	if slept.OnExpiry == OnExpirySleep && !slept.ExpiresAt.After(slept.SleptAt) && slept.TTLSeconds > 0 {
		sb.ExpiresAt = now.Add(min(time.Duration(slept.TTLSeconds)*time.Second, s.cfg.MaxTTL))
	} else if !slept.TTLWhileSleeping && !slept.SleptAt.IsZero() && sleptFor > 0 {
		sb.ExpiresAt = sb.ExpiresAt.Add(sleptFor)
		if limit := now.Add(s.cfg.MaxTTL); sb.ExpiresAt.After(limit) {
			sb.ExpiresAt = limit
		}
	}
	sb.Handle, sb.SleptAt = string(handle), time.Time{}
	out, err := s.transition(ctx, sb, StateRunning, fmt.Sprintf("wake: %s restored from snapshot %s after sleeping %s", info.Kind, slept.SleepSnapshot, sleptFor.Round(time.Second)), "")
	if err != nil {
		s.dropGuest(id)
		return out, err
	}
	s.log.Info("sandbox woken", "sandbox_id", id, "kind", info.Kind, "took", time.Since(began))
	s.watch(rt, id)
	s.hooks.woken(ctx, out) // its jobs' watches re-armed, its network session opened

	// 4. The snapshot's work is done: delete it, then forget it.
	return s.dropSleepSnapshot(ctx, out), nil
}

// dropSleepSnapshot deletes running sb's sleep snapshot and clears SleepSnapshot; a failure
// leaves both to the control loop.
func (s *Service) dropSleepSnapshot(ctx context.Context, sb Sandbox) Sandbox {
	if err := s.deleteSleepSnapshot(ctx, sb.SleepSnapshot); err != nil {
		s.log.Warn("delete a woken sandbox's sleep snapshot (the control loop retries)", "sandbox_id", sb.ID, "err", err)
		return sb
	}
	snap := sb.SleepSnapshot
	sb.SleepSnapshot, sb.UpdatedAt = "", s.stamp()
	sb.Version++
	ev := Event{SandboxID: sb.ID, Type: "wake", From: sb.State, To: sb.State, At: sb.UpdatedAt, Reason: "sleep snapshot " + snap + " deleted"}
	if err := s.store.UpdateSandbox(ctx, sb, ev); err != nil {
		s.log.Warn("record a woken sandbox's snapshot deleted (the control loop retries)", "sandbox_id", sb.ID, "err", err)
		sb.SleepSnapshot = snap
		sb.Version--
		return sb
	}
	s.bus.publish()
	return sb
}

// admitWake writes the wake's intent behind the cpu and memory budgets, the count and the
// write in one transaction (Store.AdmitWake), so that no two wakes or creates overshoot.
func (s *Service) admitWake(ctx context.Context, sb Sandbox, ev Event) error {
	err := s.store.AdmitWake(ctx, sb, ev, s.local.admission)
	var over *OverCapacityError
	if errors.As(err, &over) {
		e := overCapacity(over)
		return errcode.Wrap(errcode.CapacityUnavailable, e, "sandbox %s cannot be woken now: %s; it sleeps on — retry the wake later, or destroy other sandboxes", sb.ID, errcode.Message(e)).
			With("state", string(StateSleeping)).With("resource", over.Resource)
	}
	if err != nil {
		return fmt.Errorf("wake %s: %w", sb.ID, err)
	}
	return nil
}

// backToSleep deletes what a wake of sb (creating, SleepSnapshot set) left on the host and
// records it sleeping again; the snapshot is whole (the wake used its disk in place).
func (s *Service) backToSleep(ctx context.Context, sb Sandbox, rt runtime.Runtime, reason string) (Sandbox, error) {
	s.dropGuest(sb.ID)
	if err := rt.Delete(ctx, sb.ID); err != nil {
		return sb, fmt.Errorf("delete a failed wake's leftovers: %w", err)
	}
	if _, ok, err := readSnapshotInfo(s.sleepDir(sb.SleepSnapshot)); err == nil && !ok {
		return s.transition(ctx, sb, StateLost, reason+"; its sleep snapshot is gone", "the sandbox's sleep snapshot was gone after a failed wake")
	}
	return s.transition(ctx, sb, StateSleeping, reason+"; it sleeps on", "")
}

// releaseFinisher is the optional part of a runtime that finishes a releasing snapshot (a
// sleep) its server died in the middle of (internal/runtime/oci implements it).
type releaseFinisher interface {
	// AwaitSave waits for a save of sandbox id still in flight (a checkpoint command the dead
	// server started) and the end of the sandbox it stops.
	AwaitSave(ctx context.Context, id string) error
	// FinishRelease completes the release of stopped sandbox id into dir, which holds no
	// snapshot info, with m, its id range: its disk is moved in if it is not there yet, the
	// rest of the sandbox deleted, and the info (kind files: memory is never claimed) written
	// and returned. ok is false when there is no disk to finish with.
	FinishRelease(ctx context.Context, id, dir string, m runtime.IDMap) (info runtime.SnapshotInfo, ok bool, err error)
}

// idMapOf returns the id range sandbox id holds.
func (s *Service) idMapOf(ctx context.Context, id string) (runtime.IDMap, error) {
	held, err := s.store.ListIDRanges(ctx)
	if err != nil {
		return runtime.IDMap{}, fmt.Errorf("list id ranges: %w", err)
	}
	for _, r := range held {
		if r.SandboxID == id {
			return runtime.IDMap{UIDBase: uint32(r.Base), GIDBase: uint32(r.Base), Count: uint32(r.Count)}, nil
		}
	}
	return runtime.IDMap{}, errcode.New(errcode.RuntimeUnavailable, "sandbox %s holds no host id range, so it cannot be woken with its files' owners", id)
}

// settleSleep settles running sb whose SleepSnapshot is set and on which no call is working
// (the control loop; the caller holds its lock): a sleep or wake the server did not finish.
func (s *Service) settleSleep(ctx context.Context, sb Sandbox) (Sandbox, error) {
	rt, err := s.runtimeOf(sb)
	if err != nil {
		return sb, err
	}
	fin, canFinish := rt.(releaseFinisher)
	if canFinish {
		// A checkpoint the dead server started goes on without it, and ends the sandbox.
		if err := fin.AwaitSave(ctx, sb.ID); err != nil {
			return sb, err
		}
	}
	st, err := rt.State(ctx, sb.ID)
	if err != nil {
		return sb, fmt.Errorf("read state: %w", err)
	}
	if st == runtime.StatusRunning {
		// A sleep that never released, or a wake that did not delete its snapshot.
		return s.dropSleepSnapshot(ctx, sb), nil
	}
	dir := s.sleepDir(sb.SleepSnapshot)
	info, ok, err := readSnapshotInfo(dir)
	if err != nil {
		return sb, err
	}
	if ok {
		if err := rt.Delete(ctx, sb.ID); err != nil {
			return sb, fmt.Errorf("delete a released sandbox's leftovers: %w", err)
		}
		s.dropGuest(sb.ID)
		return s.finishSleep(ctx, sb, info, "sleep finished by the control loop: snapshot "+sb.SleepSnapshot+" was complete")
	}
	if canFinish {
		// The sandbox stopped and its disk is whole (in the snapshot, or still in the
		// runtime's directory): the sleep is finished with its files.
		var idmap runtime.IDMap
		if rt.Capabilities().TakesIDRange() {
			if idmap, err = s.idMapOf(ctx, sb.ID); err != nil {
				return sb, err
			}
		}
		info, done, err := fin.FinishRelease(ctx, sb.ID, dir, idmap)
		if err != nil {
			return sb, fmt.Errorf("finish an interrupted sleep: %w", err)
		}
		if done {
			s.dropGuest(sb.ID)
			return s.finishSleep(ctx, sb, info, "sleep finished by the control loop after the server stopped during it: files saved to snapshot "+sb.SleepSnapshot+
				" (memory, if it was being saved, is not kept: its image could not be verified)")
		}
	}
	if err := s.deleteSleepSnapshot(ctx, sb.SleepSnapshot); err != nil {
		return sb, err
	}
	s.dropGuest(sb.ID)
	sb.SleepSnapshot = ""
	return s.transition(ctx, sb, StateLost, "the server stopped during a sleep before its snapshot was complete",
		"the sandbox stopped while it was being put to sleep, before its snapshot was complete")
}

// checkSleeping settles sleeping sb at start: a sandbox whose snapshot is incomplete or gone is
// lost; runtime leftovers of it (a release the server did not see finish) are deleted.
func (s *Service) checkSleeping(ctx context.Context, sb Sandbox) (Sandbox, error) {
	_, ok, err := readSnapshotInfo(s.sleepDir(sb.SleepSnapshot))
	if err != nil {
		return sb, err
	}
	if sb.SleepSnapshot == "" || !ok {
		return s.transition(ctx, sb, StateLost, "reconcile: its sleep snapshot "+sb.SleepSnapshot+" is gone", "the sandbox's sleep snapshot was gone when the server started")
	}
	rt, err := s.runtimeOf(sb)
	if err != nil {
		return sb, err
	}
	if err := rt.Delete(ctx, sb.ID); err != nil {
		return sb, fmt.Errorf("delete a sleeping sandbox's runtime leftovers: %w", err)
	}
	return sb, nil
}

// WakeHow names the wake call on every surface, for an error that tells a caller to wake id.
func WakeHow(id string) string {
	return fmt.Sprintf("sandbox_wake; CLI agentbox wake %s; REST POST /v1/sandboxes/%s/wake", id, id)
}
