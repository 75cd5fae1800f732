package security

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

func fsAttacks() []attack {
	return []attack{
		{
			name: "fs-write-root",
			does: "as the agent user and as root, creates files and directories in /, /usr, /usr/bin, /etc, /bin, /lib and /.agentbox, and remounts / read-write",
			want: "as the agent user every write fails; as root every write succeeds and lands only in the sandbox's own writable layers on its disk (on image host, /usr and the host's other directories are each an overlay of their own over the host's, with its upper on the disk; on an image, the image's /usr), owned by its id range; the remount fails; on the host, /usr, /usr/bin, /bin, /lib and /etc hold no new entry and the shared rootfs directory is unchanged",
			run: func(a *arena) {
				name := "absec-" + randHex(6)
				rootfs := filepath.Join(a.s.stateDir, "runtimes", a.rt, "rootfs", "host")
				before := dirEntries(a.t, rootfs)
				dirs := []string{"/", "/usr", "/usr/bin", "/etc", "/bin", "/lib", "/.agentbox"}
				// A name per directory: on a merged-/usr host /bin is /usr/bin.
				names := map[string]string{}
				var script []string
				for i, d := range dirs {
					names[d] = fmt.Sprintf("%s-%d", name, i)
					p := path.Join(d, names[d])
					script = append(script, "touch "+p+" 2>/dev/null && echo WROTE "+d, "mkdir "+p+"-d 2>/dev/null && echo MKDIR "+d)
				}
				script = append(script, "mount -o remount,rw / 2>/dev/null && echo REMOUNTED", "true")
				if out := strings.TrimSpace(a.execIn(a.id, apiExec("", "sh", "-c", strings.Join(script, "; "))).Stdout); out != "" {
					a.t.Errorf("as agent: %s", out)
				}
				var want []string
				for _, d := range dirs {
					want = append(want, "WROTE "+d, "MKDIR "+d)
				}
				got := strings.Fields(strings.ReplaceAll(a.execIn(a.id, apiExec("root", "sh", "-c", strings.Join(script, "; "))).Stdout, "\n", " "))
				var pairs []string
				for i := 0; i+1 < len(got); i += 2 {
					pairs = append(pairs, got[i]+" "+got[i+1])
				}
				if strings.Join(pairs, ",") != strings.Join(want, ",") {
					a.t.Errorf("as root: wrote %v, want exactly %v", pairs, want)
				}
				for _, d := range dirs {
					for _, p := range []string{path.Join(d, names[d]), path.Join(d, names[d]) + "-d"} {
						if _, err := os.Lstat(p); err == nil {
							os.RemoveAll(p)
							a.t.Errorf("HOLE: %s appeared on the host", p)
						}
					}
				}
				if after := dirEntries(a.t, rootfs); strings.Join(after, ",") != strings.Join(before, ",") {
					a.t.Errorf("HOLE: the shared rootfs changed: %v -> %v", before, after)
				}
				// Where root's writes are on the sandbox's disk: the root's upper, or on image
				// host the upper of /usr's own overlay.
				disk := filepath.Join(a.sandboxDir(a.id), "disk", "rootfs")
				uppers := map[string]string{
					"/etc":     filepath.Join(disk, "upper", "etc", names["/etc"]),
					"/usr":     filepath.Join(disk, "upper", "usr", names["/usr"]),
					"/usr/bin": filepath.Join(disk, "upper", "usr", "bin", names["/usr/bin"]),
				}
				if a.image == "" {
					uppers["/usr"] = filepath.Join(disk, "binds", "usr", "upper", names["/usr"])
					uppers["/usr/bin"] = filepath.Join(disk, "binds", "usr", "upper", "bin", names["/usr/bin"])
				}
				for d, upper := range uppers {
					var st unix.Stat_t
					if err := unix.Lstat(upper, &st); err != nil {
						a.t.Errorf("root's %s/%s is not in the sandbox's writable layer: %v", d, names[d], err)
					} else if st.Uid < 65536 {
						a.t.Errorf("root's %s/%s is host uid %d on the sandbox's disk, want its range", d, names[d], st.Uid)
					}
				}
			},
		},
		{
			name:   "fs-proc-sys",
			does:   "as root, writes kernel.hostname, kernel.domainname, kernel.core_pattern (a pipe to a workspace script), kernel.modprobe and /proc/sysrq-trigger, and calls sethostname/setdomainname",
			want:   "every write fails; the host's hostname, domainname, core_pattern and modprobe are unchanged; the sandbox's hostname is still its id",
			gvisor: "gVisor's /proc/sys is its own: writes there fail or touch only the sentry's copy; the host's values are what is checked, the same as for runc",
			run: func(a *arena) {
				files := []string{"/proc/sys/kernel/hostname", "/proc/sys/kernel/domainname", "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe"}
				before := map[string]string{}
				for _, f := range files {
					b, _ := os.ReadFile(f)
					before[f] = string(b)
				}
				res := a.root(`echo '#!/bin/sh' > /workspace/x; chmod +x /workspace/x
for f in hostname domainname; do echo pwned > /proc/sys/kernel/$f 2>/dev/null && echo WROTE $f; done
echo '|/workspace/x %p' > /proc/sys/kernel/core_pattern 2>/dev/null && echo WROTE core_pattern
echo /workspace/x > /proc/sys/kernel/modprobe 2>/dev/null && echo WROTE modprobe
echo h > /proc/sysrq-trigger 2>/dev/null && echo WROTE sysrq
hostname pwned 2>/dev/null && echo SETHOSTNAME
true`)
				a.t.Logf("inside: %q", res.Stdout)
				py := a.pyAs("root", `
for name in ("sethostname", "setdomainname"):
    out(name, call(name, b"pwned", 5)[1])
`, "")
				a.t.Logf("%s", py.Stdout)
				for _, f := range files {
					if b, _ := os.ReadFile(f); string(b) != before[f] {
						a.t.Errorf("HOLE: host %s changed: %q -> %q", f, before[f], b)
					}
				}
				if !a.gvisor() && strings.TrimSpace(res.Stdout) != "" {
					a.t.Errorf("writes to /proc/sys succeeded inside: %q", res.Stdout)
				}
				if h := a.sh("hostname"); h.Stdout != a.id+"\n" {
					a.t.Errorf("the sandbox's hostname is %q, want its id", h.Stdout)
				}
			},
		},
		{
			name:   "fs-sys",
			does:   "as root, writes /sys/kernel/uevent_helper, transparent_hugepage/enabled, and its own cgroup limits under /sys/fs/cgroup (memory.limit_in_bytes and memory.max to unlimited, pids.max and pids to max, cpu.cfs_quota_us to -1)",
			want:   "every write fails; on the host, uevent_helper and THP are unchanged and the sandbox's cgroup keeps its memory, pids and cpu limits",
			gvisor: "gVisor's /sys and cgroupfs are its own; the host cgroup checked is the sentry's, which must keep its limits the same way",
			run: func(a *arena) {
				hostFiles := []string{"/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled"}
				before := map[string]string{}
				for _, f := range hostFiles {
					b, _ := os.ReadFile(f)
					before[f] = string(b)
				}
				limits := [][2]string{{"memory", "memory.limit_in_bytes"}, {"pids", "pids.max"}, {"cpu", "cpu.cfs_quota_us"}}
				lim := map[string]string{}
				for _, l := range limits {
					v, err := a.cgroupFile(a.id, l[0], l[1])
					if err != nil {
						a.t.Logf("host cgroup %s/%s: %v", l[0], l[1], err)
						continue
					}
					lim[l[1]] = v
				}
				res := a.root(`w() { echo "$2" > "$1" 2>/dev/null && echo "WROTE $1"; }
w /sys/kernel/uevent_helper /workspace/x
w /sys/kernel/mm/transparent_hugepage/enabled never
for d in /sys/fs/cgroup /sys/fs/cgroup/memory /sys/fs/cgroup/pids /sys/fs/cgroup/cpu /sys/fs/cgroup/cpu,cpuacct; do
  w $d/memory.limit_in_bytes -1; w $d/memory.max max; w $d/pids.max max; w $d/cpu.cfs_quota_us -1; w $d/cpu.max max
done
true`)
				if strings.TrimSpace(res.Stdout) != "" {
					mnt := a.root("grep ' /sys/fs/cgroup ' /proc/self/mountinfo; true")
					a.t.Errorf("root could write under the read-only /sys: %q (those files are not cgroup controls, and the host limits are checked below, but /sys/fs/cgroup itself is writable: %s)",
						res.Stdout, strings.TrimSpace(mnt.Stdout))
				}
				for _, f := range hostFiles {
					if b, _ := os.ReadFile(f); string(b) != before[f] {
						a.t.Errorf("HOLE: host %s changed: %q -> %q", f, before[f], b)
					}
				}
				for _, l := range limits {
					if v, err := a.cgroupFile(a.id, l[0], l[1]); err == nil && v != lim[l[1]] {
						a.t.Errorf("HOLE: the sandbox's host cgroup %s changed: %s -> %s", l[1], lim[l[1]], v)
					}
				}
				if len(lim) == 0 {
					a.t.Errorf("no host cgroup limit of %s could be read", a.id)
				}
			},
		},
		{
			name:   "fs-masked-paths",
			does:   "as root and as the agent user, reads /proc/kcore, /proc/keys, /proc/timer_list, /proc/sched_debug, /proc/latency_stats, /proc/kmsg, /dev/kmsg, and lists /proc/acpi, /proc/scsi, /sys/firmware; reads /proc/kallsyms",
			want:   "each read returns nothing (0 bytes or an error), each listing is empty or refused, and /proc/kallsyms shows no kernel address (all zeros)",
			gvisor: "gVisor's procfs and sysfs do not have most of these files (refused) and its kallsyms is empty: nothing of the host kernel either way",
			run: func(a *arena) {
				prog := `
leaks = []
for p in ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats", "/proc/kmsg", "/dev/kmsg", "/proc/timer_stats"]:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        if data:
            leaks.append("%s: %d bytes" % (p, len(data)))
        out(p, "read", len(data))
    except OSError as e:
        out(p, errname(e))
for p in ["/proc/acpi", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"]:
    try:
        names = os.listdir(p)
        if names:
            leaks.append("%s lists %s" % (p, names[:5]))
        out(p, "lists", len(names))
    except OSError as e:
        out(p, errname(e))
try:
    with open("/proc/kallsyms") as f:
        for line in f:
            addr = line.split()[0]
            if addr.strip("0"):
                leaks.append("kallsyms shows address " + addr)
                break
except OSError as e:
    out("/proc/kallsyms", errname(e))
out("LEAKS" if leaks else "NOTHING")
for l in leaks:
    out(l)
`
				for _, u := range users {
					res := a.pyAs(u, prog, "")
					if !strings.Contains(res.Stdout, "\nNOTHING\n") {
						a.t.Errorf("as %s, a masked path reveals something:\n%s%s", userName(u), res.Stdout, res.Stderr)
					}
				}
			},
		},
	}
}
