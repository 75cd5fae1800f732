package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandboxid"
	"github.com/agentbox/agentbox/internal/statedir"
)

// Timeouts of the OCI runtime's commands (the caller's ctx may be shorter).
const (
	commandTimeout = 30 * time.Second
	stopTimeout    = 10 * time.Second
	// minMemoryMB is the smallest memory limit a sandbox may ask for: the agent needs room.
	minMemoryMB = 32
)

// Runtime is a runtime.Runtime backed by an OCI runtime's command line.
type Runtime struct {
	name        string
	flavor      Flavor
	binary      string
	root        string
	guestBinary string
	log         *slog.Logger
	caps        runtime.Capabilities

	hostRlimits  hostinfo.Rlimits
	swap         bool
	oomScoreAdj  int
	layout       hostLayout
	cgroupMounts []string
	cgroupParent string
	reap         bool
	disks        *diskTemplates // formatted disk images, one per size (disk_linux.go)
	// transparent: egress sandboxes get the runtime's own network namespace (netns_linux.go).
	transparent bool
	// overlay: every sandbox's root is its own overlay with a writable layer on its disk
	// (rootfs_linux.go), and OCI images run; else caps.OCIImageReason says why not and image
	// host keeps the shared read-only root.
	overlay bool

	// Per flavour (flavor_linux.go).
	globalArgs []string // before every command: --root and the flavour's flags
	emptyFile  string   // crun on a hybrid host: bound over cgroup.controllers
	platform   string   // gVisor's platform
	hostUDS    string   // gVisor's --host-uds
	ociSeccomp bool     // runsc applies the spec's seccomp profile
	pidMax     int64    // the host's kernel.pid_max (gVisor's pids backstop)
	// memoryCgroup is the cgroup v1 memory hierarchy's mount ("" without one): gVisor's OOM
	// guard (oomguard_linux.go) needs its thresholds.
	memoryCgroup string
	seccomp      *specs.LinuxSeccomp // generated once from the capability set

	hierState // the cgroup hierarchies Metrics reads (metrics_linux.go)

	mu     sync.Mutex
	guards map[string]*oomGuard // gVisor's OOM guards by sandbox id
	rootfs string               // set once the shared rootfs is prepared
	// guestPath is the guest binary sandboxes bind, installed under Root by ensureLayout.
	guestPath string
}

var (
	_ runtime.Runtime       = (*Runtime)(nil)
	_ runtime.Runner        = (*Runtime)(nil)
	_ runtime.Adopter       = (*Runtime)(nil)
	_ runtime.Waiter        = (*Runtime)(nil)
	_ runtime.DiskAccounter = (*Runtime)(nil)
	_ runtime.Closer        = (*Runtime)(nil)
	_ runtime.Committer     = (*Runtime)(nil)
)

