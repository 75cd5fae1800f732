// Package snapshots is the snapshots feature over the sandbox lifecycle core: sandbox_snapshot,
// snapshot_list, snapshot_delete, sandbox_fork, sandbox_diff, create from a snapshot, and the
// changes and checkpoint of an exec (/v1/sandboxes/{id}/snapshot, /v1/snapshots, fork, diff).
// It reaches the core through its sandbox.Core handle; the core calls it only through the hooks
// it registers (Converge and Sweep finish what a crash left, Exec serves an exec's extras, and
// the create hook prepares a create from a snapshot).
//
// A snapshot is a record (sandbox.SnapshotStore) and a directory, Config.SnapshotDir/<snapshot
// id> (0700), that the runtime (runtime.Snapshotter) fills. The record is written, state
// creating, before the directory is made and the runtime acts; it becomes ready once the
// runtime has written snapshot.json, or failed (its directory removed). Deleting one records
// deleting, removes the directory, then removes the record. A crash at any point is finished by
// the control loop (converge) and the sweep (sweep).
//
// User snapshots (sandbox_snapshot, fork) are held under Config.SnapshotBudgetBytes: before a
// new one becomes ready the oldest ready ones not in use are retired until it fits, and one
// larger than the whole budget is refused. Sleep snapshots are the sleeping sandbox's (the
// core's sleep and wake take and restore them) and are never retired, listed or converged
// here, except that a delete of one left half-done is finished and an orphaned directory swept.
package snapshots

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/faultpoint"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxid"
	"github.com/agentbox/agentbox/internal/text"
)

// Store is what snapshots keep of durable state (sandbox.Store includes it).
type Store interface {
	sandbox.SnapshotStore
	GetSandbox(ctx context.Context, id string) (sandbox.Sandbox, error)
}

// Service takes, lists, deletes, forks from and diffs snapshots. It is safe for concurrent use.
// Create exactly one per core (New does): it registers the hooks that finish what crashes left
// and keeps the pins that hold a snapshot while a create or fork reads it.
type Service struct {
	core  *sandbox.Core
	store Store
	cfg   sandbox.Config
	log   *slog.Logger
	state snapState // snapshots being taken and in use
	diffs diffGate  // bounds the file walks of diffs and exec changes (diff.go)
}

// New returns core's snapshots feature (built, with its records in st, on the first call; the
// same one after) and so registers its hooks once: converge and sweep snapshots, serve an
// exec's changes and checkpoint, prepare a create from a snapshot (the create stages' Request).
func New(core *sandbox.Core, st Store) *Service {
	return core.Feature(featureKey{}, func() any { return newService(core, st) }).(*Service)
}

// featureKey keeps the core's one snapshots feature (sandbox.Core.Feature).
type featureKey struct{}

func newService(core *sandbox.Core, st Store) *Service {
	s := &Service{core: core, store: st, cfg: core.Config(), log: core.Log()}
	core.Register(sandbox.Hooks{Name: "snapshots",
		Converge: s.converge,
		Sweep:    s.sweep,
		Exec:     s.exec,
		Request:  s.request,
	})
	return s
}

// DefaultSnapshotBudgetBytes is the default snapshot budget (Config.SnapshotBudgetBytes): 10 GiB.
const DefaultSnapshotBudgetBytes = 10 << 30

// snapshotTimeout bounds one snapshot's runtime work once its record is written.
const snapshotTimeout = 10 * time.Minute

// forkParallel bounds how many of a fork's sandboxes are created at once.
const forkParallel = 4

// snapState is what this process knows of snapshots beyond their records.
type snapState struct {
	mu sync.Mutex
	// inflight are the snapshots this process is taking (their records may say creating).
	inflight map[string]bool
	// pins counts the creates and forks in flight that read each snapshot: it is neither
	// retired nor deleted meanwhile.
	pins map[string]int
	// budget serialises making room under the budget with marking a snapshot ready.
	budget sync.Mutex
}

func (p *snapState) begin(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inflight == nil {
		p.inflight = map[string]bool{}
	}
	p.inflight[id] = true
}

func (p *snapState) end(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.inflight, id)
}

func (p *snapState) taking(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight[id]
}

func (p *snapState) pin(id string) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pins == nil {
		p.pins = map[string]int{}
	}
	p.pins[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.pins[id]--; p.pins[id] <= 0 {
				delete(p.pins, id)
			}
		})
	}
}

func (p *snapState) pinned(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pins[id] > 0
}

func (s *Service) snapshotStore() (sandbox.SnapshotStore, error) {
	if s.cfg.SnapshotDir == "" {
		return nil, errcode.New(errcode.UnsupportedOp, "this server keeps no snapshots (it has no snapshot directory)")
	}
	return s.store, nil
}

