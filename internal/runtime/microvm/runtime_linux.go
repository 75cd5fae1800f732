package microvm

import (
	"bufio"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	goruntime "runtime"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/microvm/vminit"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

// Runtime is the vm runtime.
type Runtime struct {
	cfg        Config
	log        *slog.Logger
	caps       runtime.Capabilities
	qemu       string
	modulesDir string
	busybox    string
	accel      string
	tscKHz     int64
	kvmReason  string
	cg         cgroups // why auto chose TCG over a present /dev/kvm

	assetsMu sync.Mutex // builds of the initramfs and image disks
	// bootSlots bounds the VMs booting at once to the host's cores: under emulation a boot is
	// CPU-bound, and more at once only slows every one of them (Start waits for a slot; the
	// slot is freed once the guest's agent answers the host's handshake, or the VM dies).
	bootSlots chan struct{}

	mu       sync.Mutex
	sessions map[string]*agentConn // the host's connection to each VM's agent
	locks    map[string]*sync.Mutex
}

// record is what Create writes to sandboxes/<id>/vm.json.
type record struct {
	ID       string  `json:"id"`
	Handle   string  `json:"handle"`
	CPUs     int     `json:"cpus"`
	CPU      float64 `json:"cpu"`
	MemoryMB int64   `json:"memory_mb"`
	DiskMB   int64   `json:"disk_mb"`
	Image    string  `json:"image"`
	// RootDisk is the image's read-only root disk (in the cache).
	RootDisk  string `json:"root_disk"`
	Initramfs string `json:"initramfs"`
	Kernel    string `json:"kernel"`
	Accel     string `json:"accel"`
	// UID and GID run the VM's QEMU: the base of the sandbox's id range (Config.UID and GID
	// when its Spec had none). A record from before they were kept has 0: Config's then.
	UID uint32 `json:"uid,omitempty"`
	GID uint32 `json:"gid,omitempty"`
	// IDMap is the sandbox's id range (its snapshots' SnapshotInfo.IDMap).
	IDMap runtime.IDMap `json:"id_map,omitzero"`
}

// owner is who runs the VM's QEMU and owns its disk, sockets and console.
func (r *Runtime) owner(rec record) (uid, gid uint32) {
	if rec.UID == 0 || rec.GID == 0 {
		return r.cfg.UID, r.cfg.GID
	}
	return rec.UID, rec.GID
}

// checkIDMap refuses an id range QEMU cannot run as (its base root's, or past uid_t).
func checkIDMap(m runtime.IDMap) error {
	if m.Count == 0 {
		return nil
	}
	if m.UIDBase == 0 || m.GIDBase == 0 || uint64(m.UIDBase)+uint64(m.Count) > 1<<32-1 || uint64(m.GIDBase)+uint64(m.Count) > 1<<32-1 {
		return errcode.New(errcode.InvalidArgument, "id range %d+%d / %d+%d is invalid: a VM's QEMU runs as its base, which must not be 0 (root), and the range must end below 2^32-1",
			m.UIDBase, m.Count, m.GIDBase, m.Count)
	}
	return nil
}

// proc is sandboxes/<id>/qemu.json: the QEMU process Start made, told from a later process of
// the same pid by its start time.
type proc struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

// defaultMemoryMB is a VM's RAM when a spec names none.
const defaultMemoryMB = 256

// minMemoryMB is the least RAM the guest kernel boots in.
const minMemoryMB = 128

// qemuOverheadMB is what QEMU itself takes beside the guest's RAM under TCG (the translation
// cache, its own heap): the cgroup's memory limit is RAM plus this.
const qemuOverheadMB = 192

// New probes the host and returns the runtime; an unusable one is returned with Available false
// and its reason (doctor shows it), never an error, unless the configuration itself is wrong.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if !filepath.IsAbs(cfg.Root) || len(cfg.Root) > maxRootLen {
		return nil, fmt.Errorf("vm runtime: root %q must be an absolute path of at most %d bytes", cfg.Root, maxRootLen)
	}
	if cfg.CgroupParent == "" || !parentPattern.MatchString(cfg.CgroupParent) {
		return nil, fmt.Errorf("vm runtime: cgroup parent %q must be one path component", cfg.CgroupParent)
	}
	switch cfg.Accel {
	case "":
		cfg.Accel = AccelAuto
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		return nil, errcode.New(errcode.InvalidArgument, "--vm-accel %q: it must be auto, kvm or tcg", cfg.Accel)
	}
	if cfg.Kernel == "" {
		cfg.Kernel = DefaultKernel
	}
	if cfg.UID == 0 {
		cfg.UID = 65534
	}
	if cfg.GID == 0 {
		cfg.GID = 65534
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runtime{cfg: cfg, log: log, sessions: map[string]*agentConn{}, locks: map[string]*sync.Mutex{},
		bootSlots: make(chan struct{}, max(1, goruntime.NumCPU()))}
	r.modulesDir = cfg.ModulesDir
	if r.modulesDir == "" {
		r.modulesDir = filepath.Join(filepath.Dir(cfg.Kernel), "modules")
	}
	r.caps = runtime.Capabilities{Name: Name, Isolation: runtime.IsolationVM, Images: []string{"host", runtime.ImageOCI}, HostIDPerSandbox: true,
		NetworkModes:            []string{runtime.NetworkNone, runtime.NetworkEgress},
		TransparentEgressReason: "a vm sandbox has no NIC: its egress is the agent's proxy path only",
		Snapshots:               []string{runtime.SnapshotFiles}, MemorySnapshotReason: memorySnapshotReason}
	if reason := r.probe(ctx); reason != "" {
		r.caps.Reason = reason
		return r, nil
	}
	for _, d := range []string{"sandboxes", "cache"} {
		if err := os.MkdirAll(filepath.Join(cfg.Root, d), 0o711); err != nil || os.Chmod(filepath.Join(cfg.Root, d), 0o711) != nil {
			return nil, fmt.Errorf("vm runtime: %w", err)
		}
	}
	if err := r.cgroupParent(); err != nil {
		r.caps.Reason = err.Error()
		return r, nil
	}
	r.caps.Available = true
	r.caps.Hardening = []string{
		"vm:qemu-microvm(accel=" + r.accel + ")",
		"qemu:sandbox-on(seccomp:obsolete,elevateprivileges,spawn,resourcecontrol=deny)",
		"qemu:unprivileged(uid=base-of-sandbox-id-range)",
		"cgroup:vm(memory=ram+overhead,cpu,pids)",
		"network:no-nic(egress:agent-proxy-only)",
	}
	return r, nil
}

