package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/agent"
	"github.com/agentbox/agentbox/internal/wire"
)

// Joined machines: N machines (in-process agents, goroutines of this process)
// joined to and held by one real `agentbox serve` child process: the server's RSS and CPU with
// them connected and heartbeating, against the same server with none (its floor, same run),
// and a probe round trip (a new yamux stream to an agent's handler) while all are held.

type machinesBench struct {
	only *bool
	n    *int
	hold *time.Duration
}

func machinesBenchFlags() machinesBench {
	return machinesBench{
		only: flag.Bool("machines-only", false, "measure only the joined-machines figures (writes -out only if it is not the default bench/results.json)"),
		n:    flag.Int("machines", 200, "joined machines held by one server (in-process agents)"),
		hold: flag.Duration("machines-hold", 30*time.Second, "how long the machines are held while the server's CPU is measured"),
	}
}

// procStat is a process's RSS (bytes) and CPU time (user+system).
func procStat(pid int) (rss int64, cpu time.Duration) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		log.Fatalf("machines: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			rss = kb << 10
		}
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		log.Fatalf("machines: %v", err)
	}
	f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64) // utime, stime: fields 14, 15 of stat
	sy, _ := strconv.ParseInt(f[12], 10, 64)
	return rss, time.Duration(ut+sy) * time.Second / 100 // USER_HZ
}

// cpuOver is the process's CPU use in percent of one core over d.
func cpuOver(pid int, d time.Duration) float64 {
	_, c0 := procStat(pid)
	t0 := time.Now()
	time.Sleep(d)
	_, c1 := procStat(pid)
	return 100 * float64(c1-c0) / float64(time.Since(t0))
}

func runMachinesBench(ctx context.Context, bin string, mb machinesBench) []Stat {
	n := *mb.n
	dir, err := os.MkdirTemp("", "abbench-machines-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil { // the server's state dir must be searchable (sandboxes' ids)
		log.Fatal(err)
	}
	token := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	state := filepath.Join(dir, "state")
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--cgroup-parent", "abbench-machines-"+strconv.Itoa(os.Getpid()), "--log-level", "warn")
	cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+token)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	var url string
	for deadline := time.Now().Add(30 * time.Second); ; {
		if info, err := config.ReadServerInfo(state); err == nil && info.PID == cmd.Process.Pid {
			url = info.URL
			break
		}
		if time.Now().After(deadline) {
			log.Fatal("machines: agentbox serve did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	c, err := client.NewTLS(url, token, client.TLS{})
	if err != nil {
		log.Fatal(err)
	}
	pid := cmd.Process.Pid
	time.Sleep(2 * time.Second) // settle
	rss0, _ := procStat(pid)
	idleCPU := cpuOver(pid, 5*time.Second)

	tok, err := c.CreateJoinToken(ctx, wire.TokenRequest{Uses: n})
	if err != nil {
		log.Fatalf("machines: token: %v", err)
	}
	noGPUs := func(context.Context) ([]gpu.GPU, error) {
		return gpu.Parse([]byte("0, NVIDIA GeForce RTX 3090, 24576, 1234, 7\n1, NVIDIA A100-SXM4-80GB, 81920, 0, 0\n"))
	}
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var connected atomic.Int64
	joinStart := time.Now()
	var joins []float64
	for i := range n {
		cfg := agent.Config{ServerURL: url, StateDir: filepath.Join(dir, "m", strconv.Itoa(i)), GPUs: noGPUs,
			Connected: func() { connected.Add(1) }}
		t0 := time.Now()
		st, err := agent.Enroll(ctx, cfg, tok.Secret, fmt.Sprintf("bench-%03d", i))
		if err != nil {
			log.Fatalf("machines: enroll %d: %v", i, err)
		}
		joins = append(joins, ms(time.Since(t0)))
		wg.Add(1)
		go func() { defer wg.Done(); agent.Run(actx, cfg, st) }()
	}
	defer func() { cancel(); wg.Wait() }()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		ms, err := c.ListMachines(ctx)
		on := 0
		for _, m := range ms {
			if m.Online && m.LastSeen != nil {
				on++
			}
		}
		if err == nil && on == n {
			break
		}
		if time.Now().After(deadline) {
			log.Fatalf("machines: %d of %d online after 2 minutes (%v)", on, n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	allUp := time.Since(joinStart)
	heldCPU := cpuOver(pid, *mb.hold)
	rss1, _ := procStat(pid)
	var probes []float64
	for i := range n {
		t0 := time.Now()
		if _, err := c.ProbeMachine(ctx, fmt.Sprintf("bench-%03d", i)); err != nil {
			log.Fatalf("machines: probe %d: %v", i, err)
		}
		probes = append(probes, ms(time.Since(t0)))
	}
	if got := connected.Load(); got != int64(n) {
		log.Printf("machines: %d sessions started for %d machines (reconnects while held)", got, n)
	}
	one := func(name, unit string, v float64, floor string) Stat {
		return Stat{Name: name, Unit: unit, N: 1, P50: v, P99: v, Mean: v, Floor: floor}
	}
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	return []Stat{
		one(fmt.Sprintf("machines: server RSS, %d joined and connected", n), "MiB", mib(rss1), fmt.Sprintf("same server, none joined: %.1f MiB", mib(rss0))),
		one(fmt.Sprintf("machines: server RSS per machine (%d held)", n), "KiB", float64(rss1-rss0)/1024/float64(n), "-"),
		one(fmt.Sprintf("machines: server CPU, %d held %v (heartbeats every %v)", n, *mb.hold, machine.DefaultHeartbeatInterval), "%", heldCPU, fmt.Sprintf("same server, none joined: %.2f %%", idleCPU)),
		one(fmt.Sprintf("machines: %d joined (one after another) and all online", n), "s", allUp.Seconds(), "-"),
		summarize("machines: join (POST /v1/machines/join)", "ms", joins),
		summarize(fmt.Sprintf("machines: probe round trip over a new stream, %d held", n), "ms", probes),
	}
}
