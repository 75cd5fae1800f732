//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// check is one line of the doctor's report.
type check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
	// Runtime is what a runtime check found: availability, isolation and hardening.
	Runtime *runtime.Capabilities `json:"runtime,omitempty"`
	// Warn marks a failure that does not stop the server from working.
	Warn bool `json:"-"`
}

func cmdDoctor(args []string) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	stateDir := fs.String("state-dir", config.DefaultStateDir(), "state directory to check for free space")
	storeFlag := fs.String("store", "", "the store to check, as agentbox serve --store takes it (default the SQLite file in the state dir)")
	kcfg := config.Default()
	registerKubeFlags(fs, &kcfg) // the cluster of the kubernetes runtime (kube_wire.go)
	registerVMFlags(fs, &kcfg)   // the vm runtime (vm_wire.go)
	vmBoot := fs.Bool("vm-boot", false, "also boot a VM of runtime vm and run a command in it (seconds under TCG)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var checks []check
	add := func(c check) { checks = append(checks, c) }
	root := os.Geteuid() == 0
	add(check{Name: "root", OK: root, Detail: fmt.Sprintf("euid %d", os.Geteuid()),
		Fix: fixIf(!root, "run the server as root: sudo agentbox serve (rootless runtimes are not supported yet)")})
	add(agentCheck())
	var rts, runs []check // each runtime's line (with its capabilities), then its sandbox's
	for _, f := range runtimeFlavors {
		rc, sc := runtimeChecks(root, f)
		add(rc)
		rts, runs = append(rts, rc), append(runs, sc)
	}
	var missing []string
	for _, ns := range []string{"pid", "mnt", "ipc", "uts", "net", "cgroup"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			missing = append(missing, ns)
		}
	}
	add(check{Name: "namespaces", OK: len(missing) == 0, Detail: detailMissing("pid mnt ipc uts net cgroup", missing),
		Fix: fixIf(len(missing) > 0, "use a kernel built with CONFIG_PID_NS, CONFIG_NET_NS, CONFIG_CGROUPS and friends")})
	info := hostinfo.Probe()
	add(check{Name: "user namespaces", OK: info.UserNamespaces, Detail: yesNo(info.UserNamespaces, "available", "unavailable"),
		Fix: fixIf(!info.UserNamespaces, "sudo sysctl -w user.max_user_namespaces=15000")})
	add(check{Name: "cgroups", OK: info.CgroupMode != "", Detail: "mode " + info.CgroupMode})
	add(check{Name: "kvm", OK: info.KVM, Detail: yesNo(info.KVM, "/dev/kvm present (runtime vm uses it when a probe boot works: see the vm line)", "no /dev/kvm (runtime vm runs its VMs under TCG, software emulation)")})
	add(check{Name: "host", OK: true, Detail: fmt.Sprintf("%d cores, %d MiB memory", info.NumCPU, info.MemTotalMiB)})
	add(check{Name: "rlimits", OK: info.HardRlimits.NOFILE >= 1024, Detail: fmt.Sprintf("hard NOFILE %d, NPROC %d (sandbox limits are clamped to these)", info.HardRlimits.NOFILE, info.HardRlimits.NPROC)})
	add(diskCheck(*stateDir))
	add(overlayCheck(rts)) // images (images.go)
	add(imageCacheCheck(*stateDir))
	add(storeCheck(*storeFlag, *stateDir)) // the store (doctor_store.go)
	for _, c := range runs {
		add(c)
	}
	vrc, vsc := vmChecks(root, *vmBoot, kcfg) // vm_wire.go
	add(vrc)
	add(vsc)
	for _, c := range kubeChecks(kcfg) {
		add(c)
	}
	if *asJSON {
		printJSON(checks)
	} else {
		for _, c := range checks {
			mark := "ok  "
			if !c.OK {
				mark = "FAIL"
				if c.Warn || c.Name == "kvm" || c.Name == "user namespaces" {
					mark = "warn"
				}
			}
			fmt.Printf("%s %-16s %s\n", mark, c.Name, c.Detail)
			if c.Runtime != nil && c.Runtime.Available {
				fmt.Printf("     %-16s hardening: %s\n", "", strings.Join(c.Runtime.Hardening, " "))
				if r := c.Runtime.TransparentEgressReason; r != "" {
					fmt.Printf("     %-16s no transparent egress: %s\n", "", r)
				}
				fmt.Printf("     %-16s snapshots: %s\n", "", snapshotKinds(c.Runtime.Snapshots))
				if r := c.Runtime.MemorySnapshotReason; r != "" {
					fmt.Printf("     %-16s no memory snapshots: %s\n", "", r)
				}
			}
			if c.Fix != "" {
				fmt.Printf("     %-16s fix: %s\n", "", c.Fix)
			}
		}
	}
	if !runs[0].OK { // the default runtime
		return 1
	}
	return 0
}

// agentCheck says which agent binary sandboxes would run: the lean agentbox-guest beside this
// binary, or (a warning) this whole binary.
func agentCheck() check {
	c := check{Name: "agent", Warn: true}
	bin, lean, err := guestBinary("")
	switch {
	case err != nil:
		c.Detail = err.Error()
	case !lean:
		c.Detail, c.Fix = fatGuestWarning, "make build (bin/agentbox and bin/agentbox-guest), or go build -o DIR/ ./cmd/agentbox ./cmd/agentbox-guest"
	default:
		c.OK, c.Detail = true, "sandboxes run "+bin
	}
	return c
}