// probe finds QEMU, the kernel, its modules, the guest binary and the tools the disks need,
// and picks the accelerator; it returns why the runtime cannot run ("" when it can).
func (r *Runtime) probe(ctx context.Context) string {
	q := r.cfg.QEMU
	if q == "" {
		q = "qemu-system-x86_64"
	}
	path, err := exec.LookPath(q)
	if err != nil {
		return fmt.Sprintf("no %s (install qemu-system-x86: make deps, or hack/vm-deps.sh)", q)
	}
	r.qemu = path
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return fmt.Sprintf("%s --version: %v", path, err)
	}
	r.caps.Version, _, _ = strings.Cut(strings.TrimPrefix(strings.TrimSpace(string(out)), "QEMU emulator version "), "\n")
	if _, err := os.Stat(r.cfg.Kernel); err != nil {
		return fmt.Sprintf("no guest kernel at %s (make deps unpacks Debian's cloud kernel there; or serve --vm-kernel PATH)", r.cfg.Kernel)
	}
	for _, m := range guestModules {
		if _, err := os.Stat(filepath.Join(r.modulesDir, m)); err != nil {
			return fmt.Sprintf("the guest kernel's module %s is not in %s", m, r.modulesDir)
		}
	}
	if r.cfg.GuestBinary == "" {
		return "no guest agent binary (agentbox-guest beside agentbox)"
	}
	if err := checkStatic(r.cfg.GuestBinary); err != nil {
		return fmt.Sprintf("guest agent binary: %v", err)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return "no mkfs.ext4 (install e2fsprogs)"
	}
	if _, err := exec.LookPath("debugfs"); err != nil {
		return "no debugfs (install e2fsprogs)"
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return "no busybox (install busybox-static): the host image's userland in a VM"
	}
	r.busybox = bb
	cg, err := detectCgroups()
	if err != nil {
		return err.Error()
	}
	r.cg = cg
	r.tscKHz = hostTSCkHz()
	accel, reason := r.pickAccel(ctx)
	if reason != "" {
		return reason
	}
	r.accel = accel
	return ""
}

