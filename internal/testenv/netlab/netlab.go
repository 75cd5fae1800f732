// Package netlab is the test "internet" of the network tests: a network namespace of its own
// joined to the host's by a veth pair (host end 10.203.N.1/24, lab end 10.203.N.2/24 and a few
// more addresses, one per lab "host"), with servers whose sockets live in the lab's namespace
// but are run by the test process itself: HTTP (/hello, /bytes?n=N, /echo-headers, /ws), HTTPS
// with the lab's own CA, a git smart-HTTP server (over HTTP and HTTPS: public fixture
// repositories — a target with a failing check and a coding agent with a good and a bad-build
// ref — and a private repository behind HTTP basic auth that records the credentials it saw),
// a PEP 503 package index, and a DNS server for the .lab names, including names that resolve to never-reachable addresses and a rebinding
// name. It needs root; everything it creates is removed (and checked) when the test ends.
package netlab

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Lab is one test internet. Its methods are safe for concurrent use.
type Lab struct {
	t         testing.TB
	n         int    // 10.203.n.0/24
	ns        string // ip netns name
	hostIf    string // veth end in the root netns
	labIf     string // veth end in the lab netns
	nsFile    *os.File
	dir       string
	caFile    string
	caPool    *x509.CertPool
	tlsConfig *tls.Config
	repoDir   string
	trap      []net.Listener
	port      int // the trap port: the lab serves HTTP on it too

	closers []func()

	mu       sync.Mutex
	queries  []Query
	rebinds  map[string]int
	recorded map[string][]http.Header
	trapHits atomic.Int64

	privDir     string // the private repositories' root
	gitToken    string
	gitAuth     []string
	gitAccepted atomic.Int64
	gitDenied   atomic.Int64
	gitDelay    atomic.Int64 // time.Duration before each git request
}

// Query is one question the lab's DNS server was asked.
type Query struct {
	Name string // lower case, without the final dot
	Type string // "A", "AAAA", "TXT", ...
	Net  string // "udp" or "tcp"
}

// Lab host names and which address of the lab they resolve to (the last octet; 0 = special).
var names = map[string]int{
	"good.lab": 2,
	"tls.lab":  3,
	"git.lab":  4,
	"pypi.lab": 5,
	"alt.lab":  6,
	// blocked.lab is a real lab host that no test policy allows.
	"blocked.lab": 2,
}

// RebindFirst is the octet rebind.lab resolves to on its first answer (127.0.0.1 afterwards).
const RebindFirst = 7

const (
	// PkgName and PkgVersion are the package the lab's index serves.
	PkgName    = "labpkg"
	PkgVersion = "0.1"
	// RepoPath is the git repository's path on the git server: http://git.lab/git/lab.git.
	RepoPath = "/git/lab.git"
	// RepoFile and RepoContent are the file of the repository's one commit.
	RepoFile    = "README"
	RepoContent = "netlab repository\n"
	// Hello is what /hello answers.
	Hello = "hello from netlab\n"
)

var seq atomic.Int64

// New builds a lab or fails the test; it is torn down (and checked) by t.Cleanup.
func New(t testing.TB) *Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("netlab needs root (network namespaces, veth pairs); CI runs as root")
	}
	for _, bin := range []string{"ip", "git"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is not installed: run `sudo make deps`", bin)
		}
	}
	l := &Lab{t: t, recorded: map[string][]http.Header{}, rebinds: map[string]int{}}
	t.Cleanup(l.close)
	l.dir = t.TempDir()
	if err := os.Chmod(l.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := l.claim(); err != nil {
		t.Fatal(err)
	}
	if err := l.setupNetns(); err != nil {
		t.Fatal(err)
	}
	if err := l.startServers(); err != nil {
		t.Fatal(err)
	}
	return l
}

// claim picks a subnet 10.203.n.0/24 no other lab (of any process) uses: the veth pair's
// name carries n, and the kernel refuses a second link of one name.
func (l *Lab) claim() error {
	start := int(uint32(os.Getpid())*7+uint32(seq.Add(1))*31) % 250
	for i := 0; i < 250; i++ {
		n := 1 + (start+i)%250
		host, lab := fmt.Sprintf("abnl%dh", n), fmt.Sprintf("abnl%dl", n)
		if out, err := exec.Command("ip", "link", "add", host, "type", "veth", "peer", "name", lab).CombinedOutput(); err != nil {
			if strings.Contains(string(out), "exists") {
				continue
			}
			return fmt.Errorf("ip link add %s: %v: %s", host, err, out)
		}
		l.n, l.hostIf, l.labIf = n, host, lab
		l.ns = fmt.Sprintf("abnl-%d-%d", os.Getpid(), n)
		return nil
	}
	return errors.New("no free 10.203.N.0/24 for a lab: 250 labs exist")
}

