package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/egress/mitm"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
	"github.com/agentbox/agentbox/internal/wire"
)

// netFlags are the network figures' flags.
type netFlags struct {
	only      *bool
	gets      *int
	getMiB    *int
	conns     *int
	sandboxes *int
	perSB     *int
	creates   *int
	labServe  *string
}

func networkFlags() netFlags {
	return netFlags{
		only:      flag.Bool("network-only", false, "measure only the network figures (writes -out only if it is not the default bench/results.json)"),
		gets:      flag.Int("net-gets", 21, "HTTP GETs of -net-get-mib from the lab host through the egress proxy, each beside one from the host with no proxy (0 skips the network figures)"),
		getMiB:    flag.Int("net-get-mib", 100, "size of each timed GET, MiB"),
		conns:     flag.Int("net-conns", 200, "sequential connections (connect + GET /hello) timed per path for the per-connection overhead"),
		sandboxes: flag.Int("net-sandboxes", 50, "egress sandboxes holding connections open at once"),
		perSB:     flag.Int("net-conns-per-sandbox", 20, "connections each of -net-sandboxes holds open at once"),
		creates:   flag.Int("net-creates", 20, "create → first exec with a network policy, each beside one without"),
		labServe:  flag.String("lab-serve", "", "internal: serve the lab's HTTP server on ADDR (the bench runs itself so inside the lab's network namespace)"),
	}
}

// NetConcurrency is the detail of the concurrent-connections figure in bench/results.json.
type NetConcurrency struct {
	Sandboxes             int `json:"sandboxes"`
	ConnectionsPerSandbox int `json:"connections_per_sandbox"`
	BytesPerConnection    int `json:"bytes_per_connection"`
	// LabPeak is the most connections the lab host had open at once (its barrier holds every
	// response until all are open, so a complete run shows all of them).
	LabPeak       int      `json:"lab_peak_open"`
	LabReleasedBy string   `json:"lab_released_by"`
	Completed     int      `json:"completed"`
	Errors        int      `json:"errors"`
	ErrorSamples  []string `json:"error_samples,omitempty"`
	Seconds       float64  `json:"seconds"`
	// The server process is the bench (it serves in-process): RSS and Go heap in use, and
	// goroutines, before the sandboxes connect, at the peak, and 5 s after the last closed
	// (the 50 sandboxes still running, their sessions idle); and the heap and goroutines once
	// the sandboxes are destroyed (the Go runtime keeps the RSS it grew).
	RSSBeforeMiB        float64 `json:"server_rss_before_mib"`
	RSSPeakMiB          float64 `json:"server_rss_peak_mib"`
	RSSAfterMiB         float64 `json:"server_rss_after_mib"`
	HeapBeforeMiB       float64 `json:"server_heap_before_mib"`
	HeapPeakMiB         float64 `json:"server_heap_peak_mib"`
	HeapAfterMiB        float64 `json:"server_heap_after_mib"`
	GoroutinesPeak      int     `json:"server_goroutines_peak"`
	GoroutinesPre       int     `json:"server_goroutines_before"`
	GoroutinesPost      int     `json:"server_goroutines_after"`
	HeapDestroyedMiB    float64 `json:"server_heap_after_destroy_mib"`
	GoroutinesDestroyed int     `json:"server_goroutines_after_destroy"`
}

// egressConfig is the bench service's egress as cmd/agentbox/egress.go makes it: a per-server CA
// in dir, the sandboxes' CA bundle (the host's roots and that CA), the egress proxy with the
// secret interceptor, the service as recorder, and the lab's range opened (what
// --egress-allow-cidr 10.205.0.0/24 does). The bench allows no secret sources.
func egressConfig(dir string) (sandbox.EgressConfig, error) {
	ca, err := mitm.LoadOrCreateCA(filepath.Join(dir, "egress"))
	if err != nil {
		return sandbox.EgressConfig{}, fmt.Errorf("egress CA: %w", err)
	}
	bundle, err := mitm.CABundle(ca, "")
	if err != nil {
		return sandbox.EgressConfig{}, err
	}
	src := mitm.Sources{}
	return sandbox.EgressConfig{
		CABundle:          bundle,
		CheckSecretSource: src.Check,
		NewProxy: func(rec egress.Recorder) (sandbox.EgressProxy, error) {
			return egress.New(egress.Config{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix(labRange)}, Recorder: rec,
				Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
				Interceptor: mitm.New(mitm.Config{CA: ca, Sources: src, Recorder: rec})})
		},
	}, nil
}