// New probes the host and the OCI runtime. It fails only for an invalid Config; a runtime
// that cannot work here is returned with Capabilities().Available false and the Reason, and
// its Create says the same.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	flavor, err := flavorFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("oci %s: %w", cfg.Name, err)
	}
	if cfg.Name == "" {
		cfg.Name = string(flavor)
	}
	if cfg.Binary == "" {
		cfg.Binary = flavor.Binary()
	}
	if !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("oci %s: Root %q must be an absolute path", cfg.Name, cfg.Root)
	}
	root := filepath.Clean(cfg.Root)
	if len(root) > maxRootLen {
		return nil, fmt.Errorf("oci %s: Root %q is %d bytes; at most %d fit the agent's unix socket path", cfg.Name, root, len(root), maxRootLen)
	}
	if !filepath.IsAbs(cfg.GuestBinary) {
		return nil, fmt.Errorf("oci %s: GuestBinary %q must be an absolute path", cfg.Name, cfg.GuestBinary)
	}
	if cfg.CgroupParent == "" {
		id, err := statedir.Identity(root)
		if err != nil {
			return nil, fmt.Errorf("oci %s: %w", cfg.Name, err)
		}
		cfg.CgroupParent = id
	}
	if !parentPattern.MatchString(cfg.CgroupParent) {
		return nil, fmt.Errorf("oci %s: CgroupParent %q must be one path component of letters, digits, '.', '_' or '-'", cfg.Name, cfg.CgroupParent)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runtime{
		name:         cfg.Name,
		flavor:       flavor,
		root:         root,
		guestBinary:  filepath.Clean(cfg.GuestBinary),
		cgroupParent: cfg.CgroupParent,
		log:          log.With("runtime", cfg.Name),
		caps: runtime.Capabilities{
			Name:         cfg.Name,
			Isolation:    flavor.isolation(),
			NetworkModes: append([]string(nil), networkModes...),
			Images:       []string{ImageHost},
			Hardening:    append([]string(nil), hardening...),
		},
	}
	if reason := r.probe(ctx, cfg); reason != "" {
		r.caps.Reason = reason
		r.log.Info("runtime unavailable", "reason", reason)
		return r, nil
	}
	if reason := r.probeUserNamespaces(); reason != "" {
		r.caps.Reason = reason
		r.log.Info("runtime unavailable", "reason", reason)
		return r, nil
	}
	r.caps.Hardening = append(r.flavorHardening(), r.usernsHardeningEntries()...)
	if reason := r.probeOverlay(); reason != "" {
		r.caps.OCIImageReason = reason
		r.log.Warn("no overlay roots on this host: image host keeps a read-only root and OCI images cannot run", "reason", reason)
		r.caps.Hardening = slices.DeleteFunc(r.caps.Hardening, func(h string) bool { return h == overlayHardening })
		r.caps.Hardening = append(r.caps.Hardening, "readonly-rootfs")
	} else {
		r.overlay = true
		r.caps.Images = append(r.caps.Images, runtime.ImageOCI)
	}
	if r.flavor != FlavorGVisor {
		if reason := probeEgressNetns(); reason != "" {
			r.caps.TransparentEgressReason = "cannot make a network namespace for the transparent egress path (egress sandboxes get the proxy path only): " + reason
			r.log.Warn("no transparent egress path", "reason", reason)
		} else {
			r.transparent = true
			r.caps.Hardening = append(r.caps.Hardening, runtime.HardeningTransparentEgress)
		}
	}
	// Files snapshots need only the sandbox's disk (probed above); memory ones are the
	// flavour's (saveMemory, memorySnapshotReason).
	r.caps.Snapshots = []string{runtime.SnapshotFiles}
	r.caps.MemorySnapshotReason = memoryReasonFor(r.flavor)
	r.sweepSnapMounts()
	r.caps.Available = true
	r.probeMemorySnapshots(ctx) // checkpoint_linux.go
	return r, nil
}

