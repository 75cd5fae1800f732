package vminit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/tmpfs"
)

const agentSock = "/.agentbox/run/agent.sock"

// Disk labels: the image's root (read-only) and the sandbox's own disk, told apart by their
// ext4 labels rather than by the order the kernel finds them in.
const (
	RootLabel = "agentbox-root"
	DataLabel = "agentbox-data"
)

// Main is PID 1 of a VM: it never returns while the VM runs (its exit panics the kernel, which
// the host sees as the VM's death). Any error is printed on the console, then the VM powers off.
func Main(args []string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg, err := boot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentbox vm init:", err)
		return halt()
	}
	if err := unix.Sethostname([]byte(cfg.ID)); err != nil {
		log.Warn("vm init: hostname", "err", err)
	}
	os.Clearenv()
	os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	os.Setenv("HOME", "/root")
	for k, v := range cfg.Env {
		os.Setenv(k, v)
	}
	user := cfg.User
	if user == "" {
		user = "agent"
	}
	u, err := guest.ParseUser(user)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentbox vm init:", err)
		return halt()
	}
	cgroup, err := commandCgroup(cfg.PidsLimit)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentbox vm init: the commands' cgroup:", err)
		return halt()
	}
	// As in the other runtimes' sandboxes, no command gains privileges by exec (a setuid
	// binary): the default user stays unprivileged; root is asked for by name (user "root").
	// (A thread's attribute: every thread of the process, or a command started from another
	// would not inherit it.)
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
		fmt.Fprintln(os.Stderr, "agentbox vm init: no_new_privs:", e)
		return halt()
	}
	ctx := context.Background()
	served := make(chan error, 1)
	go func() {
		served <- guest.Run(ctx, guest.ServerConfig{Socket: agentSock, Workdir: cfg.Workdir, Logger: log, DefaultUser: &u, CommandCgroup: cgroup})
	}()
	go bridge(log)
	err = <-served
	fmt.Fprintln(os.Stderr, "agentbox vm init: the agent stopped:", err)
	return halt()
}

func halt() int {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	return 1
}

// boot mounts the kernel's file systems, loads the modules, mounts the root, reads the VM's
// config from the sandbox's disk and switches to the root.
func boot() (Config, error) {
	cfg, err := boot1()
	if err != nil {
		return cfg, err
	}
	return cfg, boot2(cfg)
}

func boot1() (Config, error) {
	var none Config
	for _, m := range []struct{ src, dst, fs string }{
		{"devtmpfs", "/dev", "devtmpfs"}, {"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil && err != unix.EBUSY {
			return none, fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := loadModules(); err != nil {
		return none, err
	}
	lowerDev, err := waitForLabel(RootLabel, 10*time.Second)
	if err != nil {
		return none, err
	}
	dataDev, err := waitForLabel(DataLabel, 10*time.Second)
	if err != nil {
		return none, err
	}
	for _, d := range []string{"/lower", "/data", "/newroot"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return none, err
		}
	}
	if err := unix.Mount(lowerDev, "/lower", "ext4", unix.MS_RDONLY|unix.MS_NODEV, "noload"); err != nil {
		return none, fmt.Errorf("mount the image's root: %w", err)
	}
	if err := unix.Mount(dataDev, "/data", "ext4", unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return none, fmt.Errorf("mount the sandbox's disk: %w", err)
	}
	for _, d := range []string{"/data/root/upper", "/data/root/work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return none, err
		}
	}
	if err := unix.Mount("overlay", "/newroot", "overlay", 0,
		"lowerdir=/lower,upperdir=/data/root/upper,workdir=/data/root/work"); err != nil {
		return none, fmt.Errorf("mount the root overlay: %w", err)
	}
	cfg, err := readConfig()
	if err != nil {
		return none, err
	}
	if cfg.Network == "egress" {
		if cfg.caBundle, err = os.ReadFile(filepath.Join("/data", CABundleFile)); err != nil && !os.IsNotExist(err) {
			return none, err
		}
	}
	return cfg, nil
}