// checkStatic fails unless path is a statically linked ELF executable: it is the VM's /init,
// with no dynamic loader or libraries beside it.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; the VM's /init must be static (build it with CGO_ENABLED=0, as make build does)", path)
		}
	}
	return nil
}

// Accel is the accelerator VMs run under ("kvm" or "tcg"; "" when unavailable).
func (r *Runtime) Accel() string { return r.accel }

// KVMReason says why auto chose TCG over a present /dev/kvm ("" otherwise).
func (r *Runtime) KVMReason() string { return r.kvmReason }

// Kernel is the guest kernel's path.
func (r *Runtime) Kernel() string { return r.cfg.Kernel }

func (r *Runtime) Name() string { return Name }

func (r *Runtime) Capabilities() runtime.Capabilities {
	c := r.caps
	c.Images = slices.Clone(c.Images)
	c.NetworkModes = slices.Clone(c.NetworkModes)
	c.Hardening = slices.Clone(c.Hardening)
	return c
}

func (r *Runtime) dir(id string) string { return filepath.Join(r.cfg.Root, "sandboxes", id) }

// lock serialises the lifecycle calls on one id.
func (r *Runtime) lock(id string) func() {
	r.mu.Lock()
	l := r.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		r.locks[id] = l
	}
	r.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func notFound(id string) error {
	return errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist on the vm runtime", id).With("sandbox_id", id)
}

func (r *Runtime) checkID(id string) error {
	if !sandboxid.Valid(id) {
		return errcode.New(errcode.InvalidArgument, "sandbox id %q is not a valid id", id)
	}
	return nil
}

func (r *Runtime) unavailable() error {
	if r.caps.Available {
		return nil
	}
	return errcode.New(errcode.RuntimeUnavailable, "the vm runtime is not available on this host: %s", r.caps.Reason)
}

// Create builds the sandbox's disk and record; QEMU starts in Start.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	if err := r.unavailable(); err != nil {
		return "", err
	}
	if err := r.checkID(spec.ID); err != nil {
		return "", err
	}
	if err := runtime.CheckNetwork(spec.Network, r.caps.NetworkModes); err != nil {
		return "", err
	}
	if err := runtime.CheckCABundle(spec.CABundle); err != nil {
		return "", err
	}
	if err := checkIDMap(spec.IDMap); err != nil {
		return "", err
	}
	if spec.Rootfs == nil && spec.Image != "" && spec.Image != "host" {
		return "", errcode.New(errcode.InvalidArgument, "image %q: the vm runtime runs the host image or an OCI image's unpacked layers, and was given neither", spec.Image)
	}
	if spec.Rootfs != nil && len(spec.Rootfs.Layers) > runtime.MaxRootfsLayers {
		return "", errcode.New(errcode.InvalidArgument, "image %q has %d layers; at most %d", spec.Image, len(spec.Rootfs.Layers), runtime.MaxRootfsLayers)
	}
	mem := spec.MemoryMB
	if mem == 0 {
		mem = defaultMemoryMB
	}
	if mem < minMemoryMB {
		return "", errcode.New(errcode.InvalidArgument, "memory_mb %d: a vm sandbox needs at least %d MiB (its kernel's own)", mem, minMemoryMB)
	}
	disk := spec.DiskMB
	if spec.Snapshot != nil {
		var err error
		if disk, err = checkSnapshotSource(spec.Snapshot, disk); err != nil {
			return "", err
		}
	}
	if disk == 0 {
		disk = 1024
	}
	if disk < 64 {
		return "", errcode.New(errcode.InvalidArgument, "disk_mb %d: a vm sandbox's disk must be at least 64 MiB", disk)
	}
	cpus := 1
	if spec.CPU > 1 {
		cpus = int(spec.CPU + 0.999)
	}
	unlock := r.lock(spec.ID)
	defer unlock()
	dir := r.dir(spec.ID)
	if _, err := os.Lstat(dir); err == nil {
		return "", errcode.New(errcode.InvalidArgument, "sandbox %s already exists on the vm runtime", spec.ID)
	}
	r.assetsMu.Lock()
	initrd, err := r.initramfs()
	var root string
	img := "host"
	switch {
	case err != nil:
	case spec.Rootfs != nil:
		root, err = r.imageRoot(ctx, spec.Rootfs)
		img = spec.Image
	default:
		root, err = r.hostImage(ctx)
	}
	r.assetsMu.Unlock()
	if err != nil {
		return "", fmt.Errorf("vm runtime: guest assets: %w", err)
	}
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	rec := record{ID: spec.ID, Handle: hex.EncodeToString(nonce), CPUs: cpus, CPU: spec.CPU, MemoryMB: mem, DiskMB: disk, Image: img,
		RootDisk: root, Initramfs: initrd, Kernel: r.cfg.Kernel, Accel: r.accel, UID: r.cfg.UID, GID: r.cfg.GID}
	if spec.IDMap.Count > 0 {
		rec.UID, rec.GID, rec.IDMap = spec.IDMap.UIDBase, spec.IDMap.GIDBase, spec.IDMap
	}
	if err := r.create(ctx, spec, rec); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return runtime.Handle(rec.Handle), nil
}