// probe fills what New learns about the host; it returns why the runtime cannot work, or "".
func (r *Runtime) probe(ctx context.Context, cfg Config) string {
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return fmt.Sprintf("%s binary %q not found (install it: %s): %v", cfg.Name, cfg.Binary, r.flavor.InstallHint(), err)
	}
	r.binary = bin
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(vctx, bin, "--version").Output()
	if err != nil {
		return fmt.Sprintf("%s --version failed: %v", bin, err)
	}
	r.caps.Version = parseVersion(string(out))
	if os.Geteuid() != 0 {
		return fmt.Sprintf("%s needs root (this process runs as uid %d)", cfg.Name, os.Geteuid())
	}
	mode, err := hostinfo.CgroupMode()
	if err != nil {
		return err.Error()
	}
	r.caps.CgroupMode = mode
	mounts, err := hostinfo.CgroupMounts()
	if err != nil {
		return err.Error()
	}
	for _, m := range mounts {
		r.cgroupMounts = append(r.cgroupMounts, m.Path)
		if m.Version == 1 && slices.Contains(m.Options, "memory") {
			r.memoryCgroup = m.Path
		}
	}
	r.swap = swapSupported(mounts, mode)
	// Docker's default profile depends on the capability set, the same for every sandbox.
	if r.seccomp, err = seccompProfile(buildSpec(specInput{})); err != nil {
		return err.Error()
	}
	if reason := r.probeFlavor(ctx, mode); reason != "" {
		return reason
	}
	if r.hostRlimits, err = hostinfo.HardRlimits(); err != nil {
		return err.Error()
	}
	fi, err := os.Stat(r.guestBinary)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return fmt.Sprintf("guest binary %s is not an executable file (%v)", r.guestBinary, err)
	}
	if fi, err := os.Stat("/usr"); err != nil || !fi.IsDir() {
		return "image host needs the host's /usr directory"
	}
	mkfs, reason := probeDisk()
	if reason != "" {
		return reason
	}
	r.disks = newDiskTemplates(filepath.Join(r.root, "disk-templates"), mkfs)
	r.layout = probeHostLayout("/")
	own, capable := ownOOMScoreAdj()
	r.oomScoreAdj = oomScoreAdjFor(capable, own)
	if r.oomScoreAdj != agentOOMScoreAdj {
		r.log.Warn("cannot shield the guest agent from the OOM killer: this process lacks CAP_SYS_RESOURCE",
			"oom_score_adj", r.oomScoreAdj)
	}
	if cfg.Subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Sprintf("cannot become a child subreaper: %v", err)
		}
		r.reap = true
	}
	return ""
}

// Name returns the runtime's name.
func (r *Runtime) Name() string { return r.name }

// Capabilities reports what New found.
func (r *Runtime) Capabilities() runtime.Capabilities {
	c := r.caps
	c.NetworkModes = append([]string(nil), r.caps.NetworkModes...)
	c.Hardening = append([]string(nil), r.caps.Hardening...)
	c.Images = append([]string(nil), r.caps.Images...)
	c.Snapshots = append([]string(nil), r.caps.Snapshots...)
	return c
}

func (r *Runtime) stateDir() string            { return filepath.Join(r.root, "state") }
func (r *Runtime) sandboxDir(id string) string { return filepath.Join(r.root, "sandboxes", id) }

// SocketPath is where the host reaches the agent of sandbox id.
func (r *Runtime) SocketPath(id string) string {
	return filepath.Join(r.sandboxDir(id), "run", "agent.sock")
}

func (r *Runtime) checkAvailable() error {
	if !r.caps.Available {
		return errcode.New(errcode.RuntimeUnavailable, "runtime %s is not available on this host: %s", r.name, r.caps.Reason)
	}
	return nil
}

func checkID(id string) error { return sandboxid.Check(id) }

// ensureLayout creates Root's directories and the shared rootfs, once per Runtime.
func (r *Runtime) ensureLayout() (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rootfs != "" {
		return r.rootfs, nil
	}
	for _, d := range []string{r.root, r.stateDir(), filepath.Join(r.root, "sandboxes"), filepath.Join(r.root, "rootfs"), r.netnsDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot create the %s runtime's directories on the host; the server log has the cause", r.name)
		}
	}
	// Sandboxes' root, an unprivileged host user in a user namespace, must reach what they bind.
	if err := r.makeSearchable(); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot make the %s runtime's directories searchable", r.name)
	}
	guestPath, err := r.installGuest()
	if err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot install the guest binary into the %s runtime's directory; the server log has the cause", r.name)
	}
	rootfs, err := ensureRootfs(filepath.Join(r.root, "rootfs"), "/", r.layout)
	if err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot prepare the root file system of image %s", ImageHost)
	}
	r.guestPath = guestPath
	r.rootfs = rootfs
	return rootfs, nil
}

