package oci

import (
	"fmt"
	"slices"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// deniedSyscalls are refused with ENOSYS on top of Docker's default profile, whatever a future
// version of that profile allows: io_uring (a large, often-exploited kernel surface that also
// bypasses seccomp for the operations it carries), userfaultfd (the classic tool for widening
// kernel race windows), the kernel keyring (not namespaced), and bpf. ENOSYS makes libraries fall
// back to the plain syscalls (liburing, glibc) instead of failing hard, and differs from the
// profile's default action (EPERM), which libseccomp requires of an explicit rule.
var deniedSyscalls = []string{
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"userfaultfd",
	"keyctl", "add_key", "request_key",
	"bpf",
}

// deniedSocketFamilies are socket(2) domains refused with EAFNOSUPPORT by an argument-filtered
// rule: AF_VSOCK reaches the host's and other VMs' vsock endpoints (global across network
// namespaces before Linux 7.0), AF_ALG is the kernel crypto API (a recurring source of
// privilege escalations).
var deniedSocketFamilies = map[string]uint64{"AF_VSOCK": unix.AF_VSOCK, "AF_ALG": unix.AF_ALG}

// seccompHardening is the Capabilities.Hardening entry of the profile seccompProfile builds.
const seccompHardening = "seccomp:docker-default+deny(io_uring,userfaultfd,keyctl,bpf,vsock,alg),native-arch-only"

// seccompProfile generates Docker's default seccomp profile for a spec whose
// Process.Capabilities are final (the profile allows some syscalls only to holders of some
// capabilities), then removes every denied syscall from its allow rules and adds explicit
// errno rules for them and for the denied socket families.
func seccompProfile(s *specs.Spec) (*specs.LinuxSeccomp, error) {
	if s.Process == nil || s.Process.Capabilities == nil {
		return nil, fmt.Errorf("seccomp: the spec's capabilities must be set before generating the profile")
	}
	p, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		return nil, fmt.Errorf("seccomp: generate the default profile: %w", err)
	}
	if p == nil || p.DefaultAction != specs.ActErrno {
		return nil, fmt.Errorf("seccomp: the default profile does not deny by default")
	}
	// The native architecture only (Docker's adds its 32-bit sub-architectures): a 32-bit
	// syscall from a sandbox meets the runtime's bad-architecture action instead, and the
	// filter the runtime compiles at every start is a third of the size (runc spends ~30 ms
	// less per create on this host, crun more).
	if len(p.Architectures) == 0 {
		return nil, fmt.Errorf("seccomp: the default profile names no architecture for this one")
	}
	p.Architectures = p.Architectures[:1]
	kept := p.Syscalls[:0]
	for _, rule := range p.Syscalls {
		// Whatever the profile does with a denied syscall, the rule added below replaces it:
		// libseccomp refuses two rules for one syscall with different actions.
		rule.Names = slices.DeleteFunc(rule.Names, func(n string) bool { return slices.Contains(deniedSyscalls, n) })
		if len(rule.Names) > 0 {
			kept = append(kept, rule)
		}
	}
	p.Syscalls = kept
	for name, family := range deniedSocketFamilies {
		for _, rule := range p.Syscalls {
			if rule.Action == specs.ActAllow && slices.Contains(rule.Names, "socket") && argsMatch(rule.Args, []uint64{family}) {
				return nil, fmt.Errorf("seccomp: the default profile allows socket(%s); refusing to rely on rule order to deny it", name)
			}
		}
	}
	p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{
		Names: slices.Clone(deniedSyscalls), Action: specs.ActErrno, ErrnoRet: ptr(uint(unix.ENOSYS)),
	})
	for _, name := range []string{"AF_VSOCK", "AF_ALG"} {
		p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{
			Names: []string{"socket"}, Action: specs.ActErrno, ErrnoRet: ptr(uint(unix.EAFNOSUPPORT)),
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: deniedSocketFamilies[name], Op: specs.OpEqualTo}},
		})
	}
	return p, nil
}

// argsMatch evaluates a rule's argument conditions (all must hold, as libseccomp does) against
// a call's arguments. A condition on an argument beyond args does not hold.
func argsMatch(conds []specs.LinuxSeccompArg, args []uint64) bool {
	for _, c := range conds {
		if int(c.Index) >= len(args) {
			return false
		}
		v := args[c.Index]
		var ok bool
		switch c.Op {
		case specs.OpEqualTo:
			ok = v == c.Value
		case specs.OpNotEqual:
			ok = v != c.Value
		case specs.OpLessThan:
			ok = v < c.Value
		case specs.OpLessEqual:
			ok = v <= c.Value
		case specs.OpGreaterThan:
			ok = v > c.Value
		case specs.OpGreaterEqual:
			ok = v >= c.Value
		case specs.OpMaskedEqual:
			ok = v&c.Value == c.ValueTwo
		}
		if !ok {
			return false
		}
	}
	return true
}

// forGVisor adapts a profile to runsc --oci-seccomp. gVisor answers every SECCOMP_RET_ERRNO rule
// with EPERM whatever its errno (as runc once did), so Docker's clone3 rule (ENOSYS, which makes
// glibc fall back to clone, whose flags the profile can filter) would break every threaded
// program. clone3 is left to gVisor (the 2022 runsc answers ENOSYS itself, later ones implement
// it): the namespaces it could make are the user-space kernel's own.
func forGVisor(p *specs.LinuxSeccomp) *specs.LinuxSeccomp {
	out := *p
	out.Syscalls = nil
	for _, rule := range p.Syscalls {
		if rule.Action == specs.ActErrno && rule.ErrnoRet != nil && *rule.ErrnoRet == uint(unix.ENOSYS) && slices.Contains(rule.Names, "clone3") {
			rule.Names = slices.DeleteFunc(slices.Clone(rule.Names), func(n string) bool { return n == "clone3" })
			if len(rule.Names) == 0 {
				continue
			}
		}
		out.Syscalls = append(out.Syscalls, rule)
	}
	out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActAllow})
	return &out
}