func run(args ...string) error {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (l *Lab) setupNetns() error {
	if err := run("ip", "netns", "add", l.ns); err != nil {
		return err
	}
	f, err := os.Open("/run/netns/" + l.ns)
	if err != nil {
		return err
	}
	l.nsFile = f
	cmds := [][]string{
		{"ip", "link", "set", l.labIf, "netns", l.ns},
		{"ip", "addr", "add", l.Addr(1).String() + "/24", "dev", l.hostIf},
		{"ip", "link", "set", l.hostIf, "up"},
		{"ip", "-n", l.ns, "link", "set", "lo", "up"},
		{"ip", "-n", l.ns, "addr", "add", l.Addr(2).String() + "/24", "dev", l.labIf},
	}
	for o := 3; o <= RebindFirst; o++ {
		cmds = append(cmds, []string{"ip", "-n", l.ns, "addr", "add", l.Addr(o).String() + "/32", "dev", l.labIf})
	}
	cmds = append(cmds, []string{"ip", "-n", l.ns, "link", "set", l.labIf, "up"},
		// Replies to the host only; no default route: the lab reaches nothing else.
		[]string{"ip", "-n", l.ns, "route", "add", "default", "via", l.Addr(1).String()})
	for _, c := range cmds {
		if err := run(c...); err != nil {
			return err
		}
	}
	return nil
}

// close stops the servers and removes the namespace and the veth pair, then checks that
// neither is left.
func (l *Lab) close() {
	for i := len(l.closers) - 1; i >= 0; i-- {
		l.closers[i]()
	}
	for _, ln := range l.trap {
		ln.Close()
	}
	if l.nsFile != nil {
		l.nsFile.Close()
	}
	if l.hostIf != "" {
		_ = run("ip", "link", "del", l.hostIf) // removes its peer too
	}
	if l.ns != "" {
		_ = run("ip", "netns", "del", l.ns)
		if _, err := os.Stat("/run/netns/" + l.ns); err == nil {
			l.t.Errorf("netlab: namespace %s left after cleanup", l.ns)
		}
	}
	if l.hostIf != "" {
		if _, err := net.InterfaceByName(l.hostIf); err == nil {
			l.t.Errorf("netlab: link %s left after cleanup", l.hostIf)
		}
	}
}

// N is the lab's subnet number: its addresses are 10.203.N.x.
func (l *Lab) N() int { return l.n }

// Addr is the lab's address 10.203.N.octet (1 is the host's end of the veth pair).
func (l *Lab) Addr(octet int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 203, byte(l.n), byte(octet)})
}

// CIDR is the lab's subnet, for --egress-allow-cidr.
func (l *Lab) CIDR() string { return fmt.Sprintf("10.203.%d.0/24", l.n) }

// HostAddr is the host's own address on the lab's link (never reachable from a sandbox).
func (l *Lab) HostAddr() netip.Addr { return l.Addr(1) }

// DNSAddr is the lab's DNS server (UDP and TCP), for --egress-dns.
func (l *Lab) DNSAddr() string { return netip.AddrPortFrom(l.Addr(2), 53).String() }

// CAFile is the PEM file of the lab's CA (for --egress-upstream-ca and for clients' --cacert).
func (l *Lab) CAFile() string { return l.caFile }

// CAPEM is the lab's CA certificate as PEM.
func (l *Lab) CAPEM() []byte {
	b, err := os.ReadFile(l.caFile)
	if err != nil {
		l.t.Fatal(err)
	}
	return b
}

// CAPool is a pool holding the lab's CA.
func (l *Lab) CAPool() *x509.CertPool { return l.caPool }

// HostOf is the lab address name resolves to (for the names with a fixed address).
func (l *Lab) HostOf(name string) netip.Addr {
	o, ok := names[name]
	if !ok {
		l.t.Fatalf("netlab: no host %q", name)
	}
	return l.Addr(o)
}

// TrapPort is a port that the lab serves HTTP on (at every lab address) and that the host
// listens on at 127.0.0.1 and at its own lab address (HostAddr): a connection that lands on
// the host instead of the lab counts in TrapHits.
func (l *Lab) TrapPort() int { return l.port }

// TrapHits counts connections to the host's trap listeners.
func (l *Lab) TrapHits() int64 { return l.trapHits.Load() }

// Queries returns the questions the lab's DNS server was asked so far.
func (l *Lab) Queries() []Query {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Query(nil), l.queries...)
}

// ResetRebind makes rebind.lab's next answer the first one again.
func (l *Lab) ResetRebind() {
	l.mu.Lock()
	l.rebinds = map[string]int{}
	l.mu.Unlock()
}

