//go:build linux

// Package fake is a fake runtime for control-plane logic tests; no containers.
//
// Each sandbox is a directory (its workspace) and, once started, a real guest agent
// (guest.Run with ServerConfig.Embedded) serving the guest protocol in this process on a unix
// socket in that directory. Commands run on the host as this process's user, in the
// sandbox's workspace, with the spec's Env over this process's environment: nothing is
// isolated or limited (cpu, memory, disk and pids are accepted and ignored), which is what
// Capabilities declare (isolation "process", no hardening). It needs no root and runs in
// `go test -short`.
//
// An OCI image's Spec.Rootfs is taken and recorded (Rootfs, RootfsFile), not mounted: commands
// still see the host. WritableLayer (runtime.Committer) is a directory of the sandbox's own. Pause and Resume
// (runtime.Pauser) freeze nothing: they set a flag tests read (Paused), and a dial of a paused
// sandbox's agent fails and is counted (PausedDials), where a real agent would not answer.
//
// For the control plane's tests it adds fault injection (SetFault), a crash (Kill), and what a
// leak assertion needs (Resources, Calls).
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

// Op names a Runtime operation, for SetFault and Calls.
type Op string

// The operations a fault can intercept. A Run (runtime.CreateAndStart on this runtime, a
// runtime.Runner) is OpRun alone, not OpCreate then OpStart.
const (
	OpCreate  Op = "create"
	OpStart   Op = "start"
	OpRun     Op = "run"
	OpStop    Op = "stop"
	OpDelete  Op = "delete"
	OpState   Op = "state"
	OpList    Op = "list"
	OpAgent   Op = "agent"
	OpAdopt   Op = "adopt"
	OpWait    Op = "wait"
	OpMetrics Op = "metrics"
	OpLayer   Op = "writable_layer"
	OpPause   Op = "pause"
	OpResume  Op = "resume"
)

// Config configures a fake Runtime.
type Config struct {
	// Name is the runtime's name; default "fake".
	Name string
	// Dir holds the sandboxes' directories; default a new directory under os.TempDir(),
	// removed by Shutdown. The agent's socket, Dir/<id>/agent.sock, must fit 107 bytes.
	Dir string
	// Logger receives the agents' logs; nil discards.
	Logger *slog.Logger
	// TakesIDRange makes Capabilities declare IDMappedFiles, so the control plane allocates
	// every sandbox a range of host ids (Capabilities.TakesIDRange) and releases it, which its
	// tests observe. The fake takes Spec.IDMap and records it (IDMap) but applies nothing:
	// commands still run as this process's user.
	TakesIDRange bool
	// MemorySnapshots makes Capabilities list runtime.SnapshotFilesMemory (snapshot.go): the
	// fake saves the files only and pretends, for control-plane tests of memory snapshots.
	MemorySnapshots bool
}

// Runtime is the fake runtime. Its methods are safe for concurrent use.
type Runtime struct {
	name   string
	dir    string
	ownDir bool
	log    *slog.Logger
	idMaps bool // Config.TakesIDRange
	// memSnaps: Config.MemorySnapshots.
	memSnaps bool

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	fault     func(ctx context.Context, op Op, id string) error
	calls     map[Op]int
	gen       uint64 // the last sandbox's generation: its Handle
	// pausedDials counts dials of a paused sandbox's agent (PausedDials).
	pausedDials int
}

// sandbox is one fake sandbox. Its fields are guarded by Runtime.mu, but for the channels.
type sandbox struct {
	id     string
	dir    string
	handle runtime.Handle
	env    map[string]string
	idMap  runtime.IDMap
	diskMB int64          // Spec.DiskMB (the fake enforces nothing; a snapshot reports it)
	status runtime.Status // created, running or stopped (what Stop and Kill leave)
	// stop ends the agent; nil before Start.
	stop context.CancelFunc
	// agentDone is closed when the agent's guest.Run has returned; nil before Start.
	agentDone chan struct{}
	// exited is closed when the sandbox's "init" has exited: the agent returned, or the
	// sandbox was stopped or deleted before it started.
	exited   chan struct{}
	exitOnce sync.Once
	// paused is set by Pause and cleared by Resume (the fake freezes nothing).
	paused bool
}

func (s *sandbox) markExited() { s.exitOnce.Do(func() { close(s.exited) }) }