func (r *Runtime) validateSpec(spec runtime.Spec) error {
	if err := checkID(spec.ID); err != nil {
		return err
	}
	switch {
	case spec.Rootfs != nil && !r.overlay:
		return errcode.New(errcode.InvalidArgument, "runtime %s cannot run OCI images on this host (%s); supported images: %s", r.name, r.caps.OCIImageReason, ImageHost).With("supported_images", []string{ImageHost})
	case spec.Rootfs != nil:
		if spec.Image == "" || spec.Image == ImageHost {
			return errcode.New(errcode.InvalidArgument, "image %q cannot have rootfs layers: name the OCI image they come from", spec.Image)
		}
		if err := validateRootfs(spec.Rootfs); err != nil {
			return err
		}
	case spec.Image != "" && spec.Image != ImageHost:
		return errcode.New(errcode.InvalidArgument, "image %q has no rootfs layers; supported images: %s, or an OCI image's layers", spec.Image, ImageHost).With("supported_images", r.caps.Images)
	}
	if spec.CPU < 0 || spec.CPU > 1024 {
		return errcode.New(errcode.InvalidArgument, "cpu %g must be between 0 (unlimited) and 1024 cores", spec.CPU)
	}
	if spec.MemoryMB < 0 || (spec.MemoryMB > 0 && spec.MemoryMB < minMemoryMB) {
		return errcode.New(errcode.InvalidArgument, "memory_mb %d must be 0 (unlimited) or at least %d", spec.MemoryMB, minMemoryMB)
	}
	if spec.DiskMB < 0 || (spec.DiskMB > 0 && spec.DiskMB < minDiskMB) || spec.DiskMB > maxDiskMB {
		return errcode.New(errcode.InvalidArgument, "disk_mb %d must be 0 (the default, %d) or between %d and %d", spec.DiskMB, DefaultDiskMB, minDiskMB, maxDiskMB)
	}
	if spec.PidsLimit < 0 {
		return errcode.New(errcode.InvalidArgument, "pids_limit %d must be 0 (unlimited) or positive", spec.PidsLimit)
	}
	if err := validateEnv(spec.Env); err != nil {
		return errcode.New(errcode.InvalidArgument, "%s", err.Error())
	}
	if err := runtime.CheckNetwork(spec.Network, networkModes); err != nil {
		return err
	}
	return runtime.CheckCABundle(spec.CABundle)
}

// networkModes are the network modes every flavour gives a sandbox: none (a network namespace
// with loopback only; gVisor: runsc --network=none, per sandbox) and egress (the same, with
// /etc/resolv.conf naming 127.0.0.1, the CA bundle at runtime.CABundlePath and, on runc and
// crun where the host allows, the transparent path: netns_linux.go).
var networkModes = []string{runtime.NetworkNone, runtime.NetworkEgress}

// egressResolvConf is an egress sandbox's /etc/resolv.conf: the agent answers DNS on
// 127.0.0.1:53 (UDP and TCP).
const egressResolvConf = "nameserver 127.0.0.1\noptions ndots:0 attempts:2 timeout:2\n"

// Files of an egress sandbox in its bundle, bound read-only into it.
const (
	resolvConfName = "resolv.conf"
	// caDirName holds ca-bundle.pem, bound at /etc/agentbox (path.Dir(runtime.CABundlePath)).
	caDirName = "etc-agentbox"
)

// prepareEgress writes an egress sandbox's resolv.conf and CA bundle into its bundle dir and,
// with the transparent path, makes its network namespace; it fills in's fields for them.
func (r *Runtime) prepareEgress(spec runtime.Spec, dir string, in *specInput) error {
	if spec.Network != runtime.NetworkEgress {
		return nil
	}
	resolv := filepath.Join(dir, resolvConfName)
	if err := os.WriteFile(resolv, []byte(egressResolvConf), 0o644); err != nil {
		return fmt.Errorf("write resolv.conf: %w", err)
	}
	in.ResolvConf = resolv
	if len(spec.CABundle) > 0 {
		caDir := filepath.Join(dir, caDirName)
		if err := os.Mkdir(caDir, 0o755); err != nil {
			return fmt.Errorf("make the CA bundle's directory: %w", err)
		}
		if err := os.WriteFile(filepath.Join(caDir, filepath.Base(runtime.CABundlePath)), spec.CABundle, 0o444); err != nil {
			return fmt.Errorf("write the CA bundle: %w", err)
		}
		in.CADir = caDir
	}
	if r.transparent {
		if err := makeEgressNetns(r.netnsPath(spec.ID)); err != nil {
			return fmt.Errorf("make the network namespace: %w", err)
		}
		in.NetNSPath = r.netnsPath(spec.ID)
	}
	return nil
}