func boot2(cfg Config) error {
	for _, d := range []string{"dev", "proc", "sys"} {
		_ = os.MkdirAll("/newroot/"+d, 0o755)
		if err := unix.Mount("/"+d, "/newroot/"+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move /%s: %w", d, err)
		}
	}
	if err := os.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	// The tmpfs are bounded by the containers' rule (internal/tmpfs), applied to the memory the
	// guest has left once booted (its kernel takes a good part of a small VM's RAM): filled,
	// they must leave the agent and the commands memory to run in. Unbounded, a full /tmp drove
	// the guest's OOM killer until nothing answered; sized from the VM's RAM, a 128 MiB VM's
	// full tmpfs left too little, and the guest, with only its init left to kill, panicked.
	mem := memAvailableMiB()
	for _, m := range []struct{ src, dst, fs, opts string }{
		{"devpts", "/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620"},
		{"tmpfs", "/dev/shm", "tmpfs", fmt.Sprintf("mode=1777,size=%dm", tmpfs.ShmMiB(mem))},
		{"tmpfs", "/tmp", "tmpfs", fmt.Sprintf("mode=1777,size=%dm", tmpfs.TmpMiB(mem))},
		{"tmpfs", "/run", "tmpfs", fmt.Sprintf("mode=0755,size=%dm", runMiB)},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, unix.MS_NOSUID|unix.MS_NODEV, m.opts); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := loopbackUp(); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if cfg.Network == "egress" {
		if err := egressFiles(cfg.caBundle); err != nil {
			return fmt.Errorf("egress: %w", err)
		}
	}
	_ = os.Remove("/dev/ptmx")
	_ = os.Symlink("pts/ptmx", "/dev/ptmx")
	if fi, err := os.Stat("/workspace"); err != nil || !fi.IsDir() {
		if err := os.MkdirAll("/workspace", 0o755); err != nil {
			return err
		}
		_ = os.Chown("/workspace", 1000, 1000)
	}
	return nil
}

// memAvailableMiB is the memory the guest's kernel says is available now (/proc/meminfo's
// MemAvailable); unread, the least a VM has (the tmpfs then take their smallest sizes).
func memAvailableMiB() int64 {
	const least = 64
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return least
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil && kb>>10 > 0 {
				return kb >> 10
			}
		}
	}
	return least
}

// runMiB is /run's size: sockets and pid files, not data.
const runMiB = 16

// commandsCgroup is the cgroup (v2) the agent starts every command in, under the VM's own root.
const commandsCgroup = "/sys/fs/cgroup/commands"

// commandCgroup mounts the VM's cgroup2 hierarchy and makes the commands' cgroup with pids.max
// at pidsLimit ("" and nil when there is no limit): a fork bomb of a command then meets EAGAIN
// while the agent, outside the cgroup, goes on answering.
func commandCgroup(pidsLimit int64) (string, error) {
	if pidsLimit <= 0 {
		return "", nil
	}
	if err := os.MkdirAll("/sys/fs/cgroup", 0o755); err != nil {
		return "", err
	}
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil && err != unix.EBUSY {
		return "", fmt.Errorf("mount cgroup2: %w", err)
	}
	// memory too: its memory.events counts the commands the kernel's OOM killer ends, which
	// the agent reads to say oom_killed.
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+pids +memory"), 0o644); err != nil {
		return "", fmt.Errorf("enable the pids and memory controllers: %w", err)
	}
	if err := os.Mkdir(commandsCgroup, 0o755); err != nil && !os.IsExist(err) {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(commandsCgroup, "pids.max"), []byte(fmt.Sprint(pidsLimit)), 0o644); err != nil {
		return "", fmt.Errorf("pids.max: %w", err)
	}
	return commandsCgroup, nil
}

