// Command bench measures agentbox on this host: create → first exec and the exec round trip on
// runc, crun and gVisor side by side (in turns, in one run), destroy, the memory of an idle
// sandbox, and the floor measured in the same run: `runc run` of an equivalent bundle; runc's
// create → first exec at the runtime with network none and egress in turns (egresscreate.go); job_start
// beside the exec round trip; a fleet of sandboxes whose jobs' logs are followed by watchers
// (jobs.go); the network figures against a lab host in its own network namespace
// (network.go, lab.go); the overhead of a durable run over the same steps by hand and a batch
// of trivial runs against a real `agentbox serve` (runs.go, bench/results-runs.json); what the
// audit log adds to an MCP call, on vs off in turns (audit.go; -audit-only writes
// bench/results-audit.json with make bench-audit); what scrubbing secrets' values out of
// responses costs an intercepted GET, with and without a secret in turns (scrub.go;
// -scrub-only writes bench/results-scrub.json with make bench-scrub). It prints a table and writes JSON results.
//
//	sudo go run ./bench -agentbox bin/agentbox -guest bin/agentbox-guest -out bench/results.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/createtrace"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/microvm"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/wire"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Stat is one measured quantity.
type Stat struct {
	Name string `json:"name"`
	// Runtime is the runtime measured, for the per-runtime figures.
	Runtime string  `json:"runtime,omitempty"`
	Unit    string  `json:"unit"`
	N       int     `json:"n"`
	P50     float64 `json:"p50"`
	P99     float64 `json:"p99"`
	Mean    float64 `json:"mean"`
	Floor   string  `json:"floor,omitempty"`
}

// Results is bench/results.json.
type Results struct {
	Host string    `json:"host"`
	CPUs int       `json:"cpus"`
	When time.Time `json:"when"`
	// Runtime is runc's version (the default runtime, which the single-runtime figures use).
	Runtime string `json:"runtime"`
	// Runtimes are the runtimes measured side by side, with what they enforce.
	Runtimes []runtime.Capabilities `json:"runtimes"`
	// Skipped are runtimes not measured, with the reason.
	Skipped map[string]string `json:"skipped,omitempty"`
	Stats   []Stat            `json:"stats"`
	// Fleet is the fleet run's detail (lines per watcher, CPU, load).
	Fleet *Fleet `json:"fleet,omitempty"`
	// Network is the concurrent-connections figure's detail (network.go).
	Network *NetConcurrency `json:"network,omitempty"`
	// CreateTrace is the create trace's per-step p50 of the cold creates, per runtime
	// (create.go).
	CreateTrace []TraceTable `json:"create_trace,omitempty"`
	// Load is `uptime`'s load averages when the create figures were taken.
	Load string `json:"load,omitempty"`
}

