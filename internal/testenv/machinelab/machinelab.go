// Package machinelab gives the joined-machine tests machines that are network
// namespaces: a bridge of the test's own (10.204.N.1/24, where the server listens) and, per
// machine, a namespace joined to it by a veth pair with its own address 10.204.N.(10+i). No
// route leads anywhere else: nothing leaves the host. It needs root; everything it creates is
// removed (and checked) when the test ends.
package machinelab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Lab is one bridge and its machines.
type Lab struct {
	t      testing.TB
	n      int
	bridge string
	mu     sync.Mutex
	ms     []*Machine
}

// Machine is one namespace on the lab's bridge.
type Machine struct {
	lab    *Lab
	i      int
	NS     string     // the namespace's name (ip netns exec NS …)
	HostIf string     // the veth pair's host end (on the bridge)
	Addr   netip.Addr // the machine's address
}

var seq atomic.Uint32

func run(args ...string) error {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// New makes a lab or fails the test; t.Cleanup removes it.
func New(t testing.TB) *Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("machinelab needs root (network namespaces); CI runs as root")
	}
	l := &Lab{t: t}
	start := int(uint32(os.Getpid())*7+seq.Add(1)*31) % 250
	for i := 0; i < 250 && l.bridge == ""; i++ {
		n := 1 + (start+i)%250
		name := fmt.Sprintf("abm%d", n)
		out, err := exec.Command("ip", "link", "add", name, "type", "bridge").CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "exists") {
				continue
			}
			t.Fatalf("ip link add %s type bridge: %v: %s", name, err, out)
		}
		l.n, l.bridge = n, name
	}
	if l.bridge == "" {
		t.Fatal(errors.New("machinelab: no free 10.204.N.0/24: 250 labs exist"))
	}
	t.Cleanup(l.close)
	for _, c := range [][]string{
		{"ip", "addr", "add", l.ServerAddr().String() + "/24", "dev", l.bridge},
		{"ip", "link", "set", l.bridge, "up"},
	} {
		if err := run(c...); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// ServerAddr is the host's address on the bridge: a server listening there is what machines reach.
func (l *Lab) ServerAddr() netip.Addr { return netip.AddrFrom4([4]byte{10, 204, byte(l.n), 1}) }

// AddMachine adds a namespace on the bridge with its own address.
func (l *Lab) AddMachine() *Machine {
	l.t.Helper()
	l.mu.Lock()
	i := len(l.ms)
	m := &Machine{lab: l, i: i, NS: fmt.Sprintf("abm-%d-%d-%d", os.Getpid(), l.n, i),
		HostIf: fmt.Sprintf("abm%dh%d", l.n, i), Addr: netip.AddrFrom4([4]byte{10, 204, byte(l.n), byte(10 + i)})}
	l.ms = append(l.ms, m)
	l.mu.Unlock()
	if i >= 200 {
		l.t.Fatal("machinelab: at most 200 machines")
	}
	peer := fmt.Sprintf("abm%dm%d", l.n, i)
	for _, c := range [][]string{
		{"ip", "netns", "add", m.NS},
		{"ip", "link", "add", m.HostIf, "type", "veth", "peer", "name", peer},
		{"ip", "link", "set", peer, "netns", m.NS},
		{"ip", "link", "set", m.HostIf, "master", l.bridge},
		{"ip", "link", "set", m.HostIf, "up"},
		{"ip", "-n", m.NS, "link", "set", "lo", "up"},
		{"ip", "-n", m.NS, "addr", "add", m.Addr.String() + "/24", "dev", peer},
		{"ip", "-n", m.NS, "link", "set", peer, "up"},
	} {
		if err := run(c...); err != nil {
			l.t.Fatal(err)
		}
	}
	return m
}

// Command is argv run inside the machine's namespace.
func (m *Machine) Command(argv ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", m.NS}, argv...)...)
}

// LinkDown takes the machine's link down (the host end of its veth pair): its connection is cut.
func (m *Machine) LinkDown() error { return run("ip", "link", "set", m.HostIf, "down") }

// LinkUp brings the machine's link back.
func (m *Machine) LinkUp() error { return run("ip", "link", "set", m.HostIf, "up") }

func (l *Lab) close() {
	for _, m := range l.ms {
		_ = run("ip", "link", "del", m.HostIf) // its peer goes too
		_ = run("ip", "netns", "del", m.NS)
		if _, err := os.Stat("/run/netns/" + m.NS); err == nil {
			l.t.Errorf("machinelab: namespace %s left after cleanup", m.NS)
		}
		if _, err := net.InterfaceByName(m.HostIf); err == nil {
			l.t.Errorf("machinelab: link %s left after cleanup", m.HostIf)
		}
	}
	_ = run("ip", "link", "del", l.bridge)
	if _, err := net.InterfaceByName(l.bridge); err == nil {
		l.t.Errorf("machinelab: bridge %s left after cleanup", l.bridge)
	}
}
