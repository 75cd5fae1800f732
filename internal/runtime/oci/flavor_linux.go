package oci

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
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/mountns"
	"github.com/agentbox/agentbox/internal/runtime"
)

// This file holds everything that differs between the flavours; the rest of the package is
// one code path for all three.

// unifiedControllers is the file crun 1.8 reads to decide that a hybrid host's cgroup2
// hierarchy is in use ("cgroups in hybrid mode not supported, drop all controllers from
// cgroupv2") and refuses to start.
const unifiedControllers = "/sys/fs/cgroup/unified/cgroup.controllers"

// gvisorNullNetNS is where runsc (2023 and later) pins, in its --root, the empty network
// namespace its gofers share: a bind mount that outlives the sandboxes, removed by Close.
const gvisorNullNetNS = "null-netns"

// gvisorPlatforms are runsc's platforms in order of preference. KVM is left out: it needs
// working (nested) virtualisation and hangs where that is unreliable.
var gvisorPlatforms = []string{"systrap", "ptrace"}

// gVisor's process limit. runsc puts its sentry and gofer, and every one of their threads, in
// the sandbox's pids cgroup, and the platform adds host stub processes and threads per address
// space of the workload: measured here, ptrace 5 host tasks per forked process and up to 35 per
// exec'd one, 60 for an idle sandbox; systrap 2 per forked process (kept as a pool), 53 idle. The host count says little about the workload's, so
// the sandbox's own kernel enforces pids_limit (RLIMIT_NPROC, which gVisor applies per user
// inside the sandbox), and the host pids cgroup is a backstop against exhausting the host's pid
// space: reaching it stops the whole sandbox.
const (
	gvisorHostTasksPerProcess = 32
	gvisorHostTasksBase       = 256
	// gvisorPidMaxShare is the largest part of the host's pid_max one sandbox may hold.
	gvisorPidMaxShare = 4
	// gvisorMiBPerProcess: a process costs gVisor's sentry far more of the sandbox's memory than
	// Linux spends on it (measured here: 3.7 MiB per sleeping forked python3, ~8 MiB per one that
	// keeps forking; gVisor breaks copy-on-write in large units), so a fork bomb would fill the
	// memory limit, and the host kill the sentry, long before pids_limit. The workload's process bound is therefore also
	// memory_mb/gvisorMiBPerProcess (at least gvisorMinProcesses).
	gvisorMiBPerProcess = 8
	gvisorMinProcesses  = 8
)

// gvisorProcesses is the process bound (RLIMIT_NPROC) of a gVisor sandbox's workload.
func gvisorProcesses(pids, memoryMB int64) int64 {
	if memoryMB <= 0 {
		return pids
	}
	byMemory := max(memoryMB/gvisorMiBPerProcess, gvisorMinProcesses)
	if pids <= 0 {
		return byMemory
	}
	return min(pids, byMemory)
}

// flavorFor returns the flavour a Config asks for.
func flavorFor(cfg Config) (Flavor, error) {
	switch f := cfg.Flavor; f {
	case FlavorRunc, FlavorCrun, FlavorGVisor:
		return f, nil
	case "":
		switch cfg.Name {
		case "crun":
			return FlavorCrun, nil
		case "gvisor", "runsc":
			return FlavorGVisor, nil
		}
		return FlavorRunc, nil
	default:
		return "", fmt.Errorf("flavor %q is not one of runc, crun, gvisor", f)
	}
}

// Binary is the flavour's executable name (runc, crun, runsc).
func (f Flavor) Binary() string {
	if f == FlavorGVisor {
		return "runsc"
	}
	return string(f)
}

// InstallHint is the command that installs the flavour's binary. runsc is built from the Go
// module proxy at the version the Makefile pins: Debian's is from 2022-12.
func (f Flavor) InstallHint() string {
	if f == FlavorGVisor {
		return "sudo make deps-runsc in agentbox's checkout"
	}
	return "sudo apt-get install -y " + f.Binary()
}

func (f Flavor) isolation() runtime.Isolation {
	if f == FlavorGVisor {
		return runtime.IsolationKernel
	}
	return runtime.IsolationProcess
}