// Recorded returns the headers of the requests to /echo-headers?tag=tag, oldest first.
func (l *Lab) Recorded(tag string) []http.Header {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]http.Header(nil), l.recorded[tag]...)
}

// InNetns runs fn on an OS thread that is in the lab's network namespace (sockets fn creates
// stay there). The thread returns to the host's namespace before it is released; if it
// cannot, it is never reused (its goroutine exits locked, which ends the thread).
func (l *Lab) InNetns(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(l.nsFile.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns into the lab: %w", err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns back to the host: %w (thread discarded)", err)
			return // still locked: the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Listen opens a listener in the lab's namespace ("tcp", "0.0.0.0:80").
func (l *Lab) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := l.InNetns(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// ListenPacket opens a packet socket in the lab's namespace.
func (l *Lab) ListenPacket(network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := l.InNetns(func() error {
		var err error
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	return pc, err
}

func (l *Lab) startServers() error {
	if err := l.makeCA(); err != nil {
		return err
	}
	if err := l.makeRepo(); err != nil {
		return err
	}
	if err := l.makeFixtures(); err != nil {
		return err
	}
	wheel, err := makeWheel()
	if err != nil {
		return err
	}
	mux := l.mux(wheel)
	// The trap port: free on the host's loopback and lab address, served by the lab.
	for {
		lo, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		port := lo.Addr().(*net.TCPAddr).Port
		ha, err := net.Listen("tcp4", netip.AddrPortFrom(l.HostAddr(), uint16(port)).String())
		if err != nil {
			lo.Close()
			continue
		}
		l.trap, l.port = []net.Listener{lo, ha}, port
		break
	}
	for _, ln := range l.trap {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				l.trapHits.Add(1)
				c.Close()
			}
		}()
	}
	serve := func(addr string, tlsConf *tls.Config) error {
		ln, err := l.Listen("tcp4", addr)
		if err != nil {
			return err
		}
		if tlsConf != nil {
			ln = tls.NewListener(ln, tlsConf)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		l.closers = append(l.closers, func() { srv.Close() })
		return nil
	}
	if err := serve("0.0.0.0:80", nil); err != nil {
		return err
	}
	if err := serve(fmt.Sprintf("0.0.0.0:%d", l.port), nil); err != nil {
		return err
	}
	if err := serve("0.0.0.0:443", l.tlsConfig); err != nil {
		return err
	}
	return l.startDNS()
}

// mux serves every path of the lab on every lab address and port.
func (l *Lab) mux(wheel []byte) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Lab-Local-Addr", localAddr(r))
		fmt.Fprint(w, Hello)
	})
	mux.HandleFunc("/bytes", l.handleBytes)
	mux.HandleFunc("/echo-headers", l.handleEchoHeaders)
	mux.HandleFunc("/ws", handleWS)
	mux.Handle("/git/", l.delayed(l.gitHandler()))
	mux.Handle("/private/", l.delayed(l.privateHandler()))
	l.indexHandlers(mux, wheel)
	return mux
}

func localAddr(r *http.Request) string {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		return a.String()
	}
	return ""
}

// makeCA makes the lab's CA and a leaf for every lab name and address.
func (l *Lab) makeCA() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: fmt.Sprintf("netlab CA %d-%d", os.Getpid(), l.n)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "tls.lab"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		DNSNames:     []string{"*.lab"},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for n := range names {
		leafTmpl.DNSNames = append(leafTmpl.DNSNames, n)
	}
	for o := 2; o <= RebindFirst; o++ {
		leafTmpl.IPAddresses = append(leafTmpl.IPAddresses, l.Addr(o).AsSlice())
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	l.caFile = filepath.Join(l.dir, "netlab-ca.pem")
	if err := os.WriteFile(l.caFile, caPEM, 0o644); err != nil {
		return err
	}
	l.caPool = x509.NewCertPool()
	l.caPool.AddCert(caCert)
	l.tlsConfig = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER, caDER}, PrivateKey: leafKey}},
		MinVersion:   tls.VersionTLS12,
	}
	return nil
}

// Client is an HTTP client (for the host) that trusts the lab's CA, reaches lab names at
// their lab addresses and uses no proxy.
func (l *Lab) Client() *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			Proxy:           nil,
			TLSClientConfig: &tls.Config{RootCAs: l.caPool},
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				host, port, err := net.SplitHostPort(addr)
				if err != nil {
					return nil, err
				}
				if o, ok := names[host]; ok {
					addr = net.JoinHostPort(l.Addr(o).String(), port)
				}
				return d.DialContext(ctx, network, addr)
			},
		},
	}
}