func (r *Runtime) create(ctx context.Context, spec runtime.Spec, rec record) error {
	dir := r.dir(spec.ID)
	uid, gid := r.owner(rec)
	// 0711: QEMU, unprivileged, runs in it and opens its disk; the records stay root's.
	if err := os.Mkdir(dir, 0o711); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, "console"), 0o700); err != nil {
		return err
	}
	if err := os.Chown(filepath.Join(dir, "run"), int(uid), int(gid)); err != nil {
		return err
	}
	stage, err := os.MkdirTemp(dir, ".stage-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	network := spec.Network
	if network == "" {
		network = runtime.NetworkNone
	}
	vc := vminit.Config{ID: spec.ID, Env: spec.Env, Network: network, PidsLimit: spec.PidsLimit}
	if spec.Rootfs != nil {
		// An OCI image's commands run as its user (root when it names none) in its workdir,
		// as on the other runtimes.
		vc.User, vc.Workdir = spec.Rootfs.User, spec.Rootfs.Workdir
		if vc.User == "" {
			vc.User = "root"
		}
	}
	cfg, _ := json.Marshal(vc)
	if err := os.MkdirAll(filepath.Join(stage, filepath.Dir(vminit.ConfigPath)), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(stage, vminit.ConfigPath), cfg, 0o600); err != nil {
		return err
	}
	if network == runtime.NetworkEgress {
		if err := os.WriteFile(filepath.Join(stage, vminit.CABundleFile), spec.CABundle, 0o600); err != nil {
			return err
		}
	}
	data := filepath.Join(dir, "data.ext4")
	if spec.Snapshot != nil {
		err = diskFromSnapshot(ctx, spec.Snapshot, data, stage)
	} else {
		err = mkfs(ctx, data, stage, rec.DiskMB, vminit.DataLabel, false)
	}
	if err != nil {
		return err
	}
	// The disk is its QEMU's alone: no other VM's QEMU (another uid) may read or write it.
	if err := os.Chown(data, int(uid), int(gid)); err != nil {
		return err
	}
	if err := os.Chmod(data, 0o600); err != nil {
		return err
	}
	b, _ := json.Marshal(rec)
	return writeAtomic(filepath.Join(dir, "vm.json"), b, 0o600)
}

func (r *Runtime) readRecord(id string) (record, error) {
	var rec record
	b, err := os.ReadFile(filepath.Join(r.dir(id), "vm.json"))
	if errors.Is(err, os.ErrNotExist) {
		return rec, notFound(id)
	}
	if err != nil {
		return rec, err
	}
	return rec, json.Unmarshal(b, &rec)
}

func (r *Runtime) readProc(id string) (proc, bool) {
	var p proc
	b, err := os.ReadFile(filepath.Join(r.dir(id), "qemu.json"))
	if err != nil || json.Unmarshal(b, &p) != nil || p.PID <= 0 {
		return p, false
	}
	return p, true
}

// alive reports whether p is still the QEMU Start made (not exited, pid not reused).
func (p proc) alive() bool {
	st, err := startTime(p.PID)
	return err == nil && st == p.StartTime
}