// capsHardening is the Hardening entry for the capability set.
func capsHardening() string {
	names := make([]string, len(capabilities))
	for i, c := range capabilities {
		names[i] = strings.TrimPrefix(c, "CAP_")
	}
	return "caps:" + strings.Join(names, ",")
}

// flavorHardening is what the flavour enforces on every sandbox, machine-readably: the spec's
// hardening where the flavour applies it, and the flavour's own.
func (r *Runtime) flavorHardening() []string {
	h := []string{seccompHardening, capsHardening()}
	for _, x := range hardening {
		if x == "caps:minimal" {
			continue
		}
		if r.flavor == FlavorGVisor {
			switch x {
			case "netns:loopback-only":
				x = "network:none"
			case "cgroup:memory,cpu,pids":
				x = "cgroup:memory,cpu,pids(host-backstop)"
			case "devices:default-deny":
				x = "devices:gvisor-dev" // the sentry's own /dev; the host device cgroup confines the sentry
			}
		}
		h = append(h, x)
	}
	switch r.flavor {
	case FlavorCrun:
		if r.emptyFile != "" {
			h = append(h, "crun:private-mountns-hybrid-cgroups")
		}
	case FlavorGVisor:
		h = append(h, "gvisor:user-space-kernel", "platform:"+r.platform, "gvisor:host-syscall-filter",
			"gvisor:host-uds="+r.hostUDS, fmt.Sprintf("pids:rlimit-nproc(min(pids_limit,memory_mb/%d))", gvisorMiBPerProcess),
			"seccomp:errno-eperm,clone3-to-gvisor")
		for _, f := range []string{"--directfs=false", "--overlay2=none"} {
			if slices.Contains(r.globalArgs, f) {
				h = append(h, "gvisor:"+strings.TrimPrefix(f, "--"))
			}
		}
		if r.memoryCgroup != "" {
			h = append(h, oomGuardHardening)
		}
		if !r.ociSeccomp {
			// Without --oci-seccomp, runsc ignores the spec's profile.
			h = slices.DeleteFunc(h, func(s string) bool { return s == seccompHardening })
		}
	}
	return h
}

// probeFlavor does the flavour's own probing after the binary and its version are known. It
// returns why the runtime cannot work, or "".
func (r *Runtime) probeFlavor(ctx context.Context, mode string) string {
	r.globalArgs = []string{"--root", r.stateDir()}
	switch r.flavor {
	case FlavorCrun:
		return r.probeCrun(ctx, mode)
	case FlavorGVisor:
		return r.probeGVisor(ctx)
	}
	return ""
}

// probeCrun decides whether crun's commands need the private mount namespace and proves that
// crun runs in it.
func (r *Runtime) probeCrun(ctx context.Context, mode string) string {
	if mode != hostinfo.CgroupHybrid {
		return ""
	}
	b, err := os.ReadFile(unifiedControllers)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return "" // no controllers in the cgroup2 hierarchy: crun starts as it is
	}
	if err := os.MkdirAll(r.root, 0o700); err != nil {
		return fmt.Sprintf("cannot create %s: %v", r.root, err)
	}
	empty := filepath.Join(r.root, "cgroup.controllers.empty")
	if err := os.WriteFile(empty, nil, 0o444); err != nil {
		return fmt.Sprintf("cannot create %s: %v", empty, err)
	}
	r.emptyFile = empty
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, "cat", unifiedControllers)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := r.startCmd(cmd); err != nil {
		return fmt.Sprintf("crun 1.8 refuses cgroup v1 hybrid hosts whose cgroup2 hierarchy has controllers (%s lists %q), and a private mount namespace hiding them cannot be made: %v",
			unifiedControllers, strings.TrimSpace(string(b)), err)
	}
	if err := cmd.Wait(); err != nil || out.Len() != 0 {
		return fmt.Sprintf("crun needs %s to read empty in a private mount namespace, but it reads %q there (%v %s)",
			unifiedControllers, out.String(), err, stderr.String())
	}
	return ""
}

