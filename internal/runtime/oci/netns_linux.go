package oci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The transparent egress path on runc and crun (runtime.HardeningTransparentEgress).
//
// A sandbox of network mode egress gets a network namespace that the runtime makes itself,
// before the container starts, in the host's initial user namespace: the sandbox's root (root
// of the sandbox's own user namespace, an unprivileged host user) has no CAP_NET_ADMIN over
// it, so nothing inside can change what is set here. In it:
//
//   - lo is up (127.0.0.1/8 and ::1);
//   - the local routing table has `local 0.0.0.0/0 dev lo` (AnyIP): every IPv4 address is the
//     sandbox's own, so a connect to 203.0.113.7:443 lands on a listener on 0.0.0.0:443 (the
//     agent's), and the accepted socket's local address is the original destination. No
//     netfilter, no SO_ORIGINAL_DST; UDP to any address meets no listener (refused);
//   - IPv6 has no route but ::1 (a connect anywhere else is ENETUNREACH);
//   - net.ipv4.ip_unprivileged_port_start is 0, so the agent binds 53, 80 and 443 without any
//     capability over the namespace.
//
// The namespace is made on an OS thread of this process that unshares CLONE_NEWNET,
// configures it with plain syscalls (an ioctl for lo, one rtnetlink message for the route,
// the sysctl file, all of which act on the calling thread's namespace), bind-mounts
// /proc/thread-self/ns/net onto <Root>/netns/<id> and then exits: the goroutine never unlocks
// its thread, so the Go runtime terminates it instead of returning it to the pool. The OCI
// runtime joins the namespace by that path (runc and crun join path namespaces before they
// unshare the user namespace). Plain x/sys/unix rather than vishvananda/netlink: four
// syscalls and one 44-byte message do not need a dependency, and no netns handle has to be
// kept open or switched back.
//
// Delete unmounts and removes the file (netnsRemove: idempotent, each step tolerating the
// other's having been done); List reports any id whose file is left.

// netnsDirName is the directory under Root holding one bind-mounted netns file per sandbox.
const netnsDirName = "netns"

// unprivilegedPortStart is the namespace's sysctl that lets the agent bind ports below 1024.
const unprivilegedPortStart = "/proc/sys/net/ipv4/ip_unprivileged_port_start"

// loopbackIfindex is lo's index in every network namespace (LOOPBACK_IFINDEX).
const loopbackIfindex = 1

func (r *Runtime) netnsDir() string           { return filepath.Join(r.root, netnsDirName) }
func (r *Runtime) netnsPath(id string) string { return filepath.Join(r.netnsDir(), id) }

// makeEgressNetns creates the egress network namespace of a sandbox and pins it at path, which
// must not exist. On an error nothing is left at path (the caller's Delete also cleans up).
func makeEgressNetns(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return err
	}
	f.Close()
	if err := onNewNetns(func() error {
		if err := configureEgressNetns(); err != nil {
			return err
		}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind the network namespace at %s: %w", path, err)
		}
		return nil
	}); err != nil {
		_ = netnsRemove(path)
		return err
	}
	return nil
}

// probeEgressNetns makes and configures an egress namespace that nobody keeps (it goes with
// its thread): why the transparent path cannot work on this host, or "".
func probeEgressNetns() string {
	if err := onNewNetns(configureEgressNetns); err != nil {
		return err.Error()
	}
	return ""
}

// onNewNetns runs f on a dedicated OS thread in a new network namespace; the thread exits
// afterwards, with the namespace unless f pinned it.
func onNewNetns(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the goroutine's end terminates the thread and its namespace.
		goruntime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread is never terminated (Go wedges it): keep it pinned here, out of
			// the namespace, so that the retry lands on another thread.
			defer goruntime.UnlockOSThread()
			errc <- onNewNetns(f)
			return
		}
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare a network namespace: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// configureEgressNetns configures the calling thread's (new) network namespace.
func configureEgressNetns() error {
	if err := loopbackUp(); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	if err := addAnyIPRoute(); err != nil {
		return fmt.Errorf("add `local 0.0.0.0/0 dev lo` to the local table: %w", err)
	}
	// /proc/sys/net is the opening thread's namespace's.
	if err := os.WriteFile(unprivilegedPortStart, []byte("0"), 0); err != nil {
		return fmt.Errorf("set net.ipv4.ip_unprivileged_port_start=0: %w", err)
	}
	return nil
}

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

// addAnyIPRoute sends one RTM_NEWROUTE: `ip route add local 0.0.0.0/0 dev lo table local`.
func addAnyIPRoute() error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	attr := func(typ uint16, v uint32) []byte {
		b := make([]byte, unix.SizeofRtAttr+4)
		*(*unix.RtAttr)(unsafe.Pointer(&b[0])) = unix.RtAttr{Len: uint16(len(b)), Type: typ}
		*(*uint32)(unsafe.Pointer(&b[unix.SizeofRtAttr])) = v
		return b
	}
	rtm := unix.RtMsg{
		Family:   unix.AF_INET,
		Dst_len:  0,
		Table:    unix.RT_TABLE_LOCAL,
		Protocol: unix.RTPROT_BOOT,
		Scope:    unix.RT_SCOPE_HOST,
		Type:     unix.RTN_LOCAL,
	}
	body := (*[unix.SizeofRtMsg]byte)(unsafe.Pointer(&rtm))[:]
	body = append(append(append([]byte(nil), body...), attr(unix.RTA_TABLE, unix.RT_TABLE_LOCAL)...), attr(unix.RTA_OIF, loopbackIfindex)...)
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	*(*unix.NlMsghdr)(unsafe.Pointer(&msg[0])) = unix.NlMsghdr{
		Len:   uint32(unix.SizeofNlMsghdr + len(body)),
		Type:  unix.RTM_NEWROUTE,
		Flags: unix.NLM_F_REQUEST | unix.NLM_F_ACK | unix.NLM_F_CREATE | unix.NLM_F_EXCL,
		Seq:   1,
	}
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	// The only reply is the acknowledgement: a header and an nlmsgerr whose error is 0 or -errno.
	if n < unix.SizeofNlMsghdr+4 || (*unix.NlMsghdr)(unsafe.Pointer(&buf[0])).Type != unix.NLMSG_ERROR {
		return errors.New("no acknowledgement from rtnetlink")
	}
	if errno := -*(*int32)(unsafe.Pointer(&buf[unix.SizeofNlMsghdr])); errno != 0 {
		return unix.Errno(errno)
	}
	return nil
}

// netnsRemove unmounts and removes a pinned namespace file; an absent one, or one no longer
// mounted (a delete that crashed between the two steps), is not an error.
func netnsRemove(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
