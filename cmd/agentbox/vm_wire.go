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

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/microvm"
)

// vmParentSuffix names the vm runtime's cgroup parent: <parent>-vm.
const vmParentSuffix = "-" + microvm.Name

// registerVMFlags adds the vm runtime's flags (serve, doctor).
func registerVMFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.StringVar(&cfg.VMKernel, "vm-kernel", "", "guest kernel of runtime vm, a bzImage with its modules in modules/ beside it (default "+microvm.DefaultKernel+", which make deps unpacks from Debian's linux-image-cloud-amd64)")
	fs.StringVar(&cfg.VMAccel, "vm-accel", microvm.AccelAuto, "accelerator of runtime vm: auto (KVM when a probe boot proves /dev/kvm works, else TCG), kvm or tcg")
}

// newVMRuntime makes the vm runtime under <state>/runtimes/vm with cgroup parent <parent>-vm;
// an unusable one stays listed with its reason.
func newVMRuntime(ctx context.Context, cfg config.Config, parent, guestBin string, log *slog.Logger) (runtime.Runtime, error) {
	rt, err := microvm.New(ctx, microvm.Config{Root: filepath.Join(cfg.StateDir, "runtimes", microvm.Name), Kernel: cfg.VMKernel,
		Accel: cfg.VMAccel, GuestBinary: guestBin, CgroupParent: parent + vmParentSuffix, Logger: log.With("runtime", microvm.Name)})
	if err != nil {
		return nil, fmt.Errorf("runtime vm: %w", err)
	}
	if caps := rt.Capabilities(); !caps.Available {
		log.Info("runtime vm unavailable; run `agentbox doctor`", "reason", caps.Reason)
	}
	return rt, nil
}

// vmChecks are doctor's lines for the vm runtime: what it found (QEMU, kernel, accelerator)
// and, as root, a VM booted and asked to run a command.
func vmChecks(root, boot bool, cfg config.Config) (rc, sc check) {
	rc = check{Name: microvm.Name, Warn: true}
	sc = check{Name: microvm.Name + " sandbox", Warn: true}
	guestBin, dir, err := doctorScratch()
	if err != nil {
		rc.Detail, sc.Detail = err.Error(), "not tried"
		return rc, sc
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rt, err := microvm.New(ctx, microvm.Config{Root: dir, Kernel: cfg.VMKernel, Accel: cfg.VMAccel, GuestBinary: guestBin,
		CgroupParent: "agentbox-doctor-" + microvm.Name, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		rc.Detail, sc.Detail = err.Error(), "not tried"
		return rc, sc
	}
	caps := rt.Capabilities()
	rc.Runtime = &caps
	if !caps.Available {
		rc.Detail, sc.Detail = caps.Reason, "not tried: runtime unavailable"
		if _, err := exec.LookPath("qemu-system-x86_64"); err != nil || strings.Contains(caps.Reason, "kernel") {
			rc.Fix = "sudo make deps (hack/vm-deps.sh: apt-get install qemu-system-x86, and Debian's cloud kernel unpacked into " + microvm.DefaultCache + ")"
		}
		return rc, sc
	}
	defer rt.Close(context.Background()) // after the Delete below: the empty cgroup parent goes too
	rc.OK = true
	rc.Detail = fmt.Sprintf("QEMU %s microvm, accelerator %s, kernel %s, vm isolation", caps.Version, rt.Accel(), rt.Kernel())
	if why := rt.KVMReason(); why != "" {
		rc.Detail += " (no KVM: " + why + ")"
	}
	if !boot {
		sc.Detail, sc.Fix = "not tried: a boot takes seconds (under TCG)", "agentbox doctor --vm-boot"
		return rc, sc
	}
	if !root {
		sc.Detail, sc.Fix = "not tried: needs root", "sudo agentbox doctor --vm-boot"
		return rc, sc
	}
	tryOnce(ctx, rt, &sc, "VM", "booted a VM", 10*time.Millisecond)
	return rc, sc
}
