package microvm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// kvmProbeTimeout bounds the probe boot: a kernel under working KVM reaches its root mount in
// well under a second.
const kvmProbeTimeout = 10 * time.Second

// pickAccel decides the accelerator: TCG when asked; KVM when asked and a probe boot works
// (else the runtime is unavailable); auto takes KVM only when the probe proves it.
func (r *Runtime) pickAccel(ctx context.Context) (string, string) {
	if r.cfg.Accel == AccelTCG {
		return AccelTCG, ""
	}
	err := r.probeKVM(ctx)
	switch {
	case err == nil:
		return AccelKVM, ""
	case r.cfg.Accel == AccelKVM:
		return "", fmt.Sprintf("--vm-accel kvm: %v", err)
	default:
		r.log.Info("vm runtime: KVM does not boot a guest here; using TCG", "reason", err)
		r.kvmReason = err.Error()
		return AccelTCG, ""
	}
}

// probeKVM boots the guest kernel under KVM with no root file system: it must reach its
// "VFS: Unable to mount root fs" panic within kvmProbeTimeout. The result is cached beside the
// runtime's other assets, keyed by QEMU's version and the kernel's identity.
func (r *Runtime) probeKVM(ctx context.Context) error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("/dev/kvm: %w", err)
	}
	f.Close()
	fi, err := os.Stat(r.cfg.Kernel)
	if err != nil {
		return err
	}
	key := fmt.Sprintf("%s|%s|%d|%d", r.caps.Version, r.cfg.Kernel, fi.Size(), fi.ModTime().UnixNano())
	// A host fact: kept host-wide where make deps put the kernel (every server and test shares
	// one probe), else in the runtime's own cache.
	cache := filepath.Join(DefaultCache, "kvm-probe.json")
	if unix.Access(DefaultCache, unix.W_OK) != nil {
		cache = filepath.Join(r.cfg.Root, "cache", "kvm-probe.json")
	}
	var cached struct{ Key, Err string }
	if b, err := os.ReadFile(cache); err == nil && json.Unmarshal(b, &cached) == nil && cached.Key == key {
		if cached.Err == "" {
			return nil
		}
		return fmt.Errorf("%s", cached.Err)
	}
	perr := r.bootProbe(ctx)
	cached.Key, cached.Err = key, ""
	if perr != nil {
		cached.Err = perr.Error()
	}
	b, _ := json.Marshal(cached)
	_ = writeAtomic(cache, b, 0o644)
	return perr
}

func (r *Runtime) bootProbe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, kvmProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(pctx, r.qemu, "-M", "microvm", "-accel", "kvm", "-m", "128", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-sandbox", "on",
		"-kernel", r.cfg.Kernel, "-append", "console=ttyS0 panic=-1", "-serial", "stdio")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	s := out.String()
	if strings.Contains(s, "Unable to mount root fs") || strings.Contains(s, "Kernel panic") {
		return nil
	}
	if pctx.Err() != nil {
		return fmt.Errorf("a probe boot under KVM did not reach the kernel's root mount within %s (a /dev/kvm that cannot boot a stock kernel, such as PVM's)", kvmProbeTimeout)
	}
	if len(s) > 300 {
		s = s[len(s)-300:]
	}
	return fmt.Errorf("a probe boot under KVM failed: %v: %s", err, strings.TrimSpace(s))
}