var (
	_ runtime.Runtime       = (*Runtime)(nil)
	_ runtime.Runner        = (*Runtime)(nil)
	_ runtime.Adopter       = (*Runtime)(nil)
	_ runtime.Waiter        = (*Runtime)(nil)
	_ runtime.DiskAccounter = (*Runtime)(nil)
	_ runtime.Closer        = (*Runtime)(nil)
	_ runtime.MetricsReader = (*Runtime)(nil)
	_ runtime.Committer     = (*Runtime)(nil)
	_ runtime.Pauser        = (*Runtime)(nil)
)

// maxSocketPath is the longest unix socket path.
const maxSocketPath = 107

// shutdownGrace is how long a stopping agent lets requests finish before it kills their
// commands: a crash or a stop does not wait.
const shutdownGrace = 10 * time.Millisecond

// New returns a fake Runtime.
func New(cfg Config) (*Runtime, error) {
	if cfg.Name == "" {
		cfg.Name = "fake"
	}
	r := &Runtime{name: cfg.Name, dir: cfg.Dir, log: cfg.Logger, idMaps: cfg.TakesIDRange, memSnaps: cfg.MemorySnapshots, sandboxes: map[string]*sandbox{}, calls: map[Op]int{}}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.dir == "" {
		d, err := os.MkdirTemp("", "abfake")
		if err != nil {
			return nil, fmt.Errorf("fake runtime: %w", err)
		}
		r.dir, r.ownDir = d, true
	} else if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return nil, fmt.Errorf("fake runtime: %w", err)
	}
	if n := len(r.socketPath("sb-000000000000")); n > maxSocketPath {
		return nil, fmt.Errorf("fake runtime: Dir %q is too long: the agent's socket path would be %d bytes, at most %d fit", r.dir, n, maxSocketPath)
	}
	return r, nil
}

// Name returns the runtime's name.
func (r *Runtime) Name() string { return r.name }

// Capabilities declares what the fake is: commands run on the host as this process's user,
// with nothing isolated or limited. With Config.TakesIDRange it declares IDMappedFiles, so
// that sandboxes are given id ranges (which it records and does not apply).
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{
		Name:          r.name,
		Available:     true,
		Version:       "fake",
		Isolation:     runtime.IsolationProcess,
		Images:        []string{"host", runtime.ImageOCI},
		NetworkModes:  slices.Clone(networkModes),
		IDMappedFiles: r.idMaps,
		Snapshots:     r.snapshotKinds(),
		MemorySnapshotReason: func() string {
			if r.memSnaps {
				return ""
			}
			return memoryReason
		}(),
	}
}

// IDMap returns the range of host ids sandbox id was created with (Config.TakesIDRange), and
// whether the sandbox exists.
func (r *Runtime) IDMap(id string) (runtime.IDMap, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[id]
	if sb == nil {
		return runtime.IDMap{}, false
	}
	return sb.idMap, true
}

// networkModes are the fake's network modes. Egress only writes the CA bundle into the
// sandbox's directory (CABundleFile): commands run on the host's network, so nothing is
// isolated (no transparent path, no resolv.conf of its own).
var networkModes = []string{runtime.NetworkNone, runtime.NetworkEgress}

// CABundleFile is the name, in a sandbox's directory, of the CA bundle of an egress sandbox.
const CABundleFile = "ca-bundle.pem"

// CABundlePath is where the CA bundle of egress sandbox id is on the host (a fake sandbox's
// commands see it there, not at runtime.CABundlePath); nothing is there for another mode or
// an empty Spec.CABundle.
func (r *Runtime) CABundlePath(id string) string {
	return filepath.Join(r.sandboxDir(id), CABundleFile)
}

// SetFault installs f, called at the start of every operation; a non-nil return makes that
// call fail with it before it does anything. f may block (e.g. until ctx is done) to simulate
// a hung runtime or a caller that hangs up mid-create. nil removes it. id is "" for OpList.
func (r *Runtime) SetFault(f func(ctx context.Context, op Op, id string) error) {
	r.mu.Lock()
	r.fault = f
	r.mu.Unlock()
}

// Calls returns how many times op was called (counted before any fault).
func (r *Runtime) Calls(op Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[op]
}

