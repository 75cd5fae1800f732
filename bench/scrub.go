package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/egress/mitm"
)

// The scrub figure: what taking secrets' values out of responses costs an intercepted host's
// throughput. An HTTPS server on loopback serves -scrub-mib MiB (random bytes, so no value is
// in them, as in a real download); curl (the sandbox's side) GETs it through the secret
// interceptor in turns: once with a secret listing the host (its placeholder swapped into
// the request, the body scanned for its value), once with no secret (the same TLS
// termination and relay, nothing to scan). The difference of the two is the figure (≤ 5%).

type scrubBenchFlags struct {
	only *bool
	gets *int
	mib  *int
}

func scrubFlags() scrubBenchFlags {
	return scrubBenchFlags{
		only: flag.Bool("scrub-only", false, "measure only what response scrubbing costs an intercepted GET (no sandboxes, no root; make bench-scrub writes bench/results-scrub.json)"),
		gets: flag.Int("scrub-gets", 11, "GETs through the interceptor with a secret, each beside one without (0 skips)"),
		mib:  flag.Int("scrub-mib", 100, "size of each GET, MiB"),
	}
}

// Names of the scrub figures.
const (
	measureScrubWith    = "intercepted GET, secret configured (scrubbed)"
	measureScrubWithout = "intercepted GET, no secret"
	measureScrubAdds    = "response scrubbing adds (time, paired)"
	measureScrubCPU     = "response scrubbing adds (CPU, paired)"
)

const (
	scrubHost  = "api.bench.example"
	scrubValue = "sk-bench-0123456789abcdefghijklmnopqrstuvwxyz"
	scrubPH    = "agentbox-secret-00112233445566778899aabbccddeeff"
)

func runScrubBench(ctx context.Context, f scrubBenchFlags, out string) {
	res := Results{CPUs: goruntime.NumCPU(), When: time.Now().UTC(), Skipped: map[string]string{}}
	res.Host, _ = os.Hostname()
	res.Stats = benchScrub(ctx, f)
	printStats(res.Stats)
	if out != "bench/results.json" {
		writeResults(res, out)
	}
}

// benchScrub times -scrub-gets pairs of GETs (with a secret, without) through the interceptor.
func benchScrub(ctx context.Context, f scrubBenchFlags) []Stat {
	if *f.gets <= 0 {
		return nil
	}
	dir, err := os.MkdirTemp("", "abbench-scrub")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ca, err := mitm.LoadOrCreateCA(filepath.Join(dir, "egress"))
	if err != nil {
		log.Fatal(err)
	}
	upCA, err := mitm.LoadOrCreateCA(filepath.Join(dir, "upstream"))
	if err != nil {
		log.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o600); err != nil {
		log.Fatal(err)
	}
	size := int64(*f.mib) << 20
	block := make([]byte, 1<<20)
	rand.Read(block)

	// upstream: size bytes with a Content-Length
	upLn, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{NextProtos: []string{"http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.Leaf(scrubHost) }})
	if err != nil {
		log.Fatal(err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" && r.Header.Get("Authorization") != "Bearer "+scrubValue {
			http.Error(w, "the placeholder was not swapped", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		for left := size; left > 0; left -= int64(len(block)) {
			if _, err := w.Write(block[:min(left, int64(len(block)))]); err != nil {
				return
			}
		}
	})}
	go up.Serve(upLn)
	defer up.Close()

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(upCA.CertPEM())
	icpt := mitm.New(mitm.Config{CA: ca, UpstreamRoots: roots,
		Sources: mitm.Sources{EnvAllow: []string{"BENCH_SCRUB"}, Getenv: func(k string) (string, bool) { return scrubValue, k == "BENCH_SCRUB" }}})
	with := &egress.Target{SandboxID: "sb-bench-scrub", Secrets: []egress.Secret{
		{Name: "API_KEY", Placeholder: scrubPH, From: "env:BENCH_SCRUB", Hosts: []string{scrubHost}}}}
	without := &egress.Target{SandboxID: "sb-bench-noscrub"}

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	serve := func(t *egress.Target) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		acceptEach(ln, &wg, func(c net.Conn) {
			icpt.Intercept(ctx, t, c, scrubHost, 443, true, func(ctx context.Context) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", upLn.Addr().String())
			})
		})
		go func() { <-ctx.Done(); ln.Close() }()
		return ln.Addr().String()
	}
	addrWith, addrWithout := serve(with), serve(without)

	// get returns the GET's throughput and the CPU this process (upstream and interceptor;
	// not curl) spent on it: on a shared, loaded machine the CPU is the steadier measure.
	get := func(addr string, auth bool) (float64, float64) {
		cpu0 := selfCPU()
		url := "https://" + scrubHost + "/bytes"
		args := append([]string{"--cacert", caFile, "--connect-to", scrubHost + ":443:" + addr}, curlGet(url)[1:]...)
		if auth {
			args = append([]string{"-H", "Authorization: Bearer " + scrubPH}, args...)
		}
		cmd := exec.CommandContext(ctx, "curl", args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		b, err := cmd.Output()
		if err != nil {
			log.Fatalf("scrub bench: curl: %v", err)
		}
		secs, err := parseCurl(string(b), size)
		if err != nil {
			log.Fatalf("scrub bench: %v", err)
		}
		return float64(*f.mib) / secs, selfCPU() - cpu0
	}
	get(addrWith, true) // warm: the leaf certificate, the page cache of curl
	get(addrWithout, false)
	var xs, ys, ratio, cpuWith, cpuWithout, cpuRatio []float64
	for i := 0; i < *f.gets; i++ {
		// alternate which goes first, so neither always follows the other
		var a, b, ca, cb float64
		if i%2 == 0 {
			a, ca = get(addrWith, true)
			b, cb = get(addrWithout, false)
		} else {
			b, cb = get(addrWithout, false)
			a, ca = get(addrWith, true)
		}
		xs, ys = append(xs, a), append(ys, b)
		ratio = append(ratio, (b/a-1)*100) // time with / time without - 1
		cpuWith, cpuWithout = append(cpuWith, ca*1000), append(cpuWithout, cb*1000)
		cpuRatio = append(cpuRatio, (ca/cb-1)*100)
	}
	sw := summarize(measureScrubWith, "MiB/s", xs)
	so := summarize(measureScrubWithout, "MiB/s", ys)
	add := summarize(measureScrubAdds, "%", ratio)
	add.Floor = fmt.Sprintf("median of %d paired (time with / time without − 1); p50s %.0f vs %.0f MiB/s; target ≤ 5%%", len(ratio), sw.P50, so.P50)
	sw.Floor = fmt.Sprintf("%d MiB, curl through the interceptor on loopback", *f.mib)
	so.Floor = sw.Floor
	cpu := summarize(measureScrubCPU, "%", cpuRatio)
	cw, co := summarize("", "ms", cpuWith), summarize("", "ms", cpuWithout)
	cpu.Floor = fmt.Sprintf("median of %d paired (CPU with / CPU without − 1) of the bench process (upstream + interceptor, not curl); p50 %.0f vs %.0f ms per GET; target ≤ 5%%",
		len(cpuRatio), cw.P50, co.P50)
	return []Stat{sw, so, add, cpu}
}

// selfCPU is the CPU time (user and system) this process has used, in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
