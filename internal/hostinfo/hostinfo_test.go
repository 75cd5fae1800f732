package hostinfo

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const hybridMountinfo = `23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,release_agent=/x,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 1 0:40 / /mnt/with\040space rw - ext4 /dev/sda1 rw
`

func TestParseMountinfoAndCgroupMounts(t *testing.T) {
	t.Parallel()
	entries, err := parseMountinfo(strings.NewReader(hybridMountinfo))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 7 {
		t.Fatalf("got %d entries", len(entries))
	}
	if got := entries[6].mountPoint; got != "/mnt/with space" {
		t.Fatalf("unescape: %q", got)
	}
	got := cgroupMountsFrom(entries)
	want := []CgroupMount{
		{Path: "/sys/fs/cgroup/cpu,cpuacct", Version: 1, Options: []string{"cpu", "cpuacct"}},
		{Path: "/sys/fs/cgroup/memory", Version: 1, Options: []string{"memory"}},
		{Path: "/sys/fs/cgroup/systemd", Version: 1, Options: []string{"name=systemd"}},
		{Path: "/sys/fs/cgroup/unified", Version: 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cgroup mounts:\n got %+v\nwant %+v", got, want)
	}
}

func TestCgroupModeFrom(t *testing.T) {
	t.Parallel()
	v1 := CgroupMount{Path: "/sys/fs/cgroup/memory", Version: 1}
	unified := CgroupMount{Path: "/sys/fs/cgroup/unified", Version: 2}
	pure := CgroupMount{Path: "/sys/fs/cgroup", Version: 2}
	for _, tc := range []struct {
		name   string
		mounts []CgroupMount
		want   string
	}{
		{"none", nil, ""},
		{"v1", []CgroupMount{v1}, CgroupV1},
		{"hybrid", []CgroupMount{v1, unified}, CgroupHybrid},
		{"v2", []CgroupMount{pure}, CgroupV2},
		{"v2 elsewhere", []CgroupMount{unified}, CgroupV2},
	} {
		if got := cgroupModeFrom(tc.mounts); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestParseMemTotal(t *testing.T) {
	t.Parallel()
	got, err := parseMemTotal(strings.NewReader("MemTotal:       24684084 kB\nMemFree: 1 kB\n"))
	if err != nil || got != 24105 {
		t.Fatalf("got %d, %v", got, err)
	}
	if _, err := parseMemTotal(strings.NewReader("MemFree: 1 kB\n")); err == nil {
		t.Fatal("missing MemTotal must be an error")
	}
}

func TestUserNamespacesAt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for content, want := range map[string]bool{"0\n": false, "15000\n": true, "junk": false} {
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := userNamespacesAt(p); got != want {
			t.Errorf("%q: got %v", content, got)
		}
	}
	if userNamespacesAt(filepath.Join(dir, "absent")) {
		t.Error("absent file must mean no user namespaces")
	}
}

// TestProbeThisHost checks the live readers against this host without assuming its shape.
func TestProbeThisHost(t *testing.T) {
	t.Parallel()
	info := Probe()
	if len(info.Errors) > 0 {
		t.Fatalf("probe errors: %v", info.Errors)
	}
	switch info.CgroupMode {
	case CgroupV1, CgroupHybrid, CgroupV2:
	default:
		t.Fatalf("cgroup mode %q", info.CgroupMode)
	}
	if mode := cgroupModeFrom(info.CgroupMounts); mode != info.CgroupMode {
		t.Errorf("statfs says %q, mount table says %q", info.CgroupMode, mode)
	}
	if info.HardRlimits.NOFILE == 0 || info.HardRlimits.NPROC == 0 {
		t.Errorf("rlimits %+v", info.HardRlimits)
	}
	if info.NumCPU < 1 || info.MemTotalMiB < 64 {
		t.Errorf("cpu %d mem %d MiB", info.NumCPU, info.MemTotalMiB)
	}
	t.Logf("%+v", info)
}