// begin counts op and runs the fault, if any.
func (r *Runtime) begin(ctx context.Context, op Op, id string) error {
	r.mu.Lock()
	r.calls[op]++
	f := r.fault
	r.mu.Unlock()
	if f != nil {
		if err := f(ctx, op, id); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (r *Runtime) sandboxDir(id string) string { return filepath.Join(r.dir, id) }
func (r *Runtime) socketPath(id string) string { return filepath.Join(r.sandboxDir(id), "agent.sock") }

// checkID refuses an id that is not sandboxid.Valid (as in oci): every directory is named from
// an id.
func checkID(id string) error { return sandboxid.Check(id) }

func (r *Runtime) validateSpec(spec runtime.Spec) error {
	if err := checkID(spec.ID); err != nil {
		return err
	}
	if (spec.Image == "" || spec.Image == "host") != (spec.Rootfs == nil) {
		return errcode.New(errcode.InvalidArgument, "image %q with rootfs %v: the host image takes no rootfs and an OCI image needs one", spec.Image, spec.Rootfs != nil)
	}
	if spec.Rootfs != nil {
		if len(spec.Rootfs.Layers) == 0 || len(spec.Rootfs.Layers) > runtime.MaxRootfsLayers {
			return errcode.New(errcode.InvalidArgument, "rootfs has %d layers; it needs 1 to %d", len(spec.Rootfs.Layers), runtime.MaxRootfsLayers)
		}
		for _, l := range spec.Rootfs.Layers {
			if !filepath.IsAbs(l) {
				return errcode.New(errcode.InvalidArgument, "rootfs layer %q is not an absolute path", l)
			}
		}
	}
	if spec.CPU < 0 || spec.MemoryMB < 0 || spec.DiskMB < 0 || spec.PidsLimit < 0 {
		return errcode.New(errcode.InvalidArgument, "cpu, memory_mb, disk_mb and pids_limit must not be negative")
	}
	if spec.IDMap.Count > 0 && !r.idMaps {
		return errcode.New(errcode.InvalidArgument, "the fake runtime gives sandboxes no range of host ids (Capabilities.TakesIDRange is false)")
	}
	if spec.IDMap.Count == 0 && r.idMaps {
		return errcode.New(errcode.InvalidArgument, "runtime %s takes a range of host ids (Capabilities.TakesIDRange): spec.IDMap must not be empty", r.name)
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return errcode.New(errcode.InvalidArgument, "env %q is invalid", k)
		}
	}
	if err := runtime.CheckNetwork(spec.Network, networkModes); err != nil {
		return err
	}
	return runtime.CheckCABundle(spec.CABundle)
}

// Create makes the sandbox's directory; its agent starts with Start.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	if err := r.begin(ctx, OpCreate, spec.ID); err != nil {
		return "", err
	}
	sb, err := r.create(spec)
	if err != nil {
		return "", err
	}
	return sb.handle, nil
}

// Run is Create then Start, as one operation (OpRun).
func (r *Runtime) Run(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	if err := r.begin(ctx, OpRun, spec.ID); err != nil {
		return "", err
	}
	sb, err := r.create(spec)
	if err != nil {
		return "", err
	}
	if err := r.start(spec.ID); err != nil {
		_ = r.remove(context.WithoutCancel(ctx), spec.ID)
		return "", err
	}
	return sb.handle, nil
}

func (r *Runtime) create(spec runtime.Spec) (*sandbox, error) {
	if err := r.validateSpec(spec); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sandboxes[spec.ID] != nil {
		return nil, errcode.New(errcode.Conflict, "sandbox %s already exists in runtime %s; delete it first", spec.ID, r.name)
	}
	dir := r.sandboxDir(spec.ID)
	if err := os.MkdirAll(filepath.Join(dir, "workspace"), 0o700); err != nil {
		_ = os.RemoveAll(dir)
		return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot create the directory of sandbox %s", spec.ID)
	}
	if spec.Rootfs != nil {
		if err := writeRootfs(dir, spec.Rootfs); err != nil {
			_ = os.RemoveAll(dir)
			return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot record the rootfs of sandbox %s", spec.ID)
		}
	}
	if spec.Snapshot != nil {
		if err := r.restoreSnapshot(dir, spec); err != nil {
			_ = os.RemoveAll(dir)
			if _, ok := errcode.As(err); ok {
				return nil, err
			}
			return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot restore sandbox %s from snapshot %s", spec.ID, spec.Snapshot.Dir)
		}
	}
	if spec.Network == runtime.NetworkEgress && len(spec.CABundle) > 0 {
		if err := os.WriteFile(filepath.Join(dir, CABundleFile), spec.CABundle, 0o444); err != nil {
			_ = os.RemoveAll(dir)
			return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot write the CA bundle of sandbox %s", spec.ID)
		}
	}
	r.gen++
	sb := &sandbox{id: spec.ID, dir: dir, handle: runtime.Handle("fake:" + strconv.FormatUint(r.gen, 10)),
		env: spec.Env, idMap: spec.IDMap, diskMB: spec.DiskMB, status: runtime.StatusCreated, exited: make(chan struct{})}
	r.sandboxes[spec.ID] = sb
	return sb, nil
}