// snapshotDir is snapshot id's directory (the core's: sleep snapshots share it).
func (s *Service) snapshotDir(id string) string { return s.core.SnapshotDir(id) }

func (s *Service) snapshotBudget() int64 {
	if s.cfg.SnapshotBudgetBytes > 0 {
		return s.cfg.SnapshotBudgetBytes
	}
	return DefaultSnapshotBudgetBytes
}

// checkSnapshotID refuses a malformed snapshot id, naming the argument.
func checkSnapshotID(field, id string) error {
	if !sandbox.ValidSnapshotID(id) {
		return errcode.New(errcode.InvalidArgument, "%s %q is not a snapshot id (snap- and 12 lowercase hex digits); snapshot_list shows them", field, text.Truncate(id, 64))
	}
	return nil
}

// snapshotter returns rt as a Snapshotter that takes the kind asked for.
func snapshotter(rt runtime.Runtime, memory bool) (runtime.Snapshotter, string, error) {
	caps := rt.Capabilities()
	sn, ok := rt.(runtime.Snapshotter)
	if !ok || !slices.Contains(caps.Snapshots, runtime.SnapshotFiles) {
		return nil, "", errcode.New(errcode.UnsupportedOp, "runtime %s takes no snapshots", rt.Name())
	}
	if !memory {
		return sn, runtime.SnapshotFiles, nil
	}
	if !slices.Contains(caps.Snapshots, runtime.SnapshotFilesMemory) {
		why := caps.MemorySnapshotReason
		if why == "" {
			why = "it saves files only"
		}
		return nil, "", errcode.New(errcode.UnsupportedOp, "runtime %s cannot snapshot memory and processes: %s; take a files snapshot (memory: false)", rt.Name(), why).
			With("runtime", rt.Name())
	}
	return sn, runtime.SnapshotFilesMemory, nil
}

// notRunning is SANDBOX_NOT_RUNNING for an operation that needs sb running.
func notRunning(sb sandbox.Sandbox, op string) error {
	what := "create a new sandbox"
	switch sb.State {
	case sandbox.StateSleeping:
		what = "wake it first (" + sandbox.WakeHow(sb.ID) + ")"
	case sandbox.StateCreating:
		what = "wait until it is running"
	}
	return errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; %s needs a running sandbox: %s", sb.ID, sb.State, op, what).
		With("state", string(sb.State))
}

// Snapshot saves sandbox id's files (and memory, with req.Memory) as a new snapshot.
func (s *Service) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (sandbox.Snapshot, error) {
	if err := sandboxid.Check(id); err != nil {
		return sandbox.Snapshot{}, err
	}
	if err := sandbox.ValidateLabels("labels", req.Labels); err != nil {
		return sandbox.Snapshot{}, err
	}
	if _, err := s.snapshotStore(); err != nil {
		return sandbox.Snapshot{}, err
	}
	unlock := s.core.Lock(id)
	defer unlock()
	sn, unpin, err := s.snapshotLocked(ctx, id, req.Memory, req.Labels)
	unpin()
	return sn, err
}

// snapshotLocked takes a user snapshot of sandbox id, whose lock the caller holds, and returns
// it pinned (the caller unpins it; unpin is never nil).
func (s *Service) snapshotLocked(ctx context.Context, id string, memory bool, labels map[string]string) (sandbox.Snapshot, func(), error) {
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return sandbox.Snapshot{}, func() {}, err
	}
	if sb.State != sandbox.StateRunning {
		return sandbox.Snapshot{}, func() {}, notRunning(sb, "a snapshot")
	}
	rt, err := s.core.RuntimeOf(sb)
	if err != nil {
		return sandbox.Snapshot{}, func() {}, err
	}
	sr, kind, err := snapshotter(rt, memory)
	if err != nil {
		return sandbox.Snapshot{}, func() {}, err
	}
	return s.takeSnapshot(ctx, sb, sr, kind, runtime.SnapshotOptions{Memory: memory}, sandbox.SnapshotPurposeUser, labels)
}