func summarize(name, unit string, xs []float64) Stat {
	s := append([]float64(nil), xs...)
	if len(s) == 0 {
		return Stat{Name: name, Unit: unit}
	}
	sort.Float64s(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	pct := func(p float64) float64 {
		i := int(p*float64(len(s))+0.5) - 1
		return s[max(0, min(len(s)-1, i))]
	}
	return Stat{Name: name, Unit: unit, N: len(s), P50: pct(0.5), P99: pct(0.99), Mean: sum / float64(len(s))}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Names of the per-runtime measures.
const (
	measureCreate = "create → first exec result (REST)"
	measureExec   = "exec round trip of `true` (REST)"
)

func main() {
	bin := flag.String("agentbox", "bin/agentbox", "agentbox binary (the server and CLI the sections run)")
	guestFlag := flag.String("guest", "bin/agentbox-guest", "the lean agent binary the runtimes bind into sandboxes (make build writes it beside bin/agentbox)")
	out := flag.String("out", "bench/results.json", "where to write JSON results")
	nCreate := flag.Int("creates", 50, "sandboxes per runtime for create → first exec")
	nExec := flag.Int("execs", 1000, "exec round trips per runtime")
	nIdle := flag.Int("idle", 20, "idle runc sandboxes for the memory figure")
	idleOnly := flag.Bool("idle-only", false, "measure only the idle sandboxes' memory (writes -out only if it is not the default bench/results.json)")
	nPTY := flag.Int("keystrokes", 1000, "PTY keystroke echo round trips")
	nWatch := flag.Int("watch-events", 300, "events timed from the call's return to SSE / MCP progress delivery")
	only := flag.String("runtimes", "runc,crun,gvisor,vm", "runtimes to measure side by side (runc is always measured; vm where QEMU and its kernel are installed)")
	nVMCreates := flag.Int("vm-creates", 10, "cold creates of runtime vm (its boot takes seconds under TCG: fewer than -creates)")
	nVMPool := flag.Int("vm-pool-claims", 5, "claims from a warm pool of vm sandboxes (0 skips)")
	scrapeLive := flag.Int("scrape-sandboxes", 200, "live runc sandboxes while GET /metrics is timed (0 skips the metrics figures)")
	nScrapes := flag.Int("scrapes", 30, "timed scrapes of GET /metrics")
	metricsOnly := flag.Bool("metrics-only", false, "measure only the metrics figures")
	nJobStarts := flag.Int("job-starts", 200, "timed job_start calls (`true`) on a warm runc sandbox, each beside an exec of `true` (0 skips)")
	fleetN := flag.Int("fleet-sandboxes", 200, "sandboxes in the fleet run, each running one job that prints a line every 100 ms (0 skips)")
	fleetSecs := flag.Int("fleet-seconds", 20, "how long each fleet job prints lines")
	fleetWatchers := flag.Int("fleet-watchers", 20, "watchers in the fleet run, each following the logs streams of its share of the sandboxes")
	fleetPar := flag.Int("fleet-create-parallel", 6, "parallel creates (and job starts, destroys) in the fleet run")
	createOnly := flag.Bool("create-only", false, "measure only the floor, the cold creates on every runtime (REST and CLI) and their create trace (writes -out only if it is not the default bench/results.json)")
	jobsOnly := flag.Bool("jobs-only", false, "measure only the job_start and fleet figures (writes -out only if it is not the default bench/results.json)")
	netf := networkFlags()
	imf := imagesFlags()
	auf := auditBenchFlags()    // the audit log (audit.go)
	rf := runsBenchFlags()      // the (runs.go)
	sqf := sqlFlags()           // execute_sql (sql.go)
	chf := chatFlags()          // agentbox chat's loop (chat.go)
	snf := snapshotFlags()      // files snapshots and fork (snapshots.go)
	slf := sleepFlags()         // gVisor sleep/wake (sleep.go)
	pof := poolsBenchFlags()    // warm pools (pools.go)
	mcf := machinesBenchFlags() // joined machines (machines.go)
	blf := blobsFlags()         // the file relay (blobs.go)
	ref := remoteExecFlags()    // remote_exec on a joined machine (remoteexec.go)
	kbf := kubeBenchFlags()     // the kubernetes runtime (kube.go)
	scf := scrubFlags()         // response scrubbing in the secret interceptor (scrub.go)
	e2f := e2bBenchFlags()      // the E2B-compatible API (e2b.go)
	fleetClient := flag.Bool("fleet-client", false, "internal: run the fleet's watchers against the server named on stdin (the bench runs itself so, so that its own CPU is the server's)")
	cpuprof := flag.String("cpuprofile", "", "write the bench process's CPU profile (the server runs in it) to this file")
	flag.Parse()
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if *fleetClient {
		fleetClientMain() // the fleet's watchers, re-executed in a process of their own (jobs.go)
		return
	}
	if *netf.labServe != "" {
		serveLab(*netf.labServe) // the lab's server, re-executed in its network namespace (lab.go)
		return
	}
	if *blf.only { // the file relay's throughput (blobs.go): no sandboxes
		runBlobsBench(context.Background(), blf, *out)
		return
	}
	if *chf.only { // agentbox chat's loop over the scripted model (chat.go): no sandboxes
		runChatBench(context.Background(), chf, *out)
		return
	}
	if *ref.only { // remote_exec over a joined agent on loopback (remoteexec.go): no sandboxes
		runRemoteExecBench(context.Background(), ref, *out)
		return
	}
	if *scf.only { // response scrubbing's cost to an intercepted GET (scrub.go): no sandboxes
		runScrubBench(context.Background(), scf, *out)
		return
	}
	if *sqf.only { // execute_sql over 1M audit records (sql.go): no sandboxes
		runSQLBench(context.Background(), sqf, *out)
		return
	}
	if os.Geteuid() != 0 {
		log.Fatal("bench needs root (real sandboxes): sudo make bench")
	}
	if *e2f.only { // the E2B-compatible API through E2B's SDK beside REST (e2b.go): a serve child
		stats := runE2BBench(context.Background(), absBin(*bin), e2f)
		printStats(stats)
		writeE2BResults(stats, *e2f.out)
		return
	}
	if *mcf.only { // joined machines (machines.go): a serve child and in-process agents
		res := Results{CPUs: goruntime.NumCPU(), When: time.Now().UTC()}
		res.Host, _ = os.Hostname()
		res.Stats = runMachinesBench(context.Background(), absBin(*bin), mcf)
		printStats(res.Stats)
		if *out != "bench/results.json" {
			writeResults(res, *out)
		}
		return
	}
	guestBin, err := filepath.Abs(*guestFlag)
	if err != nil {
		log.Fatal(err)
	}
	if *kbf.only { // the kubernetes runtime next to local runc and plain pods (kube.go)
		runKubeBench(context.Background(), guestBin, kbf, *out)
		return
	}
	if *rf.only {
		rr := runRuns(context.Background(), absBin(*bin), rf)
		if rr != nil {
			printStats(rr.Stats)
			writeRunsResults(rr, *rf.out)
		}
		return
	}
	dir, err := os.MkdirTemp("", "abbench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// Sandboxes run as unprivileged host users (user namespaces), which must be able to reach
	// the runtimes' roots below it.
	if err := os.Chmod(dir, 0o711); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	res := Results{CPUs: goruntime.NumCPU(), When: time.Now().UTC(), Skipped: map[string]string{}}
	res.Host, _ = os.Hostname()
	// Each runtime has its own root and cgroup parent, as the server gives them.
	var rts []runtime.Runtime
	var names []string
	parents := map[string]string{}
	for _, f := range []oci.Flavor{oci.FlavorRunc, oci.FlavorCrun, oci.FlavorGVisor} {
		name := string(f)
		if f != oci.FlavorRunc && !slices.Contains(strings.Split(*only, ","), name) {
			continue
		}
		parents[name] = "agentbox-bench-" + name
		rt, err := oci.New(ctx, oci.Config{Name: name, Flavor: f, Root: filepath.Join(dir, name), GuestBinary: guestBin,
			CgroupParent: parents[name], Subreaper: true})
		if err != nil {
			log.Fatal(err)
		}
		c := rt.Capabilities()
		if !c.Available {
			if f == oci.FlavorRunc {
				log.Fatalf("runc unavailable: %s", c.Reason)
			}
			res.Skipped[name] = c.Reason
			continue
		}
		rts = append(rts, rt)
		names = append(names, name)
		res.Runtimes = append(res.Runtimes, c)
	}
	defer removeCgroupParents(parents)
	var vmRoot string
	if slices.Contains(strings.Split(*only, ","), microvm.Name) {
		vmRoot = filepath.Join(dir, microvm.Name)
		rt, err := microvm.New(ctx, microvm.Config{Root: vmRoot, GuestBinary: guestBin, CgroupParent: "agentbox-bench-vm"})
		if err != nil {
			log.Fatal(err)
		}
		defer rt.Close(context.Background())
		if c := rt.Capabilities(); !c.Available {
			res.Skipped[microvm.Name] = c.Reason
		} else {
			rts = append(rts, rt)
			names = append(names, microvm.Name)
			res.Runtimes = append(res.Runtimes, c)
		}
	}
	res.Runtime = res.Runtimes[0].Version
	if *snf.only { // files snapshot and fork figures at the runtime (snapshots.go)
		res.Stats = benchSnapshots(ctx, rts[0], dir, *snf.n, *snf.forks)
		printStats(res.Stats)
		if *out != "bench/results.json" {
			writeResults(res, *out)
		}
		return
	}
	prom := api.NewPrometheus()
	// The create trace, summarised in process: every create's steps (create.go).
	traces := createtrace.New(0)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(traces))
	defer tp.Shutdown(context.Background())
	svcCfg := sandbox.Config{Observer: prom, Tracing: tp, MaxSandboxes: max(200, *scrapeLive+30, *fleetN+30, *netf.sandboxes+30)}
	if svcCfg.Egress, err = egressConfig(dir); err != nil { // the network figures' egress (network.go)
		log.Fatal(err)
	}
	imgs, err := image.Open(filepath.Join(dir, "images"), image.Options{InUse: st.ImagesInUse})
	if err != nil {
		log.Fatal(err)
	}
	svcCfg.Images = imgs
	svc, err := sandbox.NewService(st, rts, svcCfg, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer svc.Close()
	const token = "bench-token-0123456789abcdef"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	sbs := jobs.With(svc)
	mcpSrv := mcpserver.New(sbs, mcpserver.Options{})
	defer mcpSrv.Close()
	go http.Serve(ln, api.New(svc, api.Options{Token: token, Prometheus: prom, SandboxJobs: sbs.Jobs(),
		Mount: map[string]http.Handler{"/mcp": mcpSrv.StreamableHTTPHandler(mcpserver.HTTPOptions{MaxBodyBytes: api.MaxJSONBody})}}))
	c := client.New("http://"+ln.Addr().String(), token)
	trueCmd := wire.ExecRequest{Command: []string{"true"}}

	// Warm up: each runtime prepares its shared rootfs on its first create. The warm sandboxes
	// serve the exec round trips.
	warm := map[string]string{}
	for _, name := range names {
		sb, err := c.Create(ctx, wire.CreateRequest{Runtime: name})
		if err != nil {
			log.Fatal(err)
		}
		warm[name] = sb.ID
	}

	if *idleOnly { // the memory of idle sandboxes' agents (-guest names the agent measured)
		idle, stats := benchIdle(ctx, c, dir, parents["runc"], *nIdle)
		res.Stats = stats
		for _, id := range append(idle, slices.Collect(maps.Values(warm))...) {
			c.Destroy(ctx, id)
		}
		printStats(res.Stats)
		if *out != "bench/results.json" {
			writeResults(res, *out)
		}
		return
	}
	if *jobsOnly {
		res.Stats, res.Fleet = benchJobs(ctx, c, token, warm["runc"], *nJobStarts, *fleetN, *fleetWatchers, *fleetSecs, *fleetPar)
		for _, id := range warm {
			c.Destroy(ctx, id)
		}
		printStats(res.Stats)
		if *out != "bench/results.json" {
			writeResults(res, *out)
		}
		return
	}
	if *auf.only { // the audit log's overhead (audit.go)
		res.Stats = benchAudit(ctx, svc, st, token, warm["runc"], *auf.calls)
		for _, id := range warm {
			c.Destroy(ctx, id)
		}
		printStats(res.Stats)
		if *out != "bench/results.json" {
			writeResults(res, *out)
		}
		return
	}
	if *pof.only { // warm pools (pools.go)
		res.Stats = benchPools(ctx, svc, c, warm["runc"], pof)
		for _, id := range warm {
			c.Destroy(ctx, id)
		}
		printStats(res.Stats)
		if *out != "bench/results.json" {
			writeResults(res, *out)
		}
		return
	}
	if *imf.only {
		runImages(ctx, c, dir, filepath.Join(dir, "runc"), &res, imf)
		for _, id := range warm {
			c.Destroy(ctx, id)
		}
		printStats(res.Stats)
		if *out != "bench/results.json" {
			writeResults(res, *out)
		}
		return
	}
	if *netf.only {
		runNetwork(ctx, c, &res, netf)
		if res.Skipped["network"] == "" && *netf.creates > 0 { // the same create at the runtime alone
			res.Stats = append(res.Stats, benchEgressCreate(ctx, rts[0], *netf.creates)...)
		}
		for _, id := range warm {
			c.Destroy(ctx, id)
		}
		printStats(res.Stats)
		if *out != "bench/results.json" {
			writeResults(res, *out)
		}
		return
	}
	if *slf.only { // gVisor sleep/wake (sleep.go)
		runSleep(ctx, rts, filepath.Join(dir, "gvisor"), &res, slf)
		for _, id := range warm {
			c.Destroy(ctx, id)
		}
		printStats(res.Stats)
		if *out != "bench/results.json" {
			writeResults(res, *out)
		}
		return
	}
	if *metricsOnly {
		stats := benchMetrics(ctx, c, "http://"+ln.Addr().String(), token, warm["runc"], *scrapeLive, *nScrapes)
		for _, s := range stats {
			fmt.Printf("runc: %-52s %6d %7.2f %-2s %7.2f %-2s %7.2f %-2s\n", s.Name, s.N, s.P50, s.Unit, s.P99, s.Unit, s.Mean, s.Unit)
		}
		for _, id := range warm {
			c.Destroy(ctx, id)
		}
		return
	}

	// Floor: `runc run` of the same bundle with `true` as its process.
	floor := runcRunFloor(dir, warm["runc"], parents["runc"], *nCreate)
	res.Stats = append(res.Stats, floor)

	// The runtimes take turns, one create (or exec) each, so that the host's noise falls on
	// all of them alike; every create is measured as every other section's (coldCreate).
	res.Load = uptimeLoad()
	traces.Reset()
	createExec, destroy := map[string][]float64{}, map[string][]float64{}
	measured := map[string]float64{}
	for i := 0; i < *nCreate; i++ {
		for _, name := range names {
			if name == microvm.Name && i >= *nVMCreates {
				continue
			}
			id, d, dd := mustColdCreate(ctx, c, wire.CreateRequest{Runtime: name})
			createExec[name], destroy[name] = append(createExec[name], d), append(destroy[name], dd)
			measured[id] = d
		}
	}
	res.CreateTrace = traceTables(traces, measured, names)
	// The CLI's creates on the container runtimes (vm's boot would only add its REST figure).
	cliStats := benchCLICreate(ctx, absBin(*bin), "http://"+ln.Addr().String(), token,
		slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == microvm.Name }), *nCreate, floor.P50)
	if *createOnly {
		for _, name := range names {
			s := summarize(measureCreate, "ms", createExec[name])
			s.Runtime, s.Floor = name, floorNote(s.P50, floor.P50)
			res.Stats = append(res.Stats, s)
		}
		res.Stats = append(res.Stats, cliStats...)
		if vmID, ok := warm[microvm.Name]; ok { // the vm runtime's exec, memory and pool figures (vm.go)
			// The exec round trip on vm beside gVisor's (and runc's), in turns.
			execs := map[string][]float64{}
			for range 300 {
				for _, name := range []string{"runc", "gvisor", microvm.Name} {
					id, ok := warm[name]
					if !ok {
						continue
					}
					t0 := time.Now()
					if _, err := c.Exec(ctx, id, trueCmd, nil); err != nil {
						log.Fatalf("%s: %v", name, err)
					}
					execs[name] = append(execs[name], ms(time.Since(t0)))
				}
			}
			for _, name := range []string{"runc", "gvisor", microvm.Name} {
				if len(execs[name]) > 0 {
					s := summarize(measureExec, "ms", execs[name])
					s.Runtime = name
					res.Stats = append(res.Stats, s)
				}
			}
			res.Stats = append(res.Stats, vmIdleRSS(vmRoot, []string{vmID}, 10*time.Second))
			res.Stats = append(res.Stats, benchVMPool(ctx, svc, c, rts[len(rts)-1], vmID, *nVMPool)...)
		}
		for _, id := range warm {
			c.Destroy(ctx, id)
		}
		printStats(res.Stats)
		printTraceTables(res.CreateTrace)
		fmt.Println("load (uptime):", res.Load)
		if *out != "bench/results.json" {
			writeResults(res, *out)
		}
		return
	}
	// What network egress adds to a runc create, at the runtime (egresscreate.go).
	res.Stats = append(res.Stats, benchEgressCreate(ctx, rts[0], *nCreate)...)
	res.Stats = append(res.Stats, benchSnapshots(ctx, rts[0], dir, *snf.n, *snf.forks)...)
	execs := map[string][]float64{}
	for i := 0; i < *nExec; i++ {
		for _, name := range names {
			t0 := time.Now()
			if _, err := c.Exec(ctx, warm[name], trueCmd, nil); err != nil {
				log.Fatalf("%s: %v", name, err)
			}
			execs[name] = append(execs[name], ms(time.Since(t0)))
		}
	}
	for _, name := range names {
		s := summarize(measureCreate, "ms", createExec[name])
		s.Runtime, s.Floor = name, floorNote(s.P50, floor.P50)
		res.Stats = append(res.Stats, s)
		s = summarize(measureExec, "ms", execs[name])
		s.Runtime = name
		res.Stats = append(res.Stats, s)
	}

	if vmID, ok := warm[microvm.Name]; ok { // the vm runtime's memory and pool figures (vm.go)
		res.Stats = append(res.Stats, vmIdleRSS(vmRoot, []string{vmID}, 10*time.Second))
		res.Stats = append(res.Stats, benchVMPool(ctx, svc, c, rts[len(rts)-1], vmID, *nVMPool)...)
	}
	res.Stats = append(res.Stats, cliStats...)
	for _, name := range names {
		s := summarize("destroy", "ms", destroy[name])
		s.Runtime = name
		res.Stats = append(res.Stats, s)
	}

	for _, st := range benchMCP(ctx, "http://"+ln.Addr().String()+"/mcp", token, warm["runc"], *nExec) {
		st.Runtime = "runc"
		res.Stats = append(res.Stats, st)
	}

	ptyStat := benchPTY(ctx, c, warm["runc"], *nPTY)
	ptyStat.Runtime = "runc"
	res.Stats = append(res.Stats, ptyStat)
	for _, st := range benchWatch(ctx, c, "http://"+ln.Addr().String()+"/mcp", token, warm["runc"], *nWatch) {
		st.Runtime = "runc"
		res.Stats = append(res.Stats, st)
	}

	// Memory per idle runc sandbox: the agent's PSS (its binary pages are shared) and its RSS.
	idle, idleStats := benchIdle(ctx, c, dir, parents["runc"], *nIdle)
	res.Stats = append(res.Stats, idleStats...)
	// GET /metrics with many live sandboxes (the idle ones count), and exec while scraped.
	if *scrapeLive > 0 {
		for _, s := range benchMetrics(ctx, c, "http://"+ln.Addr().String(), token, warm["runc"], *scrapeLive, *nScrapes) {
			s.Runtime = "runc"
			res.Stats = append(res.Stats, s)
		}
	}
	for _, id := range idle {
		c.Destroy(ctx, id)
	}
	// job_start latency and the fleet of watched jobs.
	jobStats, fleet := benchJobs(ctx, c, token, warm["runc"], *nJobStarts, *fleetN, *fleetWatchers, *fleetSecs, *fleetPar)
	res.Stats, res.Fleet = append(res.Stats, jobStats...), fleet
	runNetwork(ctx, c, &res, netf)                                // the (network.go)
	runImages(ctx, c, dir, filepath.Join(dir, "runc"), &res, imf) // the (images.go)
	runSleep(ctx, rts, filepath.Join(dir, "gvisor"), &res, slf)   // the sleep/wake (sleep.go)
	if rr := runRuns(ctx, absBin(*bin), rf); rr != nil {          // the (runs.go)
		res.Stats = append(res.Stats, rr.Stats...)
		writeRunsResults(rr, *rf.out)
	}
	// the (audit.go)
	res.Stats = append(res.Stats, benchAudit(ctx, svc, st, token, warm["runc"], *auf.calls)...)
	res.Stats = append(res.Stats, benchPools(ctx, svc, c, warm["runc"], pof)...) // the pool figures (pools.go)
	res.Stats = append(res.Stats, benchRemoteExec(ctx, ref)...)                  // the remote_exec (remoteexec.go)
	res.Stats = append(res.Stats, benchBlobs(ctx, blf)...)                       // the file relay (blobs.go)
	res.Stats = append(res.Stats, benchScrub(ctx, scf)...)                       // response scrubbing (scrub.go)
	res.Stats = append(res.Stats, runMachinesBench(ctx, absBin(*bin), mcf)...)   // the 200 joined machines (machines.go)
	for _, id := range warm {
		c.Destroy(ctx, id)
	}

	fmt.Printf("agentbox bench — %s, %d CPUs\n", res.Host, res.CPUs)
	for _, rc := range res.Runtimes {
		fmt.Printf("  %-7s %-16s %s isolation\n", rc.Name, rc.Version, rc.Isolation)
	}
	for name, why := range res.Skipped {
		fmt.Printf("  %-7s skipped: %s\n", name, why)
	}
	fmt.Printf("\nside by side (p50 / p99, ms)\n%-36s", "measure")
	for _, name := range names {
		fmt.Printf(" %20s", name)
	}
	fmt.Println()
	for _, m := range []string{measureCreate, measureExec, "destroy"} {
		fmt.Printf("%-36s", m)
		for _, name := range names {
			for _, s := range res.Stats {
				if s.Name == m && s.Runtime == name {
					fmt.Printf(" %20s", fmt.Sprintf("%.2f / %.2f", s.P50, s.P99))
				}
			}
		}
		fmt.Println()
	}
	printStats(res.Stats)
	printTraceTables(res.CreateTrace)
	fmt.Println("load (uptime) at the create figures:", res.Load)
	writeResults(res, *out)
}

// printStats prints the table of every figure.
func printStats(stats []Stat) {
	fmt.Printf("\n%-52s %6s %10s %10s %10s  %s\n", "measure", "n", "p50", "p99", "mean", "floor")
	for _, s := range stats {
		name := s.Name
		if s.Runtime != "" {
			name = s.Runtime + ": " + name
		}
		fmt.Printf("%-52s %6d %7.2f %-2s %7.2f %-2s %7.2f %-2s  %s\n", name, s.N, s.P50, s.Unit, s.P99, s.Unit, s.Mean, s.Unit, s.Floor)
	}
}

func writeResults(res Results, out string) {
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nwrote %s\n", out)
}

// removeCgroupParents removes the bench's (empty) cgroup parents from every hierarchy.
func removeCgroupParents(parents map[string]string) {
	mounts, _ := hostinfo.CgroupMounts()
	for _, m := range mounts {
		for _, p := range parents {
			_ = os.Remove(filepath.Join(m.Path, p))
		}
	}
}

// runcRunFloor runs `runc run` n times on a copy of a live sandbox's bundle whose process is
// /usr/bin/true: same rootfs, mounts, namespaces and cgroup limits, no agent.
func runcRunFloor(dir, id, parent string, n int) Stat {
	src := filepath.Join(dir, "runc", "sandboxes", id, "config.json")
	b, err := os.ReadFile(src)
	if err != nil {
		log.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		log.Fatal(err)
	}
	spec["process"].(map[string]any)["args"] = []string{"/usr/bin/true"}
	bundle := filepath.Join(dir, "floor")
	os.MkdirAll(bundle, 0o700)
	root := filepath.Join(dir, "floor-state")
	var xs []float64
	for i := 0; i < n; i++ {
		spec["linux"].(map[string]any)["cgroupsPath"] = "/" + parent + "/floor-" + strconv.Itoa(i)
		b, _ := json.Marshal(spec)
		os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
		t0 := time.Now()
		cmd := exec.Command("runc", "--root", root, "run", "--bundle", bundle, "floor-"+strconv.Itoa(i))
		if out, err := cmd.CombinedOutput(); err != nil {
			log.Fatalf("runc run: %v: %s", err, out)
		}
		xs = append(xs, ms(time.Since(t0)))
		exec.Command("runc", "--root", root, "delete", "--force", "floor-"+strconv.Itoa(i)).Run()
	}
	return summarize("floor: `runc run` of the same bundle (true)", "ms", xs)
}

// benchIdle creates n runc sandboxes and leaves them idle for a second, then measures each one's
// agent (PSS: its binary's pages are shared by all; RSS) and memory cgroup. It returns the
// sandboxes, still running, and the figures.
func benchIdle(ctx context.Context, c *client.Client, dir, parent string, n int) ([]string, []Stat) {
	var idle []string
	for i := 0; i < n; i++ {
		sb, err := c.Create(ctx, wire.CreateRequest{Runtime: "runc"})
		if err != nil {
			log.Fatal(err)
		}
		idle = append(idle, sb.ID)
	}
	time.Sleep(time.Second)
	var pss, rss, cg []float64
	for _, id := range idle {
		p, r := agentMemory(filepath.Join(dir, "runc"), id)
		pss, rss = append(pss, p), append(rss, r)
		cg = append(cg, cgroupMemory(parent, id))
	}
	var out []Stat
	for _, s := range []Stat{
		summarize("host memory per idle sandbox (agent PSS)", "MiB", pss),
		summarize("host memory per idle sandbox (agent RSS)", "MiB", rss),
		summarize("memory cgroup usage per idle sandbox", "MiB", cg),
	} {
		s.Runtime = "runc"
		out = append(out, s)
	}
	return idle, out
}

func agentMemory(root, id string) (pss, rss float64) {
	b, err := os.ReadFile(filepath.Join(root, "sandboxes", id, "init.pid"))
	if err != nil {
		return 0, 0
	}
	pid := strings.TrimSpace(string(b))
	sm, _ := os.ReadFile("/proc/" + pid + "/smaps_rollup")
	for _, line := range strings.Split(string(sm), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			kb, _ := strconv.ParseFloat(f[1], 64)
			switch f[0] {
			case "Pss:":
				pss = kb / 1024
			case "Rss:":
				rss = kb / 1024
			}
		}
	}
	return pss, rss
}

func cgroupMemory(parent, id string) float64 {
	for _, p := range []string{"/sys/fs/cgroup/memory/" + parent + "/" + id + "/memory.usage_in_bytes", "/sys/fs/cgroup/" + parent + "/" + id + "/memory.current"} {
		if b, err := os.ReadFile(p); err == nil {
			v, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
			return v / (1 << 20)
		}
	}
	return 0
}