// probeGVisor picks runsc's platform and the flags this version has.
func (r *Runtime) probeGVisor(ctx context.Context) string {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(cctx, r.binary, "flags").CombinedOutput()
	flags := append([]byte("\n"), out...)
	has := func(flag string) bool {
		return bytes.Contains(flags, []byte("\n  -"+flag+" ")) || bytes.Contains(flags, []byte("\n  -"+flag+"\n"))
	}
	if !has("network") || !has("platform") || !has("root") {
		return fmt.Sprintf("%s flags did not list --network, --platform and --root; is %s gVisor's runsc?", r.binary, r.binary)
	}
	if !has("host-uds") {
		return fmt.Sprintf("%s %s has no --host-uds flag: the agent's unix socket cannot be shared with the host; install a runsc from 2021 or later", r.binary, r.caps.Version)
	}
	platforms, err := exec.CommandContext(cctx, r.binary, "help", "platforms").Output()
	if err != nil {
		return fmt.Sprintf("%s help platforms failed: %v", r.binary, err)
	}
	listed := strings.Fields(string(platforms))
	for _, p := range gvisorPlatforms {
		if slices.Contains(listed, p) {
			r.platform = p
			break
		}
	}
	if r.platform == "" {
		return fmt.Sprintf("%s offers platforms %v; agentbox needs one of %v (kvm is not used: it needs working nested virtualisation)", r.binary, listed, gvisorPlatforms)
	}
	if r.platform == "ptrace" {
		if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(b)) == "3" {
			return "gVisor's ptrace platform needs ptrace, which kernel.yama.ptrace_scope=3 disables"
		}
	}
	// The agent creates its socket inside the sandbox, on the bind-mounted run/ directory;
	// the host connects to it. This runsc needs both halves of --host-uds for that: "create"
	// alone makes the socket file but refuses the host's connections, "open" alone makes no
	// file. The sandbox sees no host socket but those in its own binds (the read-only /usr and
	// friends, and its own run/, workspace/ and home/).
	r.hostUDS = "all"
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		r.pidMax, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	r.ociSeccomp = has("oci-seccomp")
	r.seccomp = forGVisor(r.seccomp)
	// --network is per sandbox (createFlags): runsc keeps it with the sandbox it creates.
	r.globalArgs = append(r.globalArgs, "--platform="+r.platform, "--host-uds="+r.hostUDS)
	if r.ociSeccomp {
		r.globalArgs = append(r.globalArgs, "--oci-seccomp")
	}
	if has("overlay2") {
		// runsc (2023 and later) overlays the root by default with a file-backed upper layer
		// in the rootfs directory, outside disk_mb. The root stays read-only instead; what a
		// sandbox writes lives on its disk and its memory-counted tmpfs.
		r.globalArgs = append(r.globalArgs, "--overlay2=none")
	}
	if has("directfs") {
		// directfs (runsc's default since 2023) has the sentry open the sandbox's files itself:
		// it then runs as root of a user namespace mapping every host id, with DAC_OVERRIDE,
		// DAC_READ_SEARCH, FOWNER and SYS_PTRACE there. Without it the sentry runs as host
		// nobody with no access to any file, and the gofer, a separate process, serves them: an
		// escape from the user-space kernel lands in a process that can read nothing.
		r.globalArgs = append(r.globalArgs, "--directfs=false")
	}
	return ""
}

// createFlags are the OCI runtime's flags for creating sandbox spec, before the create (or run)
// command: gVisor's --network=none for both modes (none and egress: netstack's loopback, where
// the agent's listeners serve the proxy path). runc and crun take the network from the spec (a
// network namespace of its own, loopback only, or the egress one by path).
func (r *Runtime) createFlags(spec runtime.Spec) []string {
	if r.flavor != FlavorGVisor {
		return nil
	}
	return []string{"--network=none"}
}