// startTime reads a process's start time (clock ticks since boot) from /proc/<pid>/stat; a
// zombie counts as gone.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, errors.New("bad stat")
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, errors.New("exited")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Start boots the VM: QEMU in the sandbox's cgroup, as the base uid and gid of the sandbox's id
// range (no user of the host, nor any other sandbox, has them).
func (r *Runtime) Start(ctx context.Context, id string) error {
	if err := r.checkID(id); err != nil {
		return err
	}
	unlock := r.lock(id)
	defer unlock()
	rec, err := r.readRecord(id)
	if err != nil {
		return err
	}
	if p, ok := r.readProc(id); ok {
		if p.alive() {
			return nil
		}
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s's VM has stopped; it cannot be started again", id)
	}
	if err := r.mountConsole(id, rec); err != nil {
		return err
	}
	select {
	case r.bootSlots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("vm runtime: waiting for a boot slot (%d VMs booting): %w", cap(r.bootSlots), ctx.Err())
	}
	booting := true
	defer func() {
		if booting {
			<-r.bootSlots
		}
	}()
	cgDirs, err := r.makeCgroup(id, rec)
	if err != nil {
		return err
	}
	dir := r.dir(id)
	logf, err := os.OpenFile(filepath.Join(dir, "qemu.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	uid, gid := r.owner(rec)
	cmd := exec.Command(r.qemu, r.argv(id, rec)...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setsid:     true,
		Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: r.groups(rec)},
	}
	if r.cg.v2 {
		// clone3 with CLONE_INTO_CGROUP: QEMU never runs outside its cgroup.
		cgfd, err := unix.Open(cgDirs[0], unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("vm runtime: cgroup: %w", err)
		}
		defer unix.Close(cgfd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cgfd
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("vm runtime: start qemu: %w", err)
	}
	pid := cmd.Process.Pid
	go func() { // reap it; Wait and State look at /proc
		err := cmd.Wait()
		r.log.Info("vm runtime: qemu exited", "sandbox_id", id, "pid", pid, "status", fmt.Sprint(err))
	}()
	if !r.cg.v2 {
		// v1 cannot start a process in a cgroup: QEMU is moved in before it has set up the
		// guest (its first milliseconds, before guest RAM is touched, are outside).
		if err := r.joinCgroup(pid, cgDirs); err != nil {
			_ = unix.Kill(pid, unix.SIGKILL)
			return err
		}
	}
	st, err := startTime(pid)
	if err != nil {
		return fmt.Errorf("vm runtime: qemu exited at once: %s", r.qemuLog(id))
	}
	b, _ := json.Marshal(proc{PID: pid, StartTime: st})
	if err := writeAtomic(filepath.Join(dir, "qemu.json"), b, 0o600); err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return err
	}
	booting = false
	go r.awaitBoot(id, proc{PID: pid, StartTime: st}) // frees the boot slot
	return nil
}

// bootTimeout bounds how long a booting VM holds its boot slot.
const bootTimeout = 2 * time.Minute

// awaitBoot connects to the new VM's agent (the handshake answers once the guest's init
// serves), then frees the boot slot Start took; a VM that dies or does not answer within
// bootTimeout frees it too. The connection stays for the sandbox's first dial.
func (r *Runtime) awaitBoot(id string, p proc) {
	defer func() { <-r.bootSlots }()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	sock := filepath.Join(r.dir(id), "run", "agent.sock")
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if !p.alive() || ctx.Err() != nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, _ = r.session(ctx, id, sock)
}

// qemuLog is the tail of QEMU's own output (its errors).
func (r *Runtime) qemuLog(id string) string {
	b, _ := os.ReadFile(filepath.Join(r.dir(id), "qemu.log"))
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return strings.TrimSpace(string(b))
}

// argv is QEMU's command line for the VM (run in the sandbox's directory: relative paths).
func (r *Runtime) argv(id string, rec record) []string {
	accel := "tcg,thread=single"
	if rec.Accel == AccelKVM {
		accel = "kvm"
	}
	// page_reporting_order=9: freed 2 MiB blocks go back to the host (the default waits for
	// larger ones).
	cmdline := "console=ttyS0 quiet panic=-1 cryptomgr.notests page_reporting.page_reporting_order=9 rdinit=/init"
	if rec.Accel != AccelKVM && r.tscKHz > 0 {
		cmdline += fmt.Sprintf(" tsc_early_khz=%d tsc=reliable", r.tscKHz)
	}
	cmdline += " -- " + vminit.Command
	return []string{
		"-name", "guest=" + id,
		"-M", "microvm",
		"-accel", accel,
		"-smp", strconv.Itoa(rec.CPUs),
		"-m", strconv.FormatInt(rec.MemoryMB, 10),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-kernel", rec.Kernel, "-initrd", rec.Initramfs, "-append", cmdline,
		"-chardev", "file,id=console,path=console/console.log", "-serial", "chardev:console",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=run/agent.sock,server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=" + vminit.PortName,
		"-drive", "if=none,id=root,file=" + rec.RootDisk + ",format=raw,readonly=on",
		"-device", "virtio-blk-device,drive=root",
		"-drive", "if=none,id=data,file=data.ext4,format=raw,discard=unmap",
		"-device", "virtio-blk-device,drive=data",
		"-device", "virtio-balloon-device,free-page-reporting=on",
		"-qmp", "unix:run/qmp.sock,server=on,wait=off",
	}
}

// Stop kills the VM's QEMU and waits until it is gone.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if err := r.checkID(id); err != nil {
		return err
	}
	unlock := r.lock(id)
	defer unlock()
	return r.stop(ctx, id)
}