// Create writes the bundle and creates the container; its init (the agent) waits for Start.
// Image "" means "host". On failure nothing of the sandbox is left behind. The Handle names the
// container's init (init_linux.go).
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	return r.create(ctx, spec, false)
}

// Run is Create and Start in one invocation of the OCI runtime (`run --detach`).
func (r *Runtime) Run(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	return r.create(ctx, spec, true)
}

func (r *Runtime) create(ctx context.Context, spec runtime.Spec, start bool) (h runtime.Handle, err error) {
	steps := runtime.NewSteps(ctx)
	defer func() { steps.Done(err) }()
	steps.Next(runtime.StepLayout)
	if err := r.checkAvailable(); err != nil {
		return "", err
	}
	if err := r.validateSpec(spec); err != nil {
		return "", err
	}
	if err := r.checkIDMap(spec.IDMap); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	rootfs, err := r.ensureLayout()
	if err != nil {
		return "", err
	}
	diskMB := spec.DiskMB
	if diskMB == 0 {
		diskMB = DefaultDiskMB
	}
	if spec.Snapshot != nil {
		if diskMB, err = r.checkSnapshotSource(spec); err != nil {
			return "", err
		}
		if spec.Snapshot.Memory && !start {
			return "", errcode.New(errcode.InvalidArgument, "a memory restore creates and starts the sandbox in one step (Run), never Create then Start").With("argument", "snapshot")
		}
	}
	restoring := spec.Snapshot != nil && spec.Snapshot.Memory
	if err := r.checkDiskSpace(diskMB); err != nil {
		return "", err
	}
	id, dir := spec.ID, r.sandboxDir(spec.ID)
	steps.Next(runtime.StepDir)
	userns := r.startUserns(spec.IDMap)
	defer userns.close()
	if err := os.Mkdir(dir, 0o711); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return "", errcode.New(errcode.Conflict, "sandbox %s already exists in runtime %s; delete it first", id, r.name)
		}
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot create the bundle of sandbox %s", id)
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commandTimeout)
			defer cancel()
			if derr := r.Delete(cctx, id); derr != nil {
				r.log.Error("cleanup after failed create", "sandbox_id", id, "err", derr)
			}
		}
	}()
	if err := r.closeSandboxDir(dir, spec.IDMap); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot close the directory of sandbox %s to other host users", id)
	}
	if err := recordIDMap(dir, spec.IDMap); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot record the id range of sandbox %s", id)
	}
	steps.Next(runtime.StepDisk)
	if spec.Snapshot != nil {
		if err := r.diskFromSnapshot(ctx, dir, spec.Snapshot, spec.IDMap); err != nil {
			return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot make the disk of sandbox %s from its snapshot", id)
		}
	} else if err := r.makeDisk(steps.Context(), dir, diskMB); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot make the %d MiB disk of sandbox %s", diskMB, id)
	}
	if err := makeSandboxDirs(dir); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot create the directories of sandbox %s", id)
	}
	in := specInput{
		ID: id, CgroupParent: r.cgroupParent, Rootfs: rootfs, SandboxDir: dir, GuestBinary: r.guestPath,
		CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: diskMB, PidsLimit: spec.PidsLimit, Env: spec.Env,
		HostRlimits: r.hostRlimits, Swap: r.swap, OOMScoreAdj: r.oomScoreAdj, HostBinds: r.layout.Binds,
		Seccomp: r.seccomp,
	}
	lowers, hostBinds := []string{rootfs}, r.layout.Binds
	if spec.Rootfs != nil {
		lowers, hostBinds = spec.Rootfs.Layers, nil // the image's own /usr
		in.OCIImage, in.GuestUser, in.GuestWorkdir = true, spec.Rootfs.User, spec.Rootfs.Workdir
		in.HostBinds = nil
	}
	if r.overlay {
		in.Rootfs, in.WritableRoot = filepath.Join(dir, rootfsMountName), true
		// Image host's /usr and friends: each an overlay of its own, writable by the sandbox's root.
		in.HostBinds = hostBindOverlays(dir, hostBinds)
	}
	in.UIDMappings, in.GIDMappings = r.flavor.idMappings(spec.IDMap)
	steps.Next(runtime.StepNetwork)
	if err := r.prepareEgress(spec, dir, &in); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot prepare the egress network of sandbox %s; the server log has the cause", id)
	}
	steps.Next(runtime.StepBundle)
	r.adjustSpec(&in)
	s := buildSpec(in)
	// After the directories (and the disk holding them) exist: the sandbox's users own them.
	if err := ownWritableBinds(s, spec.IDMap); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot give sandbox %s its directories", id)
	}
	// Only the sandbox's root (and host root) may enter its disk: no other host user reads a
	// workspace, whatever modes the sandbox gives its files.
	if err := closeDisk(filepath.Join(dir, "disk"), spec.IDMap); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot close the disk of sandbox %s to other host users", id)
	}
	steps.Next(runtime.StepMounts)
	if spec.IDMap.Count > 0 && !r.flavor.mapsIDs() {
		if err := mountIDMappedView(filepath.Join(dir, diskMountName), filepath.Join(dir, viewMountName), spec.IDMap); err != nil {
			return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot give sandbox %s an id-mapped view of its disk", id)
		}
		viewBinds(s, dir)
	}
	if r.overlay {
		if err := r.mountSandboxRootfs(dir, lowers, hostBinds, spec.Rootfs == nil, spec.IDMap, userns, s); err != nil {
			return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot mount the root file system of sandbox %s; the server log has the cause", id)
		}
	}
	if restoring {
		if err := checkRestoreSpec(spec.Snapshot, s); err != nil {
			return "", err
		}
	}
	steps.Next(runtime.StepCreate) // the spec written, the log opened, the OCI runtime's create (or run)
	data, err := json.Marshal(s)
	if err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "cannot encode the OCI spec of sandbox %s", id)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot write the OCI spec of sandbox %s", id)
	}
	// On the sandbox's disk: the agent writes it, and what a workload makes it log is bounded.
	logPath := filepath.Join(dir, diskMountName, "guest.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot create the log of sandbox %s", id)
	}
	// The container inherits stdout and stderr and keeps them open: files, never pipes.
	// Stdin is an empty pipe (newCmd).
	cctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	began := time.Now()
	verb := []string{"create"}
	if start {
		verb = []string{"run", "--detach"}
	}
	if restoring {
		verb = restoreVerb(spec.Snapshot) // checkpoint_linux.go
		cctx, cancel = context.WithTimeout(ctx, checkpointTimeout)
		defer cancel()
	}
	cmd := r.newCmd(cctx, append(append(r.createFlags(spec), verb...), "--bundle", dir, "--pid-file", filepath.Join(dir, "init.pid"), id)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	runErr := r.startCreate(cmd)
	if runErr == nil {
		runErr = cmd.Wait()
	}
	logf.Close()
	r.log.Debug(verb[0], "sandbox_id", id, "took", time.Since(began), "err", runErr)
	if runErr != nil {
		msg := runtimeMessage(readTail(logPath, 4096))
		if cctx.Err() != nil {
			msg = fmt.Sprintf("timed out: %v; %s", cctx.Err(), msg)
		}
		// The runtime's own words name host paths and internals: the log and the cause keep
		// them, the caller is told what failed and what to do.
		r.log.Warn("runtime create failed", "sandbox_id", id, "verb", verb[0], "err", runErr, "runtime_error", msg)
		return "", errcode.Wrap(errcode.RuntimeUnavailable, fmt.Errorf("%s %s: %w: %s", r.name, verb[0], runErr, msg),
			"%s could not create sandbox %s; the server log has the runtime's error (run `agentbox doctor` if it persists)", r.name, id)
	}
	steps.Next(runtime.StepAfter)
	r.afterCreate(id)
	if err := r.prepareOOMGuard(id, in.MemoryMB); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot prepare the OOM guard of sandbox %s", id)
	}
	h, err = r.recordInit(id)
	if err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot record the init process of sandbox %s", id)
	}
	if start {
		r.guardMemory(id)
	}
	if restoring {
		if err := r.afterRestore(ctx, id); err != nil {
			return "", err
		}
	}
	return h, nil
}