// adjustSpec applies the flavour's differences to one sandbox's spec input.
func (r *Runtime) adjustSpec(in *specInput) {
	if r.flavor != FlavorGVisor {
		return
	}
	// The sentry's cgroupfs is its own, but the sandbox's root could write it; programs learn
	// the memory limit from /proc/meminfo, which shows memory_mb.
	in.NoCgroupFS = true
	// RLIMIT_NPROC becomes the workload's process bound (the spec never asks for more than
	// HostRlimits), and the pids cgroup the host's backstop.
	if n := uint64(gvisorProcesses(in.PidsLimit, in.MemoryMB)); n > 0 && (in.HostRlimits.NPROC == 0 || n < in.HostRlimits.NPROC) {
		in.HostRlimits.NPROC = n
	}
	if in.PidsLimit > 0 {
		in.PidsLimit = gvisorHostPids(in.PidsLimit, r.pidMax)
	}
}

// gvisorHostPids is the host pids limit of a gVisor sandbox whose workload may have pids
// processes, on a host with the given pid_max (0 if unknown).
func gvisorHostPids(pids, pidMax int64) int64 {
	limit := pids*gvisorHostTasksPerProcess + gvisorHostTasksBase
	if pidMax > 0 {
		limit = min(limit, max(pidMax/gvisorPidMaxShare, 2*gvisorHostTasksBase))
	}
	return limit
}

// newCmd returns the OCI runtime's command with its global flags before args. Its stdin is an
// empty pipe, never the host's /dev/null: a container inherits the runtime's stdio, and the
// runtimes give their stdio to the container's user (runsc fchowns it to the sentry's nobody,
// crun to the sandbox's root), which, done to the host's /dev/null, hands that device to a
// sandbox and breaks every other host user of it.
func (r *Runtime) newCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.binary, append(slices.Clone(r.globalArgs), args...)...)
	cmd.Stdin = strings.NewReader("")
	return cmd
}

// startCmd starts cmd; for crun on a hybrid host, in a private mount namespace.
func (r *Runtime) startCmd(cmd *exec.Cmd) error {
	if r.emptyFile == "" {
		return cmd.Start()
	}
	return mountns.Start(cmd, r.bindEmptyControllers)
}

// startCreate starts cmd, a create or run, in a private mount namespace whose /dev/null is a
// device node of its own. The runtimes open /dev/null themselves for the processes they leave
// running and give it away: runsc fchowns its sandbox process's stdio to the sentry's user
// (nobody), runc and crun bind "the host's" /dev/null into a container with a user namespace.
// Done to the host's node, a sandbox would own, or share with every other sandbox, the host's
// /dev/null. Each create gets a fresh node on a tmpfs that lives as long as its processes do.
func (r *Runtime) startCreate(cmd *exec.Cmd) error {
	return mountns.Start(cmd, func() error {
		if r.emptyFile != "" {
			if err := r.bindEmptyControllers(); err != nil {
				return err
			}
		}
		return bindPrivateDevNull(r.nullDir())
	})
}

// nullDir is the directory that a create's private namespace mounts its /dev/null's tmpfs on.
func (r *Runtime) nullDir() string { return filepath.Join(r.root, "devnull") }

func (r *Runtime) bindEmptyControllers() error {
	if err := unix.Mount(r.emptyFile, unifiedControllers, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", r.emptyFile, unifiedControllers, err)
	}
	return nil
}

// bindPrivateDevNull mounts a tmpfs on dir, makes a null device (1:3, 0666, root's) there and
// binds it over /dev/null. Only in a private mount namespace.
func bindPrivateDevNull(dir string) error {
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=4k,nr_inodes=4,mode=0755"); err != nil {
		return fmt.Errorf("mount a tmpfs for /dev/null: %w", err)
	}
	node := filepath.Join(dir, "null")
	if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		return fmt.Errorf("make a null device: %w", err)
	}
	if err := unix.Chmod(node, 0o666); err != nil { // past the umask
		return err
	}
	if err := unix.Mount(node, "/dev/null", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind a null device over /dev/null: %w", err)
	}
	return nil
}

