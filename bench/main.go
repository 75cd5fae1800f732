// Command bench measures agentbox on this host and compares it with the floor measured in the
// same run: `runc run` of an equivalent bundle. It prints a table and writes JSON results.
//
//	sudo go run ./bench -agentbox bin/agentbox -out bench/results.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// Stat is one measured quantity.
type Stat struct {
	Name  string  `json:"name"`
	Unit  string  `json:"unit"`
	N     int     `json:"n"`
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
	Mean  float64 `json:"mean"`
	Floor string  `json:"floor,omitempty"`
}

// Results is bench/results.json.
type Results struct {
	Host    string    `json:"host"`
	CPUs    int       `json:"cpus"`
	When    time.Time `json:"when"`
	Runtime string    `json:"runtime"`
	Stats   []Stat    `json:"stats"`
}

func summarize(name, unit string, xs []float64) Stat {
	s := append([]float64(nil), xs...)
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

func main() {
	bin := flag.String("agentbox", "bin/agentbox", "agentbox binary (the in-sandbox agent)")
	out := flag.String("out", "bench/results.json", "where to write JSON results")
	nCreate := flag.Int("creates", 50, "sandboxes for create → first exec")
	nExec := flag.Int("execs", 1000, "exec round trips")
	nIdle := flag.Int("idle", 20, "idle sandboxes for the memory figure")
	flag.Parse()
	if os.Geteuid() != 0 {
		log.Fatal("bench needs root (real runc sandboxes): sudo make bench")
	}
	guestBin, err := filepath.Abs(*bin)
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "abbench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	parent := "agentbox-bench"
	rt, err := oci.New(ctx, oci.Config{Name: "runc", Root: filepath.Join(dir, "rt"), GuestBinary: guestBin, CgroupParent: parent, Subreaper: true})
	if err != nil {
		log.Fatal(err)
	}
	if c := rt.Capabilities(); !c.Available {
		log.Fatalf("runc unavailable: %s", c.Reason)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	const token = "bench-token-0123456789abcdef"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(ln, api.New(svc, api.Options{Token: token}))
	c := client.New("http://"+ln.Addr().String(), token)

	res := Results{CPUs: goruntime.NumCPU(), When: time.Now().UTC(), Runtime: rt.Capabilities().Version}
	res.Host, _ = os.Hostname()
	trueCmd := api.ExecRequest{Command: []string{"true"}}

	// Warm up: the shared rootfs is prepared on the first create.
	warm, err := c.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		log.Fatal(err)
	}

	// Floor: `runc run` of the same bundle with `true` as its process.
	floor := runcRunFloor(dir, rt, warm.ID, parent, *nCreate)
	res.Stats = append(res.Stats, floor)

	var createExec, destroy []float64
	var ids []string
	for i := 0; i < *nCreate; i++ {
		t0 := time.Now()
		sb, err := c.Create(ctx, sandbox.CreateRequest{})
		if err != nil {
			log.Fatal(err)
		}
		if r, err := c.Exec(ctx, sb.ID, trueCmd, nil); err != nil || r.ExitCode != 0 {
			log.Fatalf("first exec: %v %+v", err, r)
		}
		createExec = append(createExec, ms(time.Since(t0)))
		ids = append(ids, sb.ID)
	}
	s := summarize("create → first exec result (REST)", "ms", createExec)
	s.Floor = fmt.Sprintf("runc run p50 %.1f ms", floor.P50)
	res.Stats = append(res.Stats, s)

	var execs []float64
	for i := 0; i < *nExec; i++ {
		t0 := time.Now()
		if _, err := c.Exec(ctx, warm.ID, trueCmd, nil); err != nil {
			log.Fatal(err)
		}
		execs = append(execs, ms(time.Since(t0)))
	}
	res.Stats = append(res.Stats, summarize("exec round trip of `true` (REST)", "ms", execs))

	for _, id := range ids {
		t0 := time.Now()
		if _, err := c.Destroy(ctx, id); err != nil {
			log.Fatal(err)
		}
		destroy = append(destroy, ms(time.Since(t0)))
	}
	res.Stats = append(res.Stats, summarize("destroy", "ms", destroy))

	// Memory per idle sandbox: the agent's PSS (its binary pages are shared) and its RSS.
	var idle []string
	for i := 0; i < *nIdle; i++ {
		sb, err := c.Create(ctx, sandbox.CreateRequest{})
		if err != nil {
			log.Fatal(err)
		}
		idle = append(idle, sb.ID)
	}
	time.Sleep(time.Second)
	var pss, rss, cg []float64
	for _, id := range idle {
		p, r := agentMemory(dir, id)
		pss, rss = append(pss, p), append(rss, r)
		cg = append(cg, cgroupMemory(parent, id))
	}
	res.Stats = append(res.Stats, summarize("host memory per idle sandbox (agent PSS)", "MiB", pss))
	res.Stats = append(res.Stats, summarize("host memory per idle sandbox (agent RSS)", "MiB", rss))
	res.Stats = append(res.Stats, summarize("memory cgroup usage per idle sandbox", "MiB", cg))
	for _, id := range append(idle, warm.ID) {
		c.Destroy(ctx, id)
	}

	fmt.Printf("agentbox bench — %s, %d CPUs, runc %s\n\n", res.Host, res.CPUs, res.Runtime)
	fmt.Printf("%-44s %6s %10s %10s %10s  %s\n", "measure", "n", "p50", "p99", "mean", "floor")
	for _, s := range res.Stats {
		fmt.Printf("%-44s %6d %7.2f %-2s %7.2f %-2s %7.2f %-2s  %s\n", s.Name, s.N, s.P50, s.Unit, s.P99, s.Unit, s.Mean, s.Unit, s.Floor)
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nwrote %s\n", *out)
}

// runcRunFloor runs `runc run` n times on a copy of a live sandbox's bundle whose process is
// /usr/bin/true: same rootfs, mounts, namespaces and cgroup limits, no agent.
func runcRunFloor(dir string, rt *oci.Runtime, id, parent string, n int) Stat {
	src := filepath.Join(dir, "rt", "sandboxes", id, "config.json")
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
	_ = rt
	return summarize("floor: `runc run` of the same bundle (true)", "ms", xs)
}

func agentMemory(dir, id string) (pss, rss float64) {
	b, err := os.ReadFile(filepath.Join(dir, "rt", "sandboxes", id, "init.pid"))
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