// makeSandboxDirs makes the run symlink that keeps the agent's socket path short. The
// sandbox's writable directories (disk/run, disk/root, disk/workspace, disk/home) come with its
// disk, whose template holds them (diskDirs: formatting them in once saves every create the
// metadata reads of making them); ownWritableBinds gives them to the sandbox's users once the
// spec is built.
func makeSandboxDirs(dir string) error {
	return os.Symlink(filepath.Join(diskMountName, "run"), filepath.Join(dir, "run"))
}

// Start starts the agent; it does not wait for it to listen.
func (r *Runtime) Start(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := r.checkAvailable(); err != nil {
		return err
	}
	_, end := runtime.Step(ctx, runtime.StepStart)
	_, err := r.command(ctx, "start", id)
	end(err)
	if err != nil {
		return r.classify(err, "start", id)
	}
	r.guardMemory(id)
	return nil
}

// Stop kills the sandbox's init, which takes down its whole PID namespace, and waits until
// it is gone. Stopping a stopped sandbox is nil; an unknown one is SANDBOX_NOT_FOUND.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := r.checkAvailable(); err != nil {
		return err
	}
	if _, err := r.command(ctx, "kill", id, "KILL"); err != nil && !r.stopFallback(id, err) {
		var ce *commandError
		// runc says "not running"; crun "No such process" once the init is gone.
		if errors.As(err, &ce) && (strings.Contains(ce.msg, "not running") || strings.Contains(ce.msg, "No such process")) {
			return nil
		}
		return r.classify(err, "stop", id)
	}
	if r.frozen(id) {
		// A paused sandbox's tasks take the SIGKILL only once thawed (crun does not thaw it).
		if _, err := r.command(ctx, "resume", id); err != nil {
			r.log.Warn("resume a paused sandbox to stop it", "sandbox_id", id, "err", err)
		}
	}
	pid := readPid(filepath.Join(r.sandboxDir(id), "init.pid"))
	if pid <= 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, stopTimeout)
	defer cancel()
	for !r.initGone(pid) {
		select {
		case <-wctx.Done():
			r.log.Warn("sandbox init still alive after SIGKILL", "sandbox_id", id, "pid", pid, "waited", stopTimeout)
			return errcode.New(errcode.RuntimeUnavailable, "sandbox %s did not stop within %s of SIGKILL; retry", id, stopTimeout)
		case <-time.After(2 * time.Millisecond):
		}
	}
	r.reapHelpers(wctx, id)
	return nil
}

