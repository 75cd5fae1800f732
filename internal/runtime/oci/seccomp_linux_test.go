package oci

import (
	goruntime "runtime"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// allowedBy reports whether any rule of p that is not an errno or kill rule lets the call
// through (a rule without arguments matches every call).
func allowedBy(p *specs.LinuxSeccomp, name string, args ...uint64) []specs.LinuxSyscall {
	var hits []specs.LinuxSyscall
	for _, r := range p.Syscalls {
		if r.Action == specs.ActErrno || r.Action == specs.ActKill || r.Action == specs.ActKillProcess || r.Action == specs.ActKillThread {
			continue
		}
		if slices.Contains(r.Names, name) && argsMatch(r.Args, args) {
			hits = append(hits, r)
		}
	}
	return hits
}

func TestSeccompProfile(t *testing.T) {
	t.Parallel()
	s := buildSpec(testInput())
	p, err := seccompProfile(s)
	if err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != specs.ActErrno || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != uint(unix.EPERM) {
		t.Errorf("default action %s errno %v, want deny with EPERM", p.DefaultAction, p.DefaultErrnoRet)
	}
	native := map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}[goruntime.GOARCH]
	if native != "" && !slices.Equal(p.Architectures, []specs.Arch{native}) {
		t.Errorf("architectures %v, want only the native %s", p.Architectures, native)
	}
	// Docker's profile itself: ordinary syscalls allowed, mount and unshare not (no CAP_SYS_ADMIN).
	for _, name := range []string{"read", "openat", "execve", "clone", "socket"} {
		if len(allowedBy(p, name, unix.AF_INET)) == 0 {
			t.Errorf("%s is not allowed", name)
		}
	}
	for _, name := range []string{"mount", "unshare", "setns", "kexec_load", "init_module", "open_by_handle_at"} {
		if hits := allowedBy(p, name); len(hits) > 0 {
			t.Errorf("%s allowed by %+v", name, hits)
		}
	}
	// The additional denials: no rule allows them, and an explicit rule says which errno.
	for _, name := range deniedSyscalls {
		if hits := allowedBy(p, name); len(hits) > 0 {
			t.Errorf("denied syscall %s allowed by %+v", name, hits)
		}
		n := 0
		for _, r := range p.Syscalls {
			if slices.Contains(r.Names, name) {
				n++
				if r.Action != specs.ActErrno || r.ErrnoRet == nil || *r.ErrnoRet != uint(unix.ENOSYS) || len(r.Args) != 0 {
					t.Errorf("rule for %s: %+v", name, r)
				}
			}
		}
		if n != 1 {
			t.Errorf("%s is named by %d rules, want exactly 1", name, n)
		}
	}
	for name, family := range deniedSocketFamilies {
		if hits := allowedBy(p, "socket", family); len(hits) > 0 {
			t.Errorf("socket(%s) allowed by %+v", name, hits)
		}
		found := false
		for _, r := range p.Syscalls {
			if slices.Equal(r.Names, []string{"socket"}) && r.Action == specs.ActErrno && len(r.Args) == 1 &&
				r.Args[0] == (specs.LinuxSeccompArg{Index: 0, Value: family, Op: specs.OpEqualTo}) {
				found = r.ErrnoRet != nil && *r.ErrnoRet == uint(unix.EAFNOSUPPORT)
			}
		}
		if !found {
			t.Errorf("no socket(%s) rule returning EAFNOSUPPORT", name)
		}
	}
	for _, family := range []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK} {
		if len(allowedBy(p, "socket", family)) == 0 {
			t.Errorf("socket(%d) is not allowed", family)
		}
	}
}

// TestSeccompFollowsCapabilities checks that the profile is generated from the spec's
// capabilities: Docker's profile allows mount and bpf only with CAP_SYS_ADMIN.
func TestSeccompFollowsCapabilities(t *testing.T) {
	t.Parallel()
	s := buildSpec(testInput())
	s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
	p, err := seccompProfile(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(allowedBy(p, "mount")) == 0 {
		t.Error("mount not allowed with CAP_SYS_ADMIN in the bounding set")
	}
	if hits := allowedBy(p, "bpf"); len(hits) > 0 {
		t.Errorf("bpf allowed with CAP_SYS_ADMIN: %+v", hits)
	}
	if _, err := seccompProfile(&specs.Spec{Process: &specs.Process{}}); err == nil {
		t.Error("a spec without capabilities accepted")
	}
}

func TestSpecSeccompHook(t *testing.T) {
	t.Parallel()
	in := testInput()
	if s := buildSpec(in); s.Linux.Seccomp != nil {
		t.Errorf("seccomp set without the hook: %+v", s.Linux.Seccomp)
	}
	p, err := seccompProfile(buildSpec(in))
	if err != nil {
		t.Fatal(err)
	}
	in.Seccomp = p
	if s := buildSpec(in); s.Linux.Seccomp != p {
		t.Error("the hook's profile is not applied")
	}
}

func TestSeccompForGVisor(t *testing.T) {
	t.Parallel()
	p, err := seccompProfile(buildSpec(testInput()))
	if err != nil {
		t.Fatal(err)
	}
	g := forGVisor(p)
	if len(allowedBy(g, "clone3")) != 1 {
		t.Errorf("clone3 not left to gVisor")
	}
	for _, r := range g.Syscalls {
		if slices.Contains(r.Names, "clone3") && r.Action != specs.ActAllow {
			t.Errorf("clone3 still in %+v", r)
		}
	}
	for _, name := range deniedSyscalls {
		if hits := allowedBy(g, name); len(hits) > 0 {
			t.Errorf("%s allowed by %+v", name, hits)
		}
	}
	if len(allowedBy(p, "clone3")) != 0 || len(g.Syscalls) != len(p.Syscalls)+1 && len(g.Syscalls) != len(p.Syscalls) {
		t.Errorf("the original profile was changed or rules were lost: %d → %d rules", len(p.Syscalls), len(g.Syscalls))
	}
}