// loopbackUp brings lo up (the VM has no other interface).
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// egressFiles puts /etc/resolv.conf naming 127.0.0.1 (the agent's DNS listener) and the CA
// bundle in place, both on read-only mounts, as the other runtimes do.
func egressFiles(bundle []byte) error {
	if err := os.MkdirAll("/etc/agentbox", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", "/etc/agentbox", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=8m"); err != nil {
		return err
	}
	if err := os.WriteFile(caBundlePath, bundle, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile("/etc/agentbox/resolv.conf", []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile("/etc/resolv.conf", nil, 0o644); err != nil {
		return err
	}
	if err := unix.Mount("/etc/agentbox/resolv.conf", "/etc/resolv.conf", "", unix.MS_BIND, ""); err != nil {
		return err
	}
	if err := unix.Mount("", "/etc/resolv.conf", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return err
	}
	return unix.Mount("", "/etc/agentbox", "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}

// loadModules loads the initramfs's modules in the order ModulesList gives.
func loadModules() error {
	list, err := os.ReadFile(ModulesList)
	if err != nil {
		return nil // a kernel with the drivers built in
	}
	for _, name := range strings.Fields(string(list)) {
		f, err := os.Open(filepath.Join("/modules", name))
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && err != unix.EEXIST {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return nil
}

// waitForLabel returns the virtio disk whose ext4 label is label, waiting up to d for it.
func waitForLabel(label string, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		devs, _ := filepath.Glob("/sys/block/vd*")
		for _, sys := range devs {
			dev := "/dev/" + filepath.Base(sys)
			if ext4Label(dev) == label {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no disk labelled %s appeared within %s", label, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ext4Label reads an ext4 file system's volume name from its superblock (offset 1024, the
// name at 120, 16 bytes).
func ext4Label(dev string) string {
	f, err := os.Open(dev)
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 16)
	if _, err := f.ReadAt(b, 1024+120); err != nil {
		return ""
	}
	return strings.TrimRight(string(b), "\x00")
}

func readConfig() (Config, error) {
	var cfg Config
	b, err := os.ReadFile(filepath.Join("/data", ConfigPath))
	if err != nil {
		return cfg, fmt.Errorf("the VM's config: %w", err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return cfg, fmt.Errorf("the VM's config: %w", err)
	}
	return cfg, nil
}

// findPort returns the /dev path of the virtserialport named PortName.
func findPort() (string, error) {
	names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err == nil && strings.TrimSpace(string(b)) == PortName {
			return "/dev/" + filepath.Base(filepath.Dir(n)), nil
		}
	}
	return "", fmt.Errorf("no virtio-serial port named %s", PortName)
}

// bridge serves the host over the port for as long as the VM runs: each host connection is a
// handshake then a yamux session whose streams are spliced to the agent's unix socket. A
// session ends when the host disconnects (reads see EOF); the port is reopened for the next.
func bridge(log *slog.Logger) {
	var path string
	for {
		p, err := findPort()
		if err == nil {
			path = p
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			log.Warn("vm init: open the agent port", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		serveSession(f, log)
		f.Close()
		time.Sleep(20 * time.Millisecond)
	}
}

func serveSession(f *os.File, log *slog.Logger) {
	rest, err := guestHandshake(f)
	if err != nil {
		return // EOF: no host connected yet
	}
	sess, err := yamux.Server(ReadWriteCloser{Reader: rest, WriteCloser: f}, YamuxConfig())
	if err != nil {
		log.Warn("vm init: session", "err", err)
		return
	}
	defer sess.Close()
	for {
		st, err := sess.Accept()
		if err != nil {
			return
		}
		go splice(st)
	}
}

func splice(st net.Conn) {
	defer st.Close()
	c, err := net.Dial("unix", agentSock)
	if err != nil {
		return
	}
	defer c.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(c, st)
		if uc, ok := c.(*net.UnixConn); ok {
			_ = uc.CloseWrite()
		}
	}()
	_, _ = io.Copy(st, c)
	_ = st.Close()
	wg.Wait()
}