// Delete removes the container (killing it if needed), its cgroups under every hierarchy,
// and its bundle. It is idempotent.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	r.unguardMemory(id)
	r.limits.Delete(id) // Metrics' cache
	dir := r.sandboxDir(id)
	pid := readPid(filepath.Join(dir, "init.pid"))
	if r.binary != "" {
		if r.stateExists(id) {
			// Kill first: runc's delete --force polls a killed init only every 100 ms.
			if err := r.Stop(ctx, id); err != nil {
				r.log.Debug("stop before delete", "sandbox_id", id, "err", err)
			}
			stopReaping := r.reapDuring(id, pid)
			_, err := r.command(ctx, "delete", "--force", id)
			stopReaping()
			if err != nil && !isNotExist(err) {
				return r.classify(err, "delete", id)
			}
			// What a crashed create may leave where the runtime no longer sees a container.
			if err := r.removeState(id); err != nil {
				return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot remove the runtime state of sandbox %s", id)
			}
		}
	}
	if pid > 0 {
		r.initGone(pid)
	}
	r.reapHelpers(ctx, id)
	if err := r.removeCgroups(ctx, id); err != nil {
		return err
	}
	// The root's overlay and its lowers go before the disk that holds its upper layer.
	if err := unmountRootfs(dir); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot unmount the root file system of sandbox %s; retry", id)
	}
	if err := r.removeDisk(ctx, id); err != nil {
		return err
	}
	if err := netnsRemove(r.netnsPath(id)); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot remove the network namespace of sandbox %s", id)
	}
	if err := os.RemoveAll(dir); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot remove the bundle of sandbox %s", id)
	}
	return nil
}