func (r *Runtime) stop(ctx context.Context, id string) error {
	r.dropSession(id)
	p, ok := r.readProc(id)
	if !ok || !p.alive() {
		return nil
	}
	if err := unix.Kill(p.PID, unix.SIGKILL); err != nil && err != unix.ESRCH {
		return fmt.Errorf("vm runtime: kill qemu: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for p.alive() {
		select {
		case <-wctx.Done():
			return fmt.Errorf("vm runtime: qemu %d did not die: %w", p.PID, wctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// Delete stops the VM and removes its cgroup and directory.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := r.checkID(id); err != nil {
		return err
	}
	unlock := r.lock(id)
	defer unlock()
	if err := r.stop(ctx, id); err != nil {
		return err
	}
	return r.deleteLocked(ctx, id)
}

// deleteLocked removes stopped sandbox id's cgroup and directory; the caller holds its lock.
func (r *Runtime) deleteLocked(ctx context.Context, id string) error {
	if err := r.removeCgroup(ctx, id); err != nil {
		return err
	}
	if err := r.unmountConsole(id); err != nil {
		return err
	}
	if err := os.RemoveAll(r.dir(id)); err != nil {
		return fmt.Errorf("vm runtime: %w", err)
	}
	r.mu.Lock()
	delete(r.locks, id)
	r.mu.Unlock()
	return nil
}

func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	if !sandboxid.Valid(id) {
		return runtime.StatusAbsent, nil
	}
	if _, err := os.Stat(filepath.Join(r.dir(id), "vm.json")); err != nil {
		if _, err := os.Lstat(r.dir(id)); err == nil {
			return runtime.StatusStopped, nil // half-made: Delete sweeps it
		}
		return runtime.StatusAbsent, nil
	}
	p, ok := r.readProc(id)
	switch {
	case !ok:
		return runtime.StatusCreated, nil
	case p.alive():
		return runtime.StatusRunning, nil
	default:
		return runtime.StatusStopped, nil
	}
}

func (r *Runtime) List(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(r.cfg.Root, "sandboxes"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ids := []string{}
	for _, e := range ents {
		if sandboxid.Valid(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	for _, id := range r.cgroupIDs() {
		if sandboxid.Valid(id) && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// Wait blocks until the VM's QEMU has exited or ctx ends.
func (r *Runtime) Wait(ctx context.Context, id string) error {
	if !sandboxid.Valid(id) {
		return nil
	}
	p, ok := r.readProc(id)
	if !ok || !p.alive() {
		return nil
	}
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		return nil // gone
	}
	defer unix.Close(fd)
	if !p.alive() { // the pid was reused between the check and the open
		return nil
	}
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 100)
		if err != nil && err != unix.EINTR {
			return fmt.Errorf("vm runtime: wait: %w", err)
		}
		if n > 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// Adopt checks that the VM is the one h names and that its QEMU runs.
func (r *Runtime) Adopt(ctx context.Context, id string, h runtime.Handle) error {
	rec, err := r.readRecord(id)
	if err != nil {
		return err
	}
	if h != "" && string(h) != rec.Handle {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s is not the VM its handle names (a later sandbox of the same id)", id)
	}
	p, ok := r.readProc(id)
	if !ok || !p.alive() {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s's VM is not running", id)
	}
	if err := r.checkQMP(ctx, id); err != nil {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s's VM does not answer on its monitor: %v", id, err)
	}
	return nil
}

// DisksMiB is the host space the VMs' disks take (allocated blocks).
func (r *Runtime) DisksMiB(ctx context.Context) (int64, error) {
	ids, err := r.List(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, id := range ids {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(r.dir(id), "data.ext4"), &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n >> 20, nil
}

// Close drops the host's agent connections; the VMs run on for a restarted server to adopt.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	ids := make([]string, 0, len(r.sessions))
	for id := range r.sessions {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	for _, id := range ids {
		r.dropSession(id)
	}
	r.removeParent() // only when no VM is left in it
	return nil
}

// groups are QEMU's supplementary groups: /dev/kvm's group under KVM, none under TCG.
func (r *Runtime) groups(rec record) []uint32 {
	if rec.Accel != AccelKVM {
		return []uint32{}
	}
	var st unix.Stat_t
	if unix.Stat("/dev/kvm", &st) != nil {
		return []uint32{}
	}
	return []uint32{st.Gid}
}

// hostTSCkHz is the host's TSC frequency from /proc/cpuinfo (the guest's tsc_early_khz: without
// it an emulated boot may hang calibrating); 0 when unknown.
func hostTSCkHz() int64 {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil && mhz > 0 {
				return int64(mhz * 1000)
			}
		}
	}
	return 0
}

// consoleBytes bounds a VM's console log: a tmpfs of this size holds it (the guest's root can
// write to its serial port without end; what does not fit is dropped).
const consoleBytes = 256 << 10

// mountConsole mounts the VM's console directory: a small tmpfs QEMU (unprivileged) writes the
// serial console into, so that it is bounded and outlives QEMU for ExitReason.
func (r *Runtime) mountConsole(id string, rec record) error {
	dir := filepath.Join(r.dir(id), "console")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) == nil && unix.Stat(r.dir(id), &parent) == nil && st.Dev != parent.Dev {
		return nil // mounted already
	}
	uid, gid := r.owner(rec)
	opts := fmt.Sprintf("size=%d,nr_inodes=16,mode=0700,uid=%d,gid=%d", consoleBytes, uid, gid)
	if err := unix.Mount("agentbox-vmconsole", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("vm runtime: console tmpfs: %w", err)
	}
	return nil
}

func (r *Runtime) unmountConsole(id string) error {
	dir := filepath.Join(r.dir(id), "console")
	for {
		err := unix.Unmount(dir, unix.MNT_DETACH)
		if err == unix.EINVAL || err == unix.ENOENT {
			return nil // not (or no longer) a mount point
		}
		if err != nil {
			return fmt.Errorf("vm runtime: unmount the console: %w", err)
		}
	}
}

// Console returns the end of the VM's serial console (at most n bytes).
func (r *Runtime) Console(ctx context.Context, id string) string {
	b, _ := os.ReadFile(filepath.Join(r.dir(id), "console", "console.log"))
	const n = 16 << 10
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// ExitReason says why a VM ended behind the runtime's back: its kernel's panic with the
// console's last lines, a guest that powered off, or QEMU's own last words.
func (r *Runtime) ExitReason(ctx context.Context, id string) string {
	p, ok := r.readProc(id)
	if !ok || p.alive() {
		return ""
	}
	con := r.Console(ctx, id)
	lines := strings.Split(strings.TrimSpace(con), "\n")
	if i := strings.LastIndex(con, "Kernel panic"); i >= 0 {
		tail := strings.Split(strings.TrimSpace(con[i:]), "\n")
		head := lines[max(0, len(lines)-len(tail)-6) : len(lines)-len(tail)]
		return "the VM's kernel panicked; its console's last lines: " + strings.Join(append(head, tail[0]), " | ")
	}
	if q := r.qemuLog(id); q != "" {
		return "QEMU: " + q
	}
	if con != "" && strings.Contains(con, "agentbox vm init:") {
		return "the VM's init stopped; its console's last lines: " + strings.Join(lines[max(0, len(lines)-6):], " | ")
	}
	return "the VM's QEMU process ended (killed, or the guest powered off)"
}

var (
	_ runtime.ExitReporter  = (*Runtime)(nil)
	_ runtime.Runtime       = (*Runtime)(nil)
	_ runtime.Waiter        = (*Runtime)(nil)
	_ runtime.Adopter       = (*Runtime)(nil)
	_ runtime.DiskAccounter = (*Runtime)(nil)
	_ runtime.Closer        = (*Runtime)(nil)
)