// Start starts the sandbox's agent; it does not wait for it to listen.
func (r *Runtime) Start(ctx context.Context, id string) error {
	if err := r.begin(ctx, OpStart, id); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	return r.start(id)
}

func (r *Runtime) start(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[id]
	switch {
	case sb == nil:
		return errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	case sb.status == runtime.StatusRunning:
		return errcode.New(errcode.Conflict, "sandbox %s is already running", id)
	case sb.status == runtime.StatusStopped:
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s is not running: it has stopped", id)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	cfg := guest.ServerConfig{Socket: r.socketPath(id), Workdir: filepath.Join(sb.dir, "workspace"), Env: sb.env,
		Embedded: true, ShutdownGrace: shutdownGrace, Logger: r.log.With("sandbox_id", id)}
	go func() {
		defer close(done)
		defer sb.markExited()
		if err := guest.Run(ctx, cfg); err != nil {
			r.log.Warn("fake runtime: the agent exited", "sandbox_id", id, "err", err)
		}
	}()
	sb.status, sb.stop, sb.agentDone = runtime.StatusRunning, cancel, done
	return nil
}

// Stop ends the sandbox's agent, killing the commands it runs, and waits until it is gone.
// Processes a command left outside its process group (setsid) are not the fake's to find.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if err := r.begin(ctx, OpStop, id); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	if !r.stop(ctx, id) {
		return errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	return ctx.Err()
}

// stop stops sandbox id and reports whether it exists.
func (r *Runtime) stop(ctx context.Context, id string) bool {
	r.mu.Lock()
	sb := r.sandboxes[id]
	if sb == nil {
		r.mu.Unlock()
		return false
	}
	sb.status = runtime.StatusStopped
	cancel, done := sb.stop, sb.agentDone
	r.mu.Unlock()
	if cancel == nil {
		sb.markExited() // never started
		return true
	}
	cancel()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return true
}

// Kill makes the sandbox's init exit as if it died: State → stopped, Wait returns, the agent
// stops answering; its resources stay until Delete. It is a no-op for an unknown id.
func (r *Runtime) Kill(id string) {
	r.stop(context.Background(), id)
}

// Delete stops the sandbox and removes its directory. Deleting an absent sandbox is nil.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := r.begin(ctx, OpDelete, id); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	return r.remove(ctx, id)
}

func (r *Runtime) remove(ctx context.Context, id string) error {
	r.stop(ctx, id)
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.RemoveAll(r.sandboxDir(id)); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot remove the directory of sandbox %s", id)
	}
	r.mu.Lock()
	delete(r.sandboxes, id)
	r.mu.Unlock()
	return nil
}

// State reports the sandbox's status: absent, created, running, or stopped (stopped, killed,
// or its agent exited).
func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	if err := r.begin(ctx, OpState, id); err != nil {
		return "", err
	}
	if err := checkID(id); err != nil {
		return "", err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[id]
	if sb == nil {
		return runtime.StatusAbsent, nil
	}
	if sb.status == runtime.StatusRunning {
		select {
		case <-sb.exited:
			return runtime.StatusStopped, nil
		default:
		}
	}
	return sb.status, nil
}

// List returns every sandbox not yet deleted (Resources).
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	if err := r.begin(ctx, OpList, ""); err != nil {
		return nil, err
	}
	return r.Resources(), nil
}