// runtimeChecks probes one runtime (what it is, its isolation and hardening) and proves that it
// works by running a real sandbox and an exec in it. Only the default runtime (runc) failing
// is an error; crun and gVisor failing are warnings.
func runtimeChecks(root bool, f oci.Flavor) (rc, sc check) {
	name := string(f)
	warn := f != oci.FlavorRunc
	rc = check{Name: name, Warn: warn}
	sc = check{Name: name + " sandbox", Warn: warn}
	guestBin, dir, err := doctorScratch()
	if err != nil {
		rc.Detail, sc.Detail = err.Error(), "not tried"
		return rc, sc
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rt, err := oci.New(ctx, oci.Config{Name: name, Flavor: f, Root: dir, GuestBinary: guestBin, CgroupParent: "agentbox-doctor-" + name,
		Subreaper: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		rc.Detail, sc.Detail = err.Error(), "not tried"
		return rc, sc
	}
	caps := rt.Capabilities()
	rc.Runtime = &caps
	if !caps.Available {
		rc.Detail, sc.Detail = caps.Reason, "not tried: runtime unavailable"
		if _, err := exec.LookPath(f.Binary()); err != nil {
			rc.Fix = f.InstallHint()
		}
		return rc, sc
	}
	rc.OK, rc.Detail = true, fmt.Sprintf("%s %s, %s isolation", f.Binary(), caps.Version, caps.Isolation)
	if !root {
		sc.Detail, sc.Fix = "not tried: needs root", "sudo agentbox doctor"
		return rc, sc
	}
	defer rt.Close(context.Background()) // after the Delete below: the empty cgroup parent goes too
	tryOnce(ctx, rt, &sc, "sandbox", "created a sandbox", time.Millisecond)
	return rc, sc
}

// doctorScratch is what a runtime check needs before its runtime: the lean agent to bind in and
// a throwaway root dir, searchable by everyone (0711) like a server's state dir, since a
// sandbox's root user (unprivileged on the host) must reach the runtime's root in it.
func doctorScratch() (guestBin, dir string, err error) {
	if guestBin, _, err = guestBinary(""); err != nil {
		return "", "", err
	}
	if dir, err = os.MkdirTemp("", "abdoc-"); err != nil {
		return "", "", err
	}
	return guestBin, dir, os.Chmod(dir, 0o711)
}

// tryOnce is a runtime's sandbox check: runOnce on rt, then sc says how long it took (rounded
// to round) or what failed.
func tryOnce(ctx context.Context, rt runtime.Runtime, sc *check, what, did string, round time.Duration) {
	id := sandbox.NewID()
	defer rt.Delete(context.Background(), id)
	start := time.Now()
	if err := runOnce(ctx, rt, id); err != nil {
		sc.Detail = "a test " + what + " failed: " + err.Error()
		sc.Fix = "run `sudo agentbox serve --log-level debug` and read the runtime's error"
		return
	}
	sc.OK, sc.Detail = true, fmt.Sprintf("%s and ran a command in it in %s", did, time.Since(start).Round(round))
}

// runOnce creates and starts a sandbox, waits for its agent and runs one command in it.
func runOnce(ctx context.Context, rt runtime.Runtime, id string) error {
	if _, err := rt.Create(ctx, runtime.Spec{ID: id, Image: "host", CPU: 1, MemoryMB: 256, DiskMB: 256, PidsLimit: 64}); err != nil {
		return err
	}
	if err := rt.Start(ctx, id); err != nil {
		return err
	}
	dial, err := rt.Agent(ctx, id)
	if err != nil {
		return err
	}
	gc := guest.NewClient(guest.Dialer(dial))
	defer gc.Close()
	if err := gc.WaitReady(ctx); err != nil {
		return err
	}
	res, err := gc.Exec(ctx, guestExec("sh", "-c", "echo ok"), nil)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(res.Stdout)) != "ok" {
		return fmt.Errorf("exec printed %q, exit %d", string(res.Stdout)+string(res.Stderr), res.ExitCode)
	}
	return nil
}

func diskCheck(dir string) check {
	c := check{Name: "disk"}
	probe := dir
	for {
		if _, err := os.Stat(probe); err == nil || probe == "/" {
			break
		}
		probe = filepath.Dir(probe)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(probe, &st); err != nil {
		c.Detail = err.Error()
		return c
	}
	free := int64(st.Bavail) * st.Bsize >> 20
	c.OK = free >= 1024
	c.Detail = fmt.Sprintf("%d MiB free at %s", free, probe)
	c.Fix = fixIf(!c.OK, "free disk space: sandboxes' workspaces live under the state dir")
	return c
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

func fixIf(cond bool, fix string) string {
	if cond {
		return fix
	}
	return ""
}

func yesNo(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}

func detailMissing(all string, missing []string) string {
	if len(missing) == 0 {
		return all
	}
	return "missing: " + strings.Join(missing, " ")
}

// snapshotKinds is a runtime's snapshot kinds as doctor prints them.
func snapshotKinds(kinds []string) string {
	if len(kinds) == 0 {
		return "none"
	}
	return strings.Join(kinds, " ")
}