// State reports what the OCI runtime says of the container.
func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	if !r.stateExists(id) || r.binary == "" {
		return runtime.StatusAbsent, nil
	}
	out, err := r.command(ctx, "state", id)
	if err != nil {
		if isNotExist(err) {
			return runtime.StatusAbsent, nil
		}
		return "", r.classify(err, "state", id)
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot parse %s state of sandbox %s", r.name, id)
	}
	switch st.Status {
	case "creating", "created":
		return runtime.StatusCreated, nil
	case "running", "paused":
		// runsc (and a runtime racing a death) can say running about an init that has exited
		// and waits, a zombie, for its parent (this server, a subreaper) to collect it.
		if ref, ok := r.initOf(id); ok && ref.start != 0 && !ref.alive() {
			return runtime.StatusStopped, nil
		}
		return runtime.StatusRunning, nil
	case "stopped":
		return runtime.StatusStopped, nil
	}
	return "", errcode.New(errcode.RuntimeUnavailable, "%s reports unknown status %q for sandbox %s", r.name, st.Status, id)
}

// List returns every id with any host resource: a container the OCI runtime knows, a bundle
// directory, a cgroup under any hierarchy, a mount or a loop device of its disk, a network
// namespace file.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	if r.binary != "" {
		if _, err := os.Stat(r.stateDir()); err == nil {
			out, err := r.command(ctx, "list", "--quiet")
			for attempt := 0; err != nil && isNotExist(err) && attempt < 5; attempt++ {
				// runc list fails when a container is deleted while it lists them: list again.
				out, err = r.command(ctx, "list", "--quiet")
			}
			if err != nil {
				return nil, r.classify(err, "list", "")
			}
			for _, id := range strings.Fields(string(out)) {
				seen[id] = true
			}
		}
	}
	dirs := []string{filepath.Join(r.root, "sandboxes")}
	for _, mnt := range r.cgroupMounts {
		dirs = append(dirs, filepath.Join(mnt, r.cgroupParent))
	}
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot list the sandboxes of runtime %s; the server log has the cause", r.name)
		}
		for _, e := range ents {
			if e.IsDir() {
				seen[e.Name()] = true
			}
		}
	}
	nsFiles, err := os.ReadDir(r.netnsDir())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot list the sandboxes' network namespaces")
	}
	for _, e := range nsFiles {
		seen[e.Name()] = true
	}
	holders, err := r.diskHolders()
	if err != nil {
		return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot list the sandboxes' disks")
	}
	for _, id := range holders {
		seen[id] = true
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		if validID(id) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// closeSandboxDir makes the sandbox's directory its root's alone (0700, owned by the range's
// base, or host root without a range) where the runtime maps ids: the merged root overlay under
// it is not nosuid (an image's setuid binaries work inside), so no other host user may reach
// it. runc's and crun's init, the sandbox's root, still resolves the bundle's paths through it;
// host root passes any mode. gVisor's sandbox directory stays 0711 (its root overlay is nosuid).
func (r *Runtime) closeSandboxDir(dir string, m runtime.IDMap) error {
	if !r.flavor.mapsIDs() {
		return nil
	}
	uid, gid := 0, 0
	if m.Count > 0 {
		uid, gid = int(m.UIDBase), int(m.GIDBase)
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}