// networkPolicy is the policy of the bench's egress sandboxes: the lab's range, by CIDR (the
// lab is reached by its address; a name would need a resolver that knows it).
func networkPolicy() *wire.Network {
	return &wire.Network{Policy: &wire.Policy{Allow: []string{labRange}}}
}

// egressUnavailable says why the network figures cannot run on runc, or "".
func egressUnavailable(c runtime.Capabilities) string {
	if !slices.Contains(c.NetworkModes, runtime.NetworkEgress) {
		return fmt.Sprintf("runc offers no %q network mode (network modes: %s)", runtime.NetworkEgress, strings.Join(c.NetworkModes, ", "))
	}
	return ""
}

// benchNetwork measures the network figures on runc, each beside its floor in
// the same run: a large GET through the egress proxy against the same GET from the host with
// no proxy; the per-connection cost of the proxy (and of the transparent path where runc has
// it) against direct connections from the host; -net-sandboxes × -net-conns-per-sandbox
// connections open at once, with the server's memory; create → first exec with a network
// policy against without. It returns skip != "" (and no figures) when the egress mode is not
// available; any other failure is an error. Every sandbox it creates is destroyed and the
// lab removed before it returns.
func benchNetwork(ctx context.Context, c *client.Client, caps runtime.Capabilities, f netFlags) (stats []Stat, conc *NetConcurrency, skip string, err error) {
	if *f.gets <= 0 {
		return nil, nil, "-net-gets 0", nil
	}
	if why := egressUnavailable(caps); why != "" {
		return nil, nil, why, nil
	}
	l, err := startLab(ctx)
	if err != nil {
		return nil, nil, "", err
	}
	defer l.Close()
	var ids []string
	defer func() {
		for _, id := range ids {
			c.Destroy(context.WithoutCancel(ctx), id)
		}
	}()
	sb, err := c.Create(ctx, wire.CreateRequest{Runtime: "runc", Network: networkPolicy(), TTLSeconds: 3600})
	if err != nil {
		if errcode.Is(err, errcode.UnsupportedOp) {
			return nil, nil, fmt.Sprintf("create with a network policy: %v", err), nil
		}
		return nil, nil, "", fmt.Errorf("create with a network policy: %w", err)
	}
	ids = append(ids, sb.ID)

	s, err := benchGet(ctx, c, sb.ID, *f.gets, *f.getMiB)
	if err != nil {
		return nil, nil, "", err
	}
	stats = append(stats, s...)
	transparent := slices.Contains(caps.Hardening, runtime.HardeningTransparentEgress)
	if s, err = benchConnOverhead(ctx, c, sb.ID, *f.conns, transparent); err != nil {
		return stats, nil, "", err
	}
	stats = append(stats, s...)
	if conc, err = benchConcurrent(ctx, c, l, *f.sandboxes, *f.perSB); err != nil {
		return stats, conc, "", err
	}
	s, err = benchNetCreate(ctx, c, *f.creates)
	return append(stats, s...), conc, "", err
}

// hostBusy is the host's busy CPU time so far, all cores together, in seconds (/proc/stat:
// user, nice, system, irq and softirq; USER_HZ is 100 on Linux). 0 when it cannot be read.
func hostBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for _, i := range []int{1, 2, 3, 6, 7} {
		x, _ := strconv.ParseFloat(f[i], 64)
		busy += x
	}
	return busy / 100
}