// stopFallback stops what the runtime's kill command refuses to: runsc does not signal a
// container that was created but never started. Its sandbox process (init.pid) is the whole
// sandbox; SIGKILL to it is the stop. It reports whether it sent the signal.
func (r *Runtime) stopFallback(id string, err error) bool {
	var ce *commandError
	if r.flavor != FlavorGVisor || !errors.As(err, &ce) || !strings.Contains(ce.msg, "in state created") {
		return false
	}
	pid := readPid(filepath.Join(r.sandboxDir(id), "init.pid"))
	if pid <= 0 || !r.ownsProcess(pid, id) {
		return false
	}
	return unix.Kill(pid, unix.SIGKILL) == nil
}

// ownsProcess reports whether pid is a host process of sandbox id: runsc's sandbox and gofer
// name the bundle (the sandbox's directory) on their command line.
func (r *Runtime) ownsProcess(pid int, id string) bool {
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return bytes.Contains(cmdline, []byte(r.sandboxDir(id)))
}

// stateFiles are the paths the OCI runtime keeps for container id under its --root.
func (r *Runtime) stateFiles(id string) []string {
	if r.flavor == FlavorGVisor {
		base := filepath.Join(r.stateDir(), id+"_sandbox:"+id)
		return []string{base + ".state", base + ".lock"}
	}
	return []string{filepath.Join(r.stateDir(), id)}
}

// stateExists reports whether the OCI runtime holds state for container id.
func (r *Runtime) stateExists(id string) bool {
	_, err := os.Stat(r.stateFiles(id)[0])
	return err == nil
}

// removeState removes what a crashed create may leave under --root for id.
func (r *Runtime) removeState(id string) error {
	for _, p := range r.stateFiles(id) {
		if err := os.RemoveAll(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// afterCreate records what the flavour leaves behind a create: runsc's gofer, a process
// that (with Subreaper) becomes this process's child and must be reaped.
func (r *Runtime) afterCreate(id string) {
	if r.flavor != FlavorGVisor {
		return
	}
	b, err := os.ReadFile(r.stateFiles(id)[0])
	if err != nil {
		r.log.Warn("cannot read runsc state", "sandbox_id", id, "err", err)
		return
	}
	var st struct {
		GoferPid int `json:"goferPid"`
	}
	if json.Unmarshal(b, &st) == nil && st.GoferPid > 0 {
		_ = os.WriteFile(filepath.Join(r.sandboxDir(id), "gofer.pid"), []byte(strconv.Itoa(st.GoferPid)), 0o600)
	}
}

// helperPids are the flavour's host processes of sandbox id besides its init (runsc's gofer).
func (r *Runtime) helperPids(id string) []int {
	if r.flavor != FlavorGVisor {
		return nil
	}
	if pid := readPid(filepath.Join(r.sandboxDir(id), "gofer.pid")); pid > 0 {
		return []int{pid}
	}
	return nil
}

// reapDuring keeps reaping sandbox id's init and helper processes until the returned stop is
// called. runsc delete waits for the sandbox process to vanish, which a zombie child of this
// process (a subreaper) never does by itself; runc and crun do not wait, so nothing is needed.
func (r *Runtime) reapDuring(id string, pid int) (stop func()) {
	if !r.reap || r.flavor != FlavorGVisor {
		return func() {}
	}
	pids := r.helperPids(id)
	if pid > 0 {
		pids = append(pids, pid)
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			// A reaped pid is dropped at once: it may be reused by another child.
			pids = slices.DeleteFunc(pids, r.initGone)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); <-finished }
}

// reapHelpers waits (bounded) for the flavour's helper processes of id to exit, reaping them.
// A helper still alive after the wait is killed: it belongs to a sandbox being removed.
func (r *Runtime) reapHelpers(ctx context.Context, id string) {
	for _, pid := range r.helperPids(id) {
		deadline := time.Now().Add(stopTimeout)
		for !r.initGone(pid) {
			if time.Now().After(deadline) || ctx.Err() != nil {
				r.log.Warn("runtime helper still alive", "sandbox_id", id, "pid", pid)
				break
			}
			if time.Since(deadline.Add(-stopTimeout)) > time.Second && r.ownsProcess(pid, id) {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}