// takeSnapshot saves sb (running; the caller holds its lock) through sr into a new snapshot of
// purpose and returns its ready record, pinned: the caller calls unpin (never nil) once it no
// longer needs it kept. The record is written before the runtime acts; on failure the
// directory is removed and the record left failed. A user snapshot is fitted under the budget
// and recorded as an event of sb ("snapshot"); a sleep snapshot is neither (the caller, Sleep,
// records its own transition).
func (s *Service) takeSnapshot(ctx context.Context, sb sandbox.Sandbox, sr runtime.Snapshotter, kind string, opts runtime.SnapshotOptions, purpose string, labels map[string]string) (_ sandbox.Snapshot, unpin func(), _ error) {
	unpin = func() {}
	ss, err := s.snapshotStore()
	if err != nil {
		return sandbox.Snapshot{}, unpin, err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotTimeout)
	defer cancel()
	now := s.core.Now().UTC().Truncate(time.Millisecond)
	sn := sandbox.Snapshot{ID: sandbox.NewSnapshotID(), SandboxID: sb.ID, State: sandbox.SnapshotCreating, Kind: kind, Purpose: purpose,
		Runtime: sb.Runtime, Image: sb.Image, ImageDigest: sb.ImageDigest, CPU: sb.CPU, MemoryMB: sb.MemoryMB,
		DiskMB: sb.DiskMB, Secrets: sb.Secrets, Labels: labels, Node: s.core.Node(), CreatedAt: now, Version: 1}
	if sb.Network.Policy != nil {
		n := sb.Network
		sn.Network = &n
	}
	s.state.begin(sn.ID)
	defer s.state.end(sn.ID) // after the record's last update: converge relies on it
	if err := ss.CreateSnapshot(wctx, sn); err != nil {
		return sandbox.Snapshot{}, unpin, fmt.Errorf("record snapshot %s of sandbox %s: %w", sn.ID, sb.ID, err)
	}
	dir := s.snapshotDir(sn.ID)
	if err := os.MkdirAll(s.cfg.SnapshotDir, 0o700); err != nil {
		return sandbox.Snapshot{}, unpin, s.failSnapshot(wctx, ss, sn, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot make the snapshot directory"))
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return sandbox.Snapshot{}, unpin, s.failSnapshot(wctx, ss, sn, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot make the directory of snapshot %s", sn.ID))
	}
	s.log.Info("snapshot taking", "snapshot_id", sn.ID, "sandbox_id", sb.ID, "kind", kind, "purpose", purpose)
	info, err := sr.Snapshot(wctx, sb.ID, dir, opts)
	if err != nil {
		if errcode.Of(err) == errcode.Internal {
			err = errcode.Wrap(errcode.RuntimeUnavailable, err, "runtime %s could not snapshot sandbox %s; see the server log", sb.Runtime, sb.ID)
		}
		return sandbox.Snapshot{}, unpin, s.failSnapshot(wctx, ss, sn, err)
	}
	if info.Kind != "" {
		sn.Kind = info.Kind
	}
	sn.SizeBytes = info.SizeBytes
	if info.DiskMB > 0 {
		sn.DiskMB = info.DiskMB
	}
	sn.IDBase = int64(info.IDMap.UIDBase)
	var retired []sandbox.Snapshot
	if purpose == sandbox.SnapshotPurposeUser {
		s.state.budget.Lock()
		defer s.state.budget.Unlock()
		if retired, err = s.makeRoom(wctx, ss, sn); err != nil {
			return sandbox.Snapshot{}, unpin, s.failSnapshot(wctx, ss, sn, err)
		}
	}
	faultpoint.Hit(faultpoint.SnapshotTaken) // the files are on disk; the record is not ready
	unpin = s.state.pin(sn.ID)
	sn.State = sandbox.SnapshotReady
	sn.Version++
	if err := ss.UpdateSnapshot(wctx, sn); err != nil {
		unpin()
		sn.Version--
		return sandbox.Snapshot{}, func() {}, s.failSnapshot(wctx, ss, sn, fmt.Errorf("record snapshot %s ready: %w", sn.ID, err))
	}
	s.log.Info("snapshot ready", "snapshot_id", sn.ID, "sandbox_id", sb.ID, "kind", sn.Kind, "size_bytes", sn.SizeBytes, "retired", len(retired))
	if purpose == sandbox.SnapshotPurposeUser {
		reason := fmt.Sprintf("snapshot %s (%s, %d bytes) taken", sn.ID, sn.Kind, sn.SizeBytes)
		if len(retired) > 0 {
			ids := make([]string, len(retired))
			for i, r := range retired {
				ids[i] = r.ID
			}
			reason += fmt.Sprintf("; retired %s to fit the snapshot budget of %d MiB", strings.Join(ids, ", "), s.snapshotBudget()>>20)
		}
		s.core.Event(wctx, sb.ID, "snapshot", reason)
	}
	return sn, unpin, nil
}

// failSnapshot removes the directory of sn (a record in state creating, of this process) and
// records it failed with cause, which it returns. If the directory cannot be removed the record
// stays creating, for the control loop to finish.
func (s *Service) failSnapshot(ctx context.Context, ss sandbox.SnapshotStore, sn sandbox.Snapshot, cause error) error {
	s.log.Warn("snapshot failed", "snapshot_id", sn.ID, "sandbox_id", sn.SandboxID, "err", cause)
	if err := os.RemoveAll(s.snapshotDir(sn.ID)); err != nil {
		s.log.Error("remove the directory of a failed snapshot (the control loop retries)", "snapshot_id", sn.ID, "err", err)
		return cause
	}
	sn.State, sn.Error = sandbox.SnapshotFailed, text.Truncate(errcode.Message(cause), 1024)
	sn.Version++
	if err := ss.UpdateSnapshot(ctx, sn); err != nil {
		s.log.Error("record failed snapshot (the control loop retries)", "snapshot_id", sn.ID, "err", err)
	}
	return cause
}

// makeRoom retires the oldest ready user snapshots that nothing in flight uses until sn fits
// under the budget with the rest, and returns them. A snapshot larger than the whole budget,
// or one that cannot fit because what holds the budget is in use, is CAPACITY_UNAVAILABLE.
// The caller holds s.state.budget.
func (s *Service) makeRoom(ctx context.Context, ss sandbox.SnapshotStore, sn sandbox.Snapshot) ([]sandbox.Snapshot, error) {
	budget := s.snapshotBudget()
	if sn.SizeBytes > budget {
		return nil, errcode.New(errcode.CapacityUnavailable, "the snapshot of sandbox %s takes %d MiB, more than the whole snapshot budget (%d MiB); free space in the sandbox or raise serve --snapshot-budget-mb",
			sn.SandboxID, sn.SizeBytes>>20, budget>>20).With("size_bytes", sn.SizeBytes).With("budget_bytes", budget)
	}
	used, err := ss.SnapshotBytes(ctx)
	if err != nil {
		return nil, err
	}
	var retired []sandbox.Snapshot
	after := ""
	for used+sn.SizeBytes > budget {
		page, err := ss.ListSnapshots(ctx, sandbox.SnapshotFilter{Purpose: sandbox.SnapshotPurposeUser, States: []sandbox.SnapshotState{sandbox.SnapshotReady}, After: after, Limit: sandbox.DefaultSnapshotList})
		if err != nil {
			return retired, err
		}
		kept := ""
		for _, old := range page {
			if used+sn.SizeBytes <= budget {
				break
			}
			if old.ID == sn.ID || !s.retire(ctx, ss, old) {
				kept = old.ID
				continue
			}
			used -= old.SizeBytes
			retired = append(retired, old)
		}
		if used+sn.SizeBytes <= budget {
			break
		}
		if len(page) < sandbox.DefaultSnapshotList {
			return retired, errcode.New(errcode.CapacityUnavailable, "the snapshot budget (%d MiB) is held by snapshots in use by forks or creates in flight; %d MiB more are needed; retry when they finish, delete snapshots, or raise serve --snapshot-budget-mb",
				budget>>20, (used+sn.SizeBytes-budget+(1<<20)-1)>>20)
		}
		after = kept
	}
	return retired, nil
}

// retire deletes old (a ready user snapshot) to make room, unless something uses it; it says
// whether it did.
func (s *Service) retire(ctx context.Context, ss sandbox.SnapshotStore, old sandbox.Snapshot) bool {
	unlock, ok := s.core.TryLock(old.ID)
	if !ok {
		return false
	}
	defer unlock()
	if s.state.pinned(old.ID) {
		return false
	}
	cur, err := ss.GetSnapshot(ctx, old.ID)
	if err != nil || cur.State != sandbox.SnapshotReady {
		return false
	}
	if err := s.deleteSnapshotLocked(ctx, ss, cur); err != nil {
		s.log.Warn("retire snapshot (the control loop finishes it)", "snapshot_id", old.ID, "err", err)
		return false
	}
	s.log.Info("snapshot retired to fit the snapshot budget", "snapshot_id", old.ID, "sandbox_id", old.SandboxID, "size_bytes", old.SizeBytes)
	return true
}

// deleteSnapshotLocked records sn deleting, removes its directory, then its record; the caller
// holds sn's lock. A crash in between leaves deleting, which the control loop finishes.
func (s *Service) deleteSnapshotLocked(ctx context.Context, ss sandbox.SnapshotStore, sn sandbox.Snapshot) error {
	if sn.State != sandbox.SnapshotDeleting {
		sn.State = sandbox.SnapshotDeleting
		sn.Version++
		if err := ss.UpdateSnapshot(ctx, sn); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(s.snapshotDir(sn.ID)); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot remove the files of snapshot %s; the server retries", sn.ID)
	}
	if err := ss.DeleteSnapshot(ctx, sn.ID); err != nil && errcode.Of(err) != errcode.SnapshotNotFound {
		return err
	}
	return nil
}

// ListSnapshots lists user snapshots (f.SandboxID's, or all), oldest first, a page of at most
// f.Limit (default 100, at most 1000) after the cursor f.After.
func (s *Service) ListSnapshots(ctx context.Context, f sandbox.SnapshotFilter) ([]sandbox.Snapshot, error) {
	ss, err := s.snapshotStore()
	if err != nil {
		return nil, err
	}
	if f.Limit < 0 || f.Limit > sandbox.MaxSnapshotList {
		return nil, errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d (0: %d); got %d", sandbox.MaxSnapshotList, sandbox.DefaultSnapshotList, f.Limit)
	}
	if f.SandboxID != "" {
		if err := sandboxid.Check(f.SandboxID); err != nil {
			return nil, err
		}
	}
	if f.After != "" {
		if err := checkSnapshotID("after", f.After); err != nil {
			return nil, err
		}
	}
	for _, st := range f.States {
		if !st.Valid() {
			return nil, errcode.New(errcode.InvalidArgument, "state %q is unknown; use creating, ready, failed or deleting", text.Truncate(string(st), 64))
		}
	}
	if f.Purpose == "" {
		f.Purpose = sandbox.SnapshotPurposeUser // a sleep snapshot belongs to its sleeping sandbox
	}
	out, err := ss.ListSnapshots(ctx, f)
	if out == nil && err == nil {
		out = []sandbox.Snapshot{}
	}
	return out, err
}

// GetSnapshot returns one snapshot; an unknown id is SNAPSHOT_NOT_FOUND.
func (s *Service) GetSnapshot(ctx context.Context, id string) (sandbox.Snapshot, error) {
	if err := checkSnapshotID("snapshot_id", id); err != nil {
		return sandbox.Snapshot{}, err
	}
	ss, err := s.snapshotStore()
	if err != nil {
		return sandbox.Snapshot{}, err
	}
	return ss.GetSnapshot(ctx, id)
}

// DeleteSnapshot deletes a snapshot and its files. One a create or fork in flight reads, or
// one being taken, is a CONFLICT; a sleeping sandbox's is too (wake or destroy the sandbox).
func (s *Service) DeleteSnapshot(ctx context.Context, id string) error {
	if err := checkSnapshotID("snapshot_id", id); err != nil {
		return err
	}
	ss, err := s.snapshotStore()
	if err != nil {
		return err
	}
	unlock := s.core.Lock(id)
	defer unlock()
	sn, err := ss.GetSnapshot(ctx, id)
	if err != nil {
		return err
	}
	switch {
	case sn.Purpose == sandbox.SnapshotPurposeSleep:
		return errcode.New(errcode.Conflict, "snapshot %s holds sleeping sandbox %s; wake it (%s) or destroy it", id, sn.SandboxID, sandbox.WakeHow(sn.SandboxID)).With("sandbox_id", sn.SandboxID)
	case s.state.pinned(id):
		return errcode.New(errcode.Conflict, "snapshot %s is in use by a fork or create in flight; retry once it has finished", id)
	case sn.State == sandbox.SnapshotCreating && s.state.taking(id):
		return errcode.New(errcode.Conflict, "snapshot %s is still being taken; retry once it is ready", id)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := s.deleteSnapshotLocked(wctx, ss, sn); err != nil {
		return err
	}
	s.log.Info("snapshot deleted", "snapshot_id", id, "sandbox_id", sn.SandboxID)
	return nil
}

// request is the create stages' Request hook: a create from a snapshot takes its shape,
// network and secrets (fromSnapshot) and starts from it, the snapshot pinned until the create
// ends.
func (s *Service) request(ctx context.Context, c *sandbox.Creation) error {
	if c.Req.Snapshot == "" {
		return nil
	}
	snap, src, unpin, err := s.fromSnapshot(ctx, c.Req)
	if err != nil {
		return err
	}
	c.Defer(unpin)
	c.FromSnapshot, c.Source, c.ImageDigest = snap.ID, src, snap.ImageDigest
	return nil
}

// fromSnapshot prepares a create from req.Snapshot: it pins the snapshot (the caller calls
// unpin, never nil), takes the sandbox's shape from it (a conflicting explicit value is
// INVALID_ARGUMENT naming the field) and, when the request names neither, its network policy
// and secrets (references). It returns the snapshot's record and what the runtime is given.
func (s *Service) fromSnapshot(ctx context.Context, req *sandbox.CreateRequest) (sandbox.Snapshot, *runtime.SnapshotSource, func(), error) {
	none := func() {}
	if err := checkSnapshotID("snapshot", req.Snapshot); err != nil {
		return sandbox.Snapshot{}, nil, none, err
	}
	ss, err := s.snapshotStore()
	if err != nil {
		return sandbox.Snapshot{}, nil, none, err
	}
	unlock := s.core.Lock(req.Snapshot)
	sn, err := ss.GetSnapshot(ctx, req.Snapshot)
	if err == nil {
		switch {
		case sn.Purpose != sandbox.SnapshotPurposeUser:
			err = errcode.New(errcode.InvalidArgument, "snapshot %s holds sleeping sandbox %s and cannot be created from; snapshot that sandbox once it is awake", sn.ID, sn.SandboxID)
		case sn.State != sandbox.SnapshotReady:
			err = errcode.New(errcode.Conflict, "snapshot %s is %s, not ready%s", sn.ID, sn.State, map[bool]string{true: ": " + sn.Error}[sn.Error != ""]).With("state", string(sn.State))
		case sn.Node != "" && sn.Node != s.core.Node():
			err = errcode.New(errcode.UnsupportedOp, "snapshot %s is on node %q, which this server does not manage", sn.ID, text.Truncate(sn.Node, 64))
		}
	}
	var unpin func()
	if err == nil {
		unpin = s.state.pin(sn.ID)
	}
	unlock()
	if err != nil {
		return sandbox.Snapshot{}, nil, none, err
	}
	fail := func(err error) (sandbox.Snapshot, *runtime.SnapshotSource, func(), error) {
		unpin()
		return sandbox.Snapshot{}, nil, none, err
	}
	memory := sn.Kind == runtime.SnapshotFilesMemory
	conflict := func(field string, asked, has any) error {
		return errcode.New(errcode.InvalidArgument, "%s: snapshot %s was taken of a sandbox with %s %v; a sandbox made from it has the same (leave %s out), not %v",
			field, sn.ID, field, has, field, asked).With("field", field)
	}
	switch {
	case req.Runtime != "" && req.Runtime != sn.Runtime:
		return fail(conflict("runtime", req.Runtime, sn.Runtime))
	case req.Image != "" && req.Image != sn.Image:
		return fail(conflict("image", req.Image, sn.Image))
	case req.DiskMB != 0 && req.DiskMB != sn.DiskMB:
		return fail(conflict("disk_mb", req.DiskMB, sn.DiskMB))
	case memory && req.CPU != 0 && req.CPU != sn.CPU:
		return fail(conflict("cpu", req.CPU, sn.CPU))
	case memory && req.MemoryMB != 0 && req.MemoryMB != sn.MemoryMB:
		return fail(conflict("memory_mb", req.MemoryMB, sn.MemoryMB))
	}
	req.Runtime, req.Image, req.DiskMB = sn.Runtime, sn.Image, sn.DiskMB
	if memory {
		req.CPU, req.MemoryMB = sn.CPU, sn.MemoryMB
	}
	if req.Network == nil && len(req.Secrets) == 0 && sn.Network != nil {
		n := *sn.Network
		req.Network = &n
		req.Secrets = secretSpecs(sn.Secrets)
	}
	dir := s.snapshotDir(sn.ID)
	b, err := os.ReadFile(filepath.Join(dir, runtime.SnapshotInfoFile))
	if err != nil {
		return fail(errcode.Wrap(errcode.RuntimeUnavailable, err, "the files of snapshot %s are missing or unreadable; delete it", sn.ID))
	}
	var info runtime.SnapshotInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return fail(errcode.Wrap(errcode.RuntimeUnavailable, err, "snapshot %s: its %s is unreadable; delete it", sn.ID, runtime.SnapshotInfoFile))
	}
	return sn, &runtime.SnapshotSource{Dir: dir, Info: info, Memory: memory}, unpin, nil
}

// secretSpecs turns a sandbox's secrets back into a create's.
func secretSpecs(secrets []egress.Secret) map[string]sandbox.SecretSpec {
	if len(secrets) == 0 {
		return nil
	}
	out := make(map[string]sandbox.SecretSpec, len(secrets))
	for _, sec := range secrets {
		out[sec.Name] = sandbox.SecretSpec{From: sec.From, Hosts: slices.Clone(sec.Hosts), Body: sec.Body}
	}
	return out
}

// Fork makes req.Count sandboxes from a snapshot of sandbox id: req.SnapshotID (one of id's),
// or one taken now. Either every sandbox is made or none is.
func (s *Service) Fork(ctx context.Context, id string, req sandbox.ForkRequest) (sandbox.ForkResult, error) {
	if err := sandboxid.Check(id); err != nil {
		return sandbox.ForkResult{}, err
	}
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > sandbox.MaxForkCount {
		return sandbox.ForkResult{}, errcode.New(errcode.InvalidArgument, "count must be between 1 and %d (0: 1); got %d", sandbox.MaxForkCount, req.Count)
	}
	if err := sandbox.ValidateLabels("labels", req.Labels); err != nil {
		return sandbox.ForkResult{}, err
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > int64(s.cfg.MaxTTL/time.Second) {
		return sandbox.ForkResult{}, errcode.New(errcode.InvalidArgument, "ttl_seconds must be between 1 and %d (the server's max TTL); got %d", int64(s.cfg.MaxTTL/time.Second), req.TTLSeconds)
	}
	if req.SnapshotID != "" {
		if err := checkSnapshotID("snapshot_id", req.SnapshotID); err != nil {
			return sandbox.ForkResult{}, err
		}
	}
	ss, err := s.snapshotStore()
	if err != nil {
		return sandbox.ForkResult{}, err
	}
	src, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return sandbox.ForkResult{}, err
	}
	var sn sandbox.Snapshot
	unpin := func() {}
	if req.SnapshotID == "" {
		unlock := s.core.Lock(id)
		sn, unpin, err = s.snapshotLocked(ctx, id, req.Memory, nil)
		unlock()
		if err != nil {
			return sandbox.ForkResult{}, err
		}
	} else {
		unlock := s.core.Lock(req.SnapshotID)
		sn, err = ss.GetSnapshot(ctx, req.SnapshotID)
		switch {
		case err != nil:
		case sn.SandboxID != id:
			err = errcode.New(errcode.InvalidArgument, "snapshot_id: snapshot %s is of sandbox %s, not %s; fork that sandbox, or create from the snapshot (sandbox_create snapshot)", sn.ID, sn.SandboxID, id)
		case req.Memory && sn.Kind != runtime.SnapshotFilesMemory:
			err = errcode.New(errcode.InvalidArgument, "memory: snapshot %s holds %s only; fork without memory or take a new snapshot with memory", sn.ID, sn.Kind)
		default:
			unpin = s.state.pin(sn.ID) // fromSnapshot checks the rest
		}
		unlock()
		if err != nil {
			return sandbox.ForkResult{}, err
		}
	}
	defer unpin()
	faultpoint.Hit(faultpoint.ForkSnapshotted) // the fork has its snapshot; no child is made

	labels := maps.Clone(src.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, req.Labels)
	shape := sandbox.Sandbox{CPU: src.CPU, MemoryMB: src.MemoryMB, DiskMB: sn.DiskMB}
	if sn.Kind == runtime.SnapshotFilesMemory {
		shape.CPU, shape.MemoryMB = sn.CPU, sn.MemoryMB
	}
	if err := s.core.Admit(ctx, shape, req.Count, fmt.Sprintf("a fork of %d does not fit (none was made): ", req.Count)); err != nil {
		return sandbox.ForkResult{}, err
	}
	made := make([]sandbox.Sandbox, req.Count)
	errs := make([]error, req.Count)
	sem := make(chan struct{}, forkParallel)
	var wg sync.WaitGroup
	for i := range req.Count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cr := sandbox.CreateRequest{Snapshot: sn.ID, TTLSeconds: req.TTLSeconds, Labels: maps.Clone(labels), Env: maps.Clone(src.Env)}
			if sn.Kind != runtime.SnapshotFilesMemory {
				cr.CPU, cr.MemoryMB = src.CPU, src.MemoryMB
			}
			made[i], errs[i] = s.core.Create(ctx, cr)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		var first error
		for _, e := range errs {
			if e != nil {
				first = e
				break
			}
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		for i, sb := range made {
			if errs[i] == nil && sb.ID != "" {
				if _, derr := s.core.Destroy(dctx, sb.ID); derr != nil {
					s.log.Error("destroy a fork of a failed fork (the control loop finishes it)", "sandbox_id", sb.ID, "err", derr)
				}
			}
		}
		s.log.Warn("fork failed; the sandboxes it made are destroyed", "sandbox_id", id, "snapshot_id", sn.ID, "count", req.Count, "err", first)
		return sandbox.ForkResult{}, first
	}
	return sandbox.ForkResult{SnapshotID: sn.ID, Kind: sn.Kind, Sandboxes: made}, nil
}

// converge finishes what snapshot operations left (the caller is the control loop, or
// Reconcile at start with atStart): a user snapshot's record creating with no operation of
// this process taking it → its directory removed, the record failed; a record deleting → the
// delete finished; a failed record older than Config.Retention → removed. Sleep snapshots that
// are creating are the core's sleep to settle; their deletes are finished here.
func (s *Service) converge(ctx context.Context, atStart bool) error {
	if s.cfg.SnapshotDir == "" {
		return nil
	}
	ss := s.store
	var errs []error
	// One page of each state per pass (the oldest first): the next pass takes the rest.
	each := func(st sandbox.SnapshotState, fn func(sn sandbox.Snapshot) error) {
		page, err := ss.ListSnapshots(ctx, sandbox.SnapshotFilter{States: []sandbox.SnapshotState{st}, Limit: sandbox.MaxSnapshotList})
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s snapshots: %w", st, err))
			return
		}
		for _, sn := range page {
			if sn.Node != "" && sn.Node != s.core.Node() {
				continue
			}
			if err := fn(sn); err != nil {
				errs = append(errs, fmt.Errorf("snapshot %s: %w", sn.ID, err))
			}
		}
	}
	each(sandbox.SnapshotCreating, func(sn sandbox.Snapshot) error {
		if sn.Purpose == sandbox.SnapshotPurposeSleep || s.state.taking(sn.ID) {
			return nil
		}
		unlock, ok := s.core.TryLock(sn.ID)
		if !ok {
			return nil
		}
		defer unlock()
		cur, err := ss.GetSnapshot(ctx, sn.ID) // the operation may have ended since the listing
		if err != nil || cur.State != sandbox.SnapshotCreating {
			return nil
		}
		if err := os.RemoveAll(s.snapshotDir(cur.ID)); err != nil {
			return fmt.Errorf("remove the directory of an abandoned snapshot: %w", err)
		}
		cur.State, cur.Error = sandbox.SnapshotFailed, "abandoned: no operation was taking it"
		if atStart {
			cur.Error = "the server stopped while this snapshot was being taken"
		}
		cur.Version++
		if err := ss.UpdateSnapshot(ctx, cur); err != nil {
			return err
		}
		s.log.Warn("snapshot abandoned: its files are removed and it is recorded failed", "snapshot_id", cur.ID, "sandbox_id", cur.SandboxID, "reason", cur.Error)
		return nil
	})
	each(sandbox.SnapshotDeleting, func(sn sandbox.Snapshot) error {
		unlock, ok := s.core.TryLock(sn.ID)
		if !ok {
			return nil
		}
		defer unlock()
		if err := s.deleteSnapshotLocked(ctx, ss, sn); err != nil {
			return err
		}
		s.log.Info("snapshot delete finished", "snapshot_id", sn.ID)
		return nil
	})
	cutoff := s.core.Now().Add(-s.cfg.Retention)
	each(sandbox.SnapshotFailed, func(sn sandbox.Snapshot) error {
		if sn.CreatedAt.After(cutoff) {
			return nil
		}
		unlock, ok := s.core.TryLock(sn.ID)
		if !ok {
			return nil
		}
		defer unlock()
		if err := os.RemoveAll(s.snapshotDir(sn.ID)); err != nil {
			return err
		}
		return ss.DeleteSnapshot(ctx, sn.ID)
	})
	return errors.Join(errs...)
}

// sweep removes directories under Config.SnapshotDir that no record owns. It lists
// the disk first and asks the store second: a snapshot's record is written before its
// directory, so one being taken is never mistaken for an orphan. Names that are not snapshot
// ids are left alone. With checkReady (at start) it also records failed every ready snapshot of
// this node whose directory lacks its snapshot.json (its files are gone).
func (s *Service) sweep(ctx context.Context, checkReady bool) error {
	if s.cfg.SnapshotDir == "" {
		return nil
	}
	ss := s.store
	ents, err := os.ReadDir(s.cfg.SnapshotDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("list snapshot directories: %w", err)
	}
	var errs []error
	for _, e := range ents {
		id := e.Name()
		if !sandbox.ValidSnapshotID(id) || s.state.taking(id) {
			continue
		}
		_, err := ss.GetSnapshot(ctx, id)
		if errcode.Of(err) != errcode.SnapshotNotFound {
			continue // owned, or the store cannot say
		}
		s.log.Warn("sweeping an orphaned snapshot directory", "snapshot_id", id)
		if err := os.RemoveAll(s.snapshotDir(id)); err != nil {
			errs = append(errs, fmt.Errorf("remove orphaned snapshot directory %s: %w", id, err))
		}
	}
	if !checkReady {
		return errors.Join(errs...)
	}
	after := ""
	for {
		page, err := ss.ListSnapshots(ctx, sandbox.SnapshotFilter{States: []sandbox.SnapshotState{sandbox.SnapshotReady}, After: after, Limit: sandbox.MaxSnapshotList})
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for _, sn := range page {
			if sn.Node != "" && sn.Node != s.core.Node() {
				continue
			}
			if _, err := os.Stat(filepath.Join(s.snapshotDir(sn.ID), runtime.SnapshotInfoFile)); !errors.Is(err, fs.ErrNotExist) {
				continue
			}
			sn.State, sn.Error = sandbox.SnapshotFailed, "its files were gone when the server started"
			sn.Version++
			if err := ss.UpdateSnapshot(ctx, sn); err != nil {
				errs = append(errs, err)
				continue
			}
			s.log.Warn("snapshot's files are gone: recorded failed", "snapshot_id", sn.ID)
		}
		if len(page) < sandbox.MaxSnapshotList {
			break
		}
		after = page[len(page)-1].ID
	}
	return errors.Join(errs...)
}