// curlGet is the timed GET: curl's own clock (time_total), so neither exec nor process start
// is counted; the body is discarded; status and size are checked.
func curlGet(url string) []string {
	return []string{"curl", "-sS", "--max-time", "300", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{time_total}", url}
}

// parseCurl reads curlGet's output and returns the transfer's seconds.
func parseCurl(out string, size int64) (float64, error) {
	f := strings.Fields(out)
	if len(f) != 3 {
		return 0, fmt.Errorf("curl printed %q", out)
	}
	n, _ := strconv.ParseInt(f[1], 10, 64)
	secs, err := strconv.ParseFloat(f[2], 64)
	if f[0] != "200" || n != size || err != nil || secs <= 0 {
		return 0, fmt.Errorf("curl: status %s, %s of %d bytes, %s s", f[0], f[1], size, f[2])
	}
	return secs, nil
}

// hostProxy serves an egress proxy of its own (the lab's range allowed) on a loopback port of
// the host, for the GET through the proxy alone: no sandbox, no agent, no handed-over socket.
// It returns the proxy's URL and a stop func.
func hostProxy(ctx context.Context) (string, func(), error) {
	p, err := egress.New(egress.Config{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix(labRange)},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return "", nil, err
	}
	pol, err := egress.ParsePolicy(egress.Policy(*networkPolicy().Policy))
	if err != nil {
		return "", nil, err
	}
	tg := &egress.Target{SandboxID: "sb-bench-host", Policy: func() *egress.Compiled { return pol }}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	acceptEach(ln, &wg, func(c net.Conn) { p.Serve(ctx, tg, c, egress.KindProxy, netip.AddrPort{}) })
	return "http://" + ln.Addr().String(), func() { ln.Close(); cancel(); wg.Wait() }, nil
}

// benchGet times n GETs of mib MiB from the lab: from the sandbox through its HTTP_PROXY, and,
// alternating, from the host with no proxy (the floor) and from the host through an egress
// proxy of the bench's own (the proxy's share of the cost, without the sandbox's).
func benchGet(ctx context.Context, c *client.Client, id string, n, mib int) ([]Stat, error) {
	size := int64(mib) << 20
	url := fmt.Sprintf("http://%s/bytes?n=%d", labIP, size)
	proxyURL, stopProxy, err := hostProxy(ctx)
	if err != nil {
		return nil, fmt.Errorf("the host's own egress proxy: %w", err)
	}
	defer stopProxy()
	// The sandbox's network namespace (runc's root is under the bench's temp dir): a host
	// process there reaches the sandbox's proxy as curl inside does, without the sandbox's
	// cgroups, seccomp and user namespace.
	nsPath := ""
	sbProxy := ""
	if m, _ := filepath.Glob(filepath.Join(os.TempDir(), "abbench*", "runc", "netns", id)); len(m) == 1 {
		r, err := c.Exec(ctx, id, wire.ExecRequest{Command: []string{"sh", "-c", `printf %s "$http_proxy"`}}, nil)
		if err == nil && r.ExitCode == 0 && strings.HasPrefix(r.Stdout, "http://127.0.0.1:") {
			nsPath, sbProxy = m[0], r.Stdout
		}
	}
	// The relay peers (relay.go): the bare one always, the kernel one where BPF sockmaps load.
	bareAddr, stopBare, err := startRelay(ctx, labIP+":80", nil)
	if err != nil {
		return nil, fmt.Errorf("the bare relay: %w", err)
	}
	defer stopBare()
	kernelAddr, kernelSkip := "", ""
	if k, err := newKernelRelay(); err != nil {
		kernelSkip = err.Error()
	} else {
		defer k.close()
		addr, stop, err := startRelay(ctx, labIP+":80", k)
		if err != nil {
			return nil, fmt.Errorf("the kernel relay: %w", err)
		}
		defer stop()
		kernelAddr = addr
	}
	relayGet := func(addr string) (float64, error) {
		cmd := exec.CommandContext(ctx, curlGet(url)[0], append([]string{"--noproxy", "*", "--connect-to", "::" + addr}, curlGet(url)[1:]...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.Output()
		if err != nil {
			return 0, err
		}
		secs, err := parseCurl(string(out), size)
		return float64(mib) / secs, err
	}
	var viaHost, inNetns, viaBare, viaKernel []float64
	// The proxy must be the sandbox's own (from its environment), not given here.
	script := `[ -n "$http_proxy" ] && [ -n "$HTTP_PROXY" ] || { echo "no http_proxy in the sandbox's environment" >&2; exit 97; }; exec "$@"`
	var proxied, direct []float64
	// Host CPU (all cores, every process: lab server, proxy, curl) spent per path, and the
	// floor's wall time: whether the floor itself is bound by this host's cores.
	var cpu [6]float64
	var floorSecs float64
	for i := 0; i < n; i++ {
		b0 := hostBusy()
		r, err := c.Exec(ctx, id, wire.ExecRequest{Command: append([]string{"sh", "-c", script, "sh"}, curlGet(url)...), TimeoutSeconds: 310}, nil)
		if err != nil {
			return nil, fmt.Errorf("GET through the proxy: %w", err)
		}
		secs, err := parseCurl(r.Stdout, size)
		if err != nil || r.ExitCode != 0 {
			return nil, fmt.Errorf("GET through the proxy: exit %d: %v (stderr %q)", r.ExitCode, err, r.Stderr)
		}
		proxied = append(proxied, float64(mib)/secs)
		b1 := hostBusy()
		cpu[0] += b1 - b0
		cmd := exec.CommandContext(ctx, curlGet(url)[0], append([]string{"--noproxy", "*"}, curlGet(url)[1:]...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("GET from the host: %w", err)
		}
		if secs, err = parseCurl(string(out), size); err != nil {
			return nil, fmt.Errorf("GET from the host: %w", err)
		}
		direct = append(direct, float64(mib)/secs)
		floorSecs += secs
		b2 := hostBusy()
		cpu[1] += b2 - b1
		cmd = exec.CommandContext(ctx, curlGet(url)[0], append([]string{"--proxy", proxyURL}, curlGet(url)[1:]...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		if out, err = cmd.Output(); err != nil {
			return nil, fmt.Errorf("GET from the host through the host's egress proxy: %w", err)
		}
		if secs, err = parseCurl(string(out), size); err != nil {
			return nil, fmt.Errorf("GET from the host through the host's egress proxy: %w", err)
		}
		viaHost = append(viaHost, float64(mib)/secs)
		b3 := hostBusy()
		cpu[2] += b3 - b2
		rate, err := relayGet(bareAddr)
		if err != nil {
			return nil, fmt.Errorf("GET from the host through the bare relay: %w", err)
		}
		viaBare = append(viaBare, rate)
		b4 := hostBusy()
		cpu[4] += b4 - b3
		if kernelAddr != "" {
			if rate, err = relayGet(kernelAddr); err != nil {
				return nil, fmt.Errorf("GET from the host through the kernel relay: %w", err)
			}
			viaKernel = append(viaKernel, rate)
			cpu[5] += hostBusy() - b4
		}
		b3 = hostBusy()
		if nsPath == "" {
			continue
		}
		cmd = exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + nsPath, curlGet(url)[0], "--proxy", sbProxy}, curlGet(url)[1:]...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		if out, err = cmd.Output(); err != nil {
			return nil, fmt.Errorf("GET from the sandbox's network namespace: %w", err)
		}
		if secs, err = parseCurl(string(out), size); err != nil {
			return nil, fmt.Errorf("GET from the sandbox's network namespace: %w", err)
		}
		inNetns = append(inNetns, float64(mib)/secs)
		cpu[3] += hostBusy() - b3
	}
	gib := float64(n*mib) / 1024
	perGiB := func(i int) string { return fmt.Sprintf("host CPU %.2f core-s/GiB", cpu[i]/gib) }
	floor := summarizeRate("floor: the same GET from the host, no proxy", "MiB/s", direct)
	floor.Floor = fmt.Sprintf("%s; %.2f of the host's %d cores busy while it runs; %.0f–%.0f MiB/s", perGiB(1), cpu[1]/max(floorSecs, 1e-9), goruntime.NumCPU(), slices.Min(direct), slices.Max(direct))
	s := summarizeRate(fmt.Sprintf("HTTP GET %d MiB through the egress proxy", mib), "MiB/s", proxied)
	s.Floor = fmt.Sprintf("no proxy p50 %.0f MiB/s; %.0f%% of it; target ≥ 80%%; %.0f–%.0f MiB/s; %s (no proxy: %s; this one counts the exec too)", floor.P50, 100*s.P50/floor.P50, slices.Min(proxied), slices.Max(proxied), perGiB(0), perGiB(1))
	h := summarizeRate("hop: the same GET from the host through an egress proxy alone (no sandbox)", "MiB/s", viaHost)
	h.Floor = fmt.Sprintf("no proxy p50 %.0f MiB/s; %.0f%% of it (the sandbox's path: %.0f%%); %s", floor.P50, 100*h.P50/floor.P50, 100*s.P50/floor.P50, perGiB(2))
	s.Runtime, floor.Runtime, h.Runtime = "runc", "runc", "runc"
	stats := []Stat{s, h}
	bare := summarizeRate("peer: the same GET from the host through a bare TCP relay (io.Copy both ways: splice; no HTTP, no policy)", "MiB/s", viaBare)
	bare.Floor = fmt.Sprintf("no proxy p50 %.0f MiB/s; %.0f%% of it (the proxy alone: %.0f%% of this relay); %s", floor.P50, 100*bare.P50/floor.P50, 100*h.P50/bare.P50, perGiB(4))
	bare.Runtime = "runc"
	stats = append(stats, bare)
	if len(viaKernel) > 0 {
		kr := summarizeRate("peer: the same through an in-kernel relay (BPF sockmap redirects the lab's bytes to the client's socket; no user-space copy or wake-up)", "MiB/s", viaKernel)
		kr.Floor = fmt.Sprintf("no proxy p50 %.0f MiB/s; %.0f%% of it: a second TCP connection's own cost; %s", floor.P50, 100*kr.P50/floor.P50, perGiB(5))
		kr.Runtime = "runc"
		stats = append(stats, kr)
	} else {
		fmt.Printf("kernel relay peer skipped: %s\n", kernelSkip)
	}
	if len(inNetns) > 0 {
		ns := summarizeRate("hop: the same GET from a host process in the sandbox's network namespace, through its proxy", "MiB/s", inNetns)
		ns.Floor = fmt.Sprintf("no proxy p50 %.0f MiB/s; %.0f%% of it (curl in the sandbox: %.0f%%): the sandbox's listener and loopback without its cgroups, seccomp, user namespace; %s",
			floor.P50, 100*ns.P50/floor.P50, 100*s.P50/floor.P50, perGiB(3))
		ns.Runtime = "runc"
		stats = append(stats, ns)
	}
	return append(stats, floor), nil
}

// summarizeRate summarizes a rate: P50 is the median and P99 the slow tail (the rate 99% of
// the runs reached or beat), so that p99 is the bad end as for times.
func summarizeRate(name, unit string, xs []float64) Stat {
	s := summarize(name, unit, xs)
	v := append([]float64(nil), xs...)
	sort.Float64s(v)
	i := int(0.01*float64(len(v))+0.5) - 1
	s.P99 = v[max(0, min(len(v)-1, i))]
	return s
}

// connLoop is the per-connection loop, run in the sandbox and on the host alike: n times,
// connect, one GET /hello with Connection: close, read the whole response (status and body
// checked), close; each iteration timed with perf_counter; prints the milliseconds as JSON.
// Modes: direct (to HOST:80), transparent (the same, from a sandbox: it lands on the agent),
// proxy (absolute-form GET to the environment's http_proxy), connect (CONNECT HOST:80 to
// http_proxy, then the GET in the tunnel).
const connLoop = `
import json, os, socket, sys, time
from urllib.parse import urlsplit
mode, host, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def read_response(s, buf=b""):
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise SystemExit("connection closed before the headers: %r" % buf[:200])
        buf += d
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    if b" 200 " not in lines[0] + b" ":
        raise SystemExit("status: %r" % head[:300])
    cl = [int(l.split(b":", 1)[1]) for l in lines[1:] if l.lower().startswith(b"content-length:")]
    want = cl[0] if cl else None
    while want is None or len(body) < want:
        d = s.recv(65536)
        if not d:
            break
        body += d
    return body
proxy = None
if mode in ("proxy", "connect"):
    p = os.environ.get("http_proxy") or os.environ.get("HTTP_PROXY")
    if not p:
        raise SystemExit("no http_proxy in the environment")
    u = urlsplit(p)
    proxy = (u.hostname, u.port or 80)
get = ("GET /hello HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host).encode()
out = []
for i in range(n):
    t0 = time.perf_counter()
    if mode in ("direct", "transparent"):
        s = socket.create_connection((host, 80), timeout=10)
        s.sendall(get)
    elif mode == "proxy":
        s = socket.create_connection(proxy, timeout=10)
        s.sendall(("GET http://%s/hello HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (host, host)).encode())
    else:
        s = socket.create_connection(proxy, timeout=10)
        s.sendall(("CONNECT %s:80 HTTP/1.1\r\nHost: %s:80\r\n\r\n" % (host, host)).encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = s.recv(4096)
            if not d:
                raise SystemExit("CONNECT: closed: %r" % buf[:200])
            buf += d
        if b" 200" not in buf.split(b"\r\n", 1)[0]:
            raise SystemExit("CONNECT: %r" % buf[:300])
        s.sendall(get)
    body = read_response(s)
    s.close()
    if body != b"hello\n":
        raise SystemExit("body %r" % body[:100])
    out.append((time.perf_counter() - t0) * 1000)
print(json.dumps(out))
`

func parseLoop(out string, n int) ([]float64, error) {
	var xs []float64
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &xs); err != nil || len(xs) != n {
		return nil, fmt.Errorf("loop printed %q (%v)", text.Truncate(out, 200), err)
	}
	return xs, nil
}

// benchConnOverhead times n sequential connections on each path, in rounds that alternate the
// paths so that the host's noise falls on all alike: in the sandbox through the HTTP proxy
// (absolute-form GET, and CONNECT then GET), through the transparent path when the runtime
// has it, and the floor: the same loop on the host straight to the lab.
func benchConnOverhead(ctx context.Context, c *client.Client, id string, n int, transparent bool) ([]Stat, error) {
	const rounds = 5
	per := max(1, n/rounds)
	modes := []string{"direct", "proxy", "connect"}
	if transparent {
		modes = append(modes, "transparent")
	}
	xs := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		for _, m := range modes {
			var out string
			if m == "direct" {
				cmd := exec.CommandContext(ctx, "python3", "-c", connLoop, m, labIP, strconv.Itoa(per))
				cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/root"}
				b, err := cmd.Output()
				if err != nil {
					var ee *exec.ExitError
					if errors.As(err, &ee) {
						err = fmt.Errorf("%w: %s", err, ee.Stderr)
					}
					return nil, fmt.Errorf("connection loop on the host: %v", err)
				}
				out = string(b)
			} else {
				res, err := c.Exec(ctx, id, wire.ExecRequest{Command: []string{"python3", "-c", connLoop, m, labIP, strconv.Itoa(per)}, TimeoutSeconds: 120}, nil)
				if err != nil || res.ExitCode != 0 {
					return nil, fmt.Errorf("connection loop (%s) in the sandbox: %v exit %d: %s", m, err, res.ExitCode, text.Truncate(res.Stderr, 500))
				}
				out = res.Stdout
			}
			v, err := parseLoop(out, per)
			if err != nil {
				return nil, fmt.Errorf("connection loop (%s): %w", m, err)
			}
			xs[m] = append(xs[m], v...)
		}
	}
	floor := summarize("floor: conn + GET /hello from host, direct", "ms", xs["direct"])
	floor.Runtime = "runc"
	names := map[string]string{
		"proxy":       "conn + GET /hello via proxy (absolute-form)",
		"connect":     "conn + CONNECT + GET /hello via proxy",
		"transparent": "conn + GET /hello, transparent path",
	}
	var stats []Stat
	for _, m := range modes[1:] {
		s := summarize(names[m], "ms", xs[m])
		s.Runtime = "runc"
		s.Floor = fmt.Sprintf("direct p50 %.2f ms; overhead p50 +%.2f ms; target ≤ 1 ms", floor.P50, s.P50-floor.P50)
		stats = append(stats, s)
	}
	return append(stats, floor), nil
}

// holdLoop opens n connections at once through the environment's http_proxy, each an
// absolute-form GET of /bytes?n=SIZE&ms=MS&wait=1 (the lab holds every response until all
// the bench's connections are open, then sends SIZE bytes over MS ms), reads each whole and
// prints {"ok": count, "errors": [...]}.
const holdLoop = `
import json, os, socket, sys, threading
from urllib.parse import urlsplit
host, n, size, ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
u = urlsplit(os.environ.get("http_proxy") or os.environ["HTTP_PROXY"])
ok, errors, lock = [0], [], threading.Lock()
def run():
    try:
        s = socket.create_connection((u.hostname, u.port or 80), timeout=120)
        s.sendall(("GET http://%s/bytes?n=%d&ms=%d&wait=1 HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (host, size, ms, host)).encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                raise Exception("closed before the headers: %r" % buf[:200])
            buf += d
        head, body = buf.split(b"\r\n\r\n", 1)
        if b" 200 " not in head.split(b"\r\n")[0] + b" ":
            raise Exception("status %r" % head[:200])
        got = len(body)
        while got < size:
            d = s.recv(65536)
            if not d:
                break
            got += len(d)
        s.close()
        if got != size:
            raise Exception("%d of %d bytes" % (got, size))
        with lock:
            ok[0] += 1
    except Exception as e:
        with lock:
            errors.append(repr(e)[:200])
ts = [threading.Thread(target=run) for _ in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(json.dumps({"ok": ok[0], "errors": errors[:5], "nerrors": len(errors)}))
`

// procRSS is this process's resident set, MiB.
func procRSS() float64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func heapMiB() float64 {
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return float64(m.HeapInuse) / (1 << 20)
}

// benchConcurrent creates sandboxes egress sandboxes and has each open per connections at once
// through its proxy to the lab (1 MiB each, sent over 2 s once all are open), counting errors
// and sampling the server's (this process's) memory before, during and after.
func benchConcurrent(ctx context.Context, c *client.Client, l *lab, sandboxes, per int) (*NetConcurrency, error) {
	const size, paceMS = 1 << 20, 2000
	nc := &NetConcurrency{Sandboxes: sandboxes, ConnectionsPerSandbox: per, BytesPerConnection: size}
	ids := make([]string, sandboxes)
	destroy := func() {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 6)
		for _, id := range ids {
			if id == "" {
				continue
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				c.Destroy(context.WithoutCancel(ctx), id)
			}()
		}
		wg.Wait()
		clear(ids)
	}
	defer destroy()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var createErr error
	sem := make(chan struct{}, 6)
	for i := range ids {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			sb, err := c.Create(ctx, wire.CreateRequest{Runtime: "runc", Network: networkPolicy(), CPU: 0.5, MemoryMB: 128, TTLSeconds: 3600})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				createErr = err
				return
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	if createErr != nil {
		return nil, fmt.Errorf("concurrent connections: create: %w", createErr)
	}
	hc := labClient()
	if err := labGet(hc, l.URL()+fmt.Sprintf("/arm?count=%d", sandboxes*per), nil); err != nil {
		return nil, err
	}
	goruntime.GC()
	nc.RSSBeforeMiB, nc.HeapBeforeMiB, nc.GoroutinesPre = procRSS(), heapMiB(), goruntime.NumGoroutine()
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			nc.RSSPeakMiB = max(nc.RSSPeakMiB, procRSS())
			nc.HeapPeakMiB = max(nc.HeapPeakMiB, heapMiB())
			nc.GoroutinesPeak = max(nc.GoroutinesPeak, goruntime.NumGoroutine())
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	t0 := time.Now()
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Exec(ctx, id, wire.ExecRequest{Command: []string{"python3", "-c", holdLoop, labIP, strconv.Itoa(per), strconv.Itoa(size), strconv.Itoa(paceMS)}, TimeoutSeconds: 180}, nil)
			var r struct {
				OK      int      `json:"ok"`
				Errors  []string `json:"errors"`
				NErrors int      `json:"nerrors"`
			}
			if err == nil && res.ExitCode == 0 {
				err = json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &r)
			} else if err == nil {
				err = fmt.Errorf("exit %d: %s", res.ExitCode, text.Truncate(res.Stderr, 300))
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				nc.Errors += per
				nc.ErrorSamples = append(nc.ErrorSamples, fmt.Sprintf("%s: %v", id, err))
				return
			}
			nc.Completed += r.OK
			nc.Errors += r.NErrors
			for _, e := range r.Errors {
				if len(nc.ErrorSamples) < 10 {
					nc.ErrorSamples = append(nc.ErrorSamples, id+": "+e)
				}
			}
		}()
	}
	wg.Wait()
	nc.Seconds = time.Since(t0).Seconds()
	var st labStats
	if err := labGet(hc, l.URL()+"/stats", &st); err != nil {
		return nil, err
	}
	nc.LabPeak, nc.LabReleasedBy = st.Peak, st.ReleasedBy
	time.Sleep(5 * time.Second)
	close(stop)
	<-sampled
	goruntime.GC()
	nc.RSSAfterMiB, nc.HeapAfterMiB, nc.GoroutinesPost = procRSS(), heapMiB(), goruntime.NumGoroutine()
	destroy()
	time.Sleep(time.Second)
	goruntime.GC()
	nc.HeapDestroyedMiB, nc.GoroutinesDestroyed = heapMiB(), goruntime.NumGoroutine()
	return nc, nil
}