// Resources lists ids that still hold anything (what List returns), for leak assertions: every
// sandbox created and not yet deleted, and any directory left under Dir.
func (r *Runtime) Resources() []string {
	r.mu.Lock()
	ids := make([]string, 0, len(r.sandboxes))
	for id := range r.sandboxes {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	ents, _ := os.ReadDir(r.dir)
	for _, e := range ents {
		if sandboxid.Valid(e.Name()) && !slices.Contains(ids, e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids
}

// Agent returns a dialer of the sandbox's agent socket. The agent runs in this process, so the
// peer check can only tell that the socket is held by this process (SO_PEERCRED), not by which
// of its sandboxes' agents.
func (r *Runtime) Agent(ctx context.Context, id string) (runtime.Dialer, error) {
	if err := r.begin(ctx, OpAgent, id); err != nil {
		return nil, err
	}
	if err := checkID(id); err != nil {
		return nil, err
	}
	sb := r.get(id)
	if sb == nil {
		return nil, errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	sock, self := r.socketPath(id), int32(os.Getpid())
	return func(ctx context.Context) (net.Conn, error) {
		r.mu.Lock()
		paused := sb.paused
		if paused {
			r.pausedDials++
		}
		r.mu.Unlock()
		if paused {
			// A real runtime's agent is frozen and would not answer: fail the dial instead of
			// hanging, and count it for tests (PausedDials).
			return nil, errcode.New(errcode.SandboxNotRunning, "sandbox %s is paused: its agent cannot answer until it is resumed", id)
		}
		return guest.DialUnix(ctx, sock, func(c unix.Ucred) error {
			if c.Pid == self {
				return nil
			}
			return errcode.Wrap(errcode.SandboxNotRunning, &runtime.AgentPeerError{ID: id, PeerPID: c.Pid, WantPID: self},
				"sandbox %s: its agent socket is held by another process, not the sandbox's agent; destroy the sandbox", id)
		})
	}, nil
}

// Adopt checks that the sandbox is the one h names ("" names any) and is running.
func (r *Runtime) Adopt(ctx context.Context, id string, h runtime.Handle) error {
	if err := r.begin(ctx, OpAdopt, id); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	sb := r.get(id)
	if sb == nil {
		return errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	if h != "" && h != sb.handle {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s of runtime %s is not the sandbox on record (handle %s, not %s); destroy it", id, r.name, sb.handle, h)
	}
	if st, _ := r.stateNoFault(id); st != runtime.StatusRunning {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s of runtime %s is %s, not running; destroy it", id, r.name, st)
	}
	return nil
}

// get returns sandbox id, or nil.
func (r *Runtime) get(id string) *sandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sandboxes[id]
}

func (r *Runtime) stateNoFault(id string) (runtime.Status, error) {
	sb := r.get(id)
	if sb == nil {
		return runtime.StatusAbsent, nil
	}
	select {
	case <-sb.exited:
		return runtime.StatusStopped, nil
	default:
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return sb.status, nil
}

// Wait blocks until the sandbox's agent has exited (a created sandbox's, once it is started
// and exits, or it is stopped or deleted) or ctx ends. An absent sandbox returns at once.
func (r *Runtime) Wait(ctx context.Context, id string) error {
	if err := r.begin(ctx, OpWait, id); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	sb := r.get(id)
	if sb == nil {
		return nil
	}
	select {
	case <-sb.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DisksMiB is what the sandboxes' directories hold on the host (allocated blocks).
func (r *Runtime) DisksMiB(ctx context.Context) (int64, error) {
	var bytes int64
	err := filepath.WalkDir(r.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var st unix.Stat_t
		if d.Type().IsRegular() && unix.Lstat(p, &st) == nil {
			bytes += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return bytes >> 20, nil
}

// maxMetricsEntries bounds the walk Metrics makes of a sandbox's directory.
const maxMetricsEntries = 100_000

// Metrics measures what the fake can honestly measure of a running sandbox: the space its
// directory takes (allocated blocks). Its commands are this process's children, not in a cgroup
// of their own, so cpu, memory and pids are not measured (nil, named in Unsupported); the disk
// has no size (disk_mb is ignored), so TotalBytes is 0.
func (r *Runtime) Metrics(ctx context.Context, id string) (runtime.Metrics, error) {
	if err := r.begin(ctx, OpMetrics, id); err != nil {
		return runtime.Metrics{}, err
	}
	if err := checkID(id); err != nil {
		return runtime.Metrics{}, err
	}
	st, err := r.stateNoFault(id)
	if err != nil {
		return runtime.Metrics{}, err
	}
	switch st {
	case runtime.StatusAbsent:
		return runtime.Metrics{}, errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist", id)
	case runtime.StatusRunning:
	default:
		return runtime.Metrics{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s", id, st)
	}
	var used int64
	n := 0
	err = filepath.WalkDir(r.sandboxDir(id), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if n++; n > maxMetricsEntries {
			return fmt.Errorf("more than %d entries", maxMetricsEntries)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var st unix.Stat_t
		if d.Type().IsRegular() && unix.Lstat(p, &st) == nil {
			used += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		return runtime.Metrics{}, errcode.Wrap(errcode.UnsupportedOp, err, "cannot measure sandbox %s's directory", id)
	}
	return runtime.Metrics{SampledAt: time.Now().UTC(), Disk: &runtime.DiskMetrics{UsedBytes: used},
		Unsupported: []string{"cpu", "memory", "pids"}}, nil
}

// Close releases nothing: the fake has no host-wide resources, and sandboxes keep running (as a
// real runtime's do) for a restarted service to adopt. Shutdown ends them.
func (r *Runtime) Close(ctx context.Context) error { return ctx.Err() }

// Shutdown deletes every sandbox and, if New made Dir, removes it: for a test's cleanup.
func (r *Runtime) Shutdown(ctx context.Context) error {
	var errs []error
	for _, id := range r.Resources() {
		errs = append(errs, r.remove(ctx, id))
	}
	if r.ownDir {
		errs = append(errs, os.RemoveAll(r.dir))
	}
	return errors.Join(errs...)
}

// RootfsFile is the name, in a sandbox's directory, of the JSON record of its Spec.Rootfs (an
// OCI image's layers, user and workdir): the fake mounts nothing, so its tests read what it
// was given here. UpperDir is its writable layer's directory (WritableLayer), empty at create.
const (
	RootfsFile = "rootfs.json"
	UpperDir   = "upper"
)

func writeRootfs(dir string, rfs *runtime.Rootfs) error {
	b, err := json.Marshal(rfs)
	if err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, UpperDir), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, RootfsFile), b, 0o644)
}

// Rootfs returns the Spec.Rootfs sandbox id was created with (nil for the host image or an
// unknown sandbox).
func (r *Runtime) Rootfs(id string) *runtime.Rootfs {
	if checkID(id) != nil {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(r.sandboxDir(id), RootfsFile))
	if err != nil {
		return nil
	}
	var rfs runtime.Rootfs
	if json.Unmarshal(b, &rfs) != nil {
		return nil
	}
	return &rfs
}

// WritableLayer returns the sandbox's upper directory (Dir/<id>/upper): a plain directory the
// fake's commands do not write (they run in the workspace), which tests fill themselves. The
// ids are as they are (IDMap Count 0). A sandbox of the host image has none: UNSUPPORTED_OPERATION.
func (r *Runtime) WritableLayer(ctx context.Context, id string) (runtime.WritableLayer, error) {
	if err := r.begin(ctx, OpLayer, id); err != nil {
		return runtime.WritableLayer{}, err
	}
	if err := checkID(id); err != nil {
		return runtime.WritableLayer{}, err
	}
	if r.get(id) == nil {
		return runtime.WritableLayer{}, errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	dir := filepath.Join(r.sandboxDir(id), UpperDir)
	if _, err := os.Stat(dir); err != nil {
		return runtime.WritableLayer{}, errcode.New(errcode.UnsupportedOp, "sandbox %s has no writable layer in the fake runtime (it runs the host image)", id)
	}
	return runtime.WritableLayer{Dir: dir, Exclude: []string{"/.agentbox", "/workspace", "/tmp"}}, nil
}

// Pause marks a running sandbox paused (runtime.Pauser); pausing a paused one is nil. An
// unknown sandbox is SANDBOX_NOT_FOUND, one not running SANDBOX_NOT_RUNNING.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.setPaused(ctx, OpPause, id, true)
}

// Resume clears the mark Pause set; resuming a sandbox that is not paused is nil.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.setPaused(ctx, OpResume, id, false)
}

func (r *Runtime) setPaused(ctx context.Context, op Op, id string, paused bool) error {
	if err := r.begin(ctx, op, id); err != nil {
		return err
	}
	if err := checkID(id); err != nil {
		return err
	}
	sb := r.get(id)
	if sb == nil {
		return errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	if st, _ := r.stateNoFault(id); paused && st != runtime.StatusRunning {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s of runtime %s is %s, not running", id, r.name, st)
	}
	r.mu.Lock()
	sb.paused = paused
	r.mu.Unlock()
	return nil
}

// Paused reports whether sandbox id is paused (Pause without a Resume since).
func (r *Runtime) Paused(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[id]
	return sb != nil && sb.paused
}

// PausedDials is how many times a paused sandbox's agent was dialled.
func (r *Runtime) PausedDials() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pausedDials
}