// labGet GETs a lab URL from the host and decodes its JSON reply into into (when not nil).
func labGet(hc *http.Client, url string, into any) error {
	resp, err := hc.Get(url)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("lab: GET %s: %s %q %v", url, resp.Status, text.Truncate(string(b), 200), err)
	}
	if into != nil {
		return json.Unmarshal(b, into)
	}
	return nil
}

// benchNetCreate times n creates → first exec (`true`) with a network policy and, alternating,
// n without (runc), each measured as every create figure is (coldCreate).
func benchNetCreate(ctx context.Context, c *client.Client, n int) ([]Stat, error) {
	var with, without []float64
	for i := 0; i < n; i++ {
		for _, netw := range []*wire.Network{networkPolicy(), nil} {
			_, d, _, err := coldCreate(ctx, c, wire.CreateRequest{Runtime: "runc", Network: netw})
			if err != nil {
				return nil, fmt.Errorf("network %v: %w", netw != nil, err)
			}
			if netw != nil {
				with = append(with, d)
			} else {
				without = append(without, d)
			}
		}
	}
	floor := summarize("floor: create → first exec, no network", "ms", without)
	s := summarize("create → first exec, with a network policy", "ms", with)
	s.Floor = fmt.Sprintf("without p50 %.1f ms; %+.1f ms (median of the %d paired differences %+.1f ms); target ≤ +5 ms",
		floor.P50, s.P50-floor.P50, len(with), pairedMedian(with, without))
	s.Runtime, floor.Runtime = "runc", "runc"
	return []Stat{s, floor}, nil
}

// pairedMedian is the median of a[i]-b[i]: each pair was measured back to back, so the load of
// a shared machine falls on both alike and this is steadier than the difference of medians.
func pairedMedian(a, b []float64) float64 {
	d := make([]float64, 0, len(a))
	for i := range min(len(a), len(b)) {
		d = append(d, a[i]-b[i])
	}
	if len(d) == 0 {
		return 0
	}
	sort.Float64s(d)
	if len(d)%2 == 0 {
		return (d[len(d)/2-1] + d[len(d)/2]) / 2
	}
	return d[len(d)/2]
}

// runNetwork runs benchNetwork on runc and puts its figures, or why it skipped, in res. A
// failure is fatal, after benchNetwork has removed the lab and its sandboxes.
func runNetwork(ctx context.Context, c *client.Client, res *Results, f netFlags) {
	var caps runtime.Capabilities
	for _, rc := range res.Runtimes {
		if rc.Name == "runc" {
			caps = rc
		}
	}
	stats, conc, skip, err := benchNetwork(ctx, c, caps, f)
	res.Stats, res.Network = append(res.Stats, stats...), conc
	if conc != nil {
		s := Stat{Name: fmt.Sprintf("%d conns open at once, %d egress sandboxes", conc.Sandboxes*conc.ConnectionsPerSandbox, conc.Sandboxes),
			Runtime: "runc", Unit: "errors", N: conc.Completed + conc.Errors, P50: float64(conc.Errors), P99: float64(conc.Errors), Mean: float64(conc.Errors)}
		s.Floor = fmt.Sprintf("lab peak %d open; server RSS %.0f → %.0f → %.0f MiB (heap %.0f → %.0f → %.0f, %.0f destroyed); target 0 errors, bounded memory",
			conc.LabPeak, conc.RSSBeforeMiB, conc.RSSPeakMiB, conc.RSSAfterMiB, conc.HeapBeforeMiB, conc.HeapPeakMiB, conc.HeapAfterMiB, conc.HeapDestroyedMiB)
		res.Stats = append(res.Stats, s)
	}
	if err != nil {
		printStats(res.Stats)
		log.Fatalf("network bench: %v", err)
	}
	if skip != "" {
		res.Skipped["network"] = skip
		fmt.Printf("network figures skipped: %s\n", skip)
	}
}
