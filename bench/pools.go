package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// Warm pools: create from a warm pool → first exec result, against the exec round
// trip alone on a warm sandbox in the same run (in turns), and a cold create of the same shape
// for comparison. Target: the claim adds ≤ 5 ms to the exec at p50, ≤ 20 ms at p99.

type poolsBench struct {
	only  *bool
	n     *int
	colds *int
}

func poolsBenchFlags() poolsBench {
	return poolsBench{
		only:  flag.Bool("pools-only", false, "measure only the warm-pool figures (writes -out only if it is not the default bench/results.json)"),
		n:     flag.Int("pool-claims", 100, "timed creates from a warm pool, each followed by its first exec (0 skips the pool figures)"),
		colds: flag.Int("pool-colds", 20, "timed cold creates of the pool's shape (the pool parked) for comparison"),
	}
}

// Names of the pool figures.
const (
	measurePoolHit   = "create from a warm pool → first exec result"
	measurePoolExec  = "exec round trip (same run, the pool figure's floor)"
	measurePoolAdds  = "warm-pool create adds to the exec (paired: hit − exec)"
	measurePoolCold  = "cold create of the pool's shape → first exec (a miss)"
	measurePoolClaim = "warm-pool create alone (POST /v1/sandboxes, a claim)"
	measurePoolFirst = "first exec in a claimed sandbox"
	benchPoolName    = "bench"
	benchPoolSize    = 4
	poolReadyTimeout = 2 * time.Minute
)

// benchPools runs the pool figures on runc over REST (the service's refill loop runs on ctx).
func benchPools(ctx context.Context, svc *sandbox.Service, c *client.Client, warmID string, pf poolsBench) []Stat {
	n := *pf.n
	if n <= 0 {
		return nil
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { svc.Run(rctx); close(done) }() // the control loop and the pools' refill loop
	defer func() { cancel(); <-done }()
	shape := wire.CreateRequest{Runtime: "runc", CPU: 0.5, MemoryMB: 256, DiskMB: 256}
	if _, err := c.SetPool(ctx, wire.Pool{Name: benchPoolName, Runtime: shape.Runtime, CPU: shape.CPU,
		MemoryMB: shape.MemoryMB, DiskMB: shape.DiskMB, Size: benchPoolSize}); err != nil {
		log.Fatalf("pools: set: %v", err)
	}
	trueCmd := wire.ExecRequest{Command: []string{"true"}}
	var hits, execs, adds, claims, firsts []float64
	for i := 0; i < n; i++ {
		waitPoolReady(ctx, c, benchPoolSize) // each claim finds the pool full: a hit, never a race with the refill
		t0 := time.Now()
		sb, err := c.Create(ctx, shape)
		if err != nil {
			log.Fatalf("pools: create: %v", err)
		}
		tc := time.Now()
		if r, err := c.Exec(ctx, sb.ID, trueCmd, nil); err != nil || r.ExitCode != 0 {
			log.Fatalf("pools: first exec: %v %+v", err, r)
		}
		hit := ms(time.Since(t0))
		claims, firsts = append(claims, ms(tc.Sub(t0))), append(firsts, ms(time.Since(tc)))
		if !sb.FromPool {
			log.Fatalf("pools: create %d was not claimed from the pool", i)
		}
		t1 := time.Now()
		if _, err := c.Exec(ctx, warmID, trueCmd, nil); err != nil {
			sb, _ := c.Get(ctx, warmID)
			log.Fatalf("pools: exec %d: %v (the warm sandbox: %s, %s)", i, err, sb.State, sb.Error)
		}
		ex := ms(time.Since(t1))
		hits, execs, adds = append(hits, hit), append(execs, ex), append(adds, hit-ex)
		c.Destroy(ctx, sb.ID)
	}
	// The pool parked: the same shape starts a sandbox (what a miss costs).
	if _, err := c.SetPool(ctx, wire.Pool{Name: benchPoolName, Runtime: shape.Runtime, CPU: shape.CPU,
		MemoryMB: shape.MemoryMB, DiskMB: shape.DiskMB, Size: 0}); err != nil {
		log.Fatalf("pools: park: %v", err)
	}
	var colds []float64
	for i := 0; i < *pf.colds; i++ {
		_, d, _ := mustColdCreate(ctx, c, shape) // fails on a create claimed from the parked pool
		colds = append(colds, d)
	}
	if err := c.DeletePool(ctx, benchPoolName); err != nil {
		log.Printf("pools: delete: %v", err)
	}
	exec := summarize(measurePoolExec, "ms", execs)
	hit := summarize(measurePoolHit, "ms", hits)
	hit.Floor = fmt.Sprintf("exec p50 %.2f ms", exec.P50)
	add := summarize(measurePoolAdds, "ms", adds)
	add.Floor = "target p50 ≤ 5 ms, p99 ≤ 20 ms"
	cold := summarize(measurePoolCold, "ms", colds)
	out := []Stat{hit, exec, add, summarize(measurePoolClaim, "ms", claims), summarize(measurePoolFirst, "ms", firsts), cold}
	for i := range out {
		out[i].Runtime = "runc"
	}
	return out
}

// waitPoolReady waits until the bench pool holds size ready sandboxes.
func waitPoolReady(ctx context.Context, c *client.Client, size int) {
	deadline := time.Now().Add(poolReadyTimeout)
	for {
		l, err := c.ListPools(ctx)
		if err != nil {
			log.Fatalf("pools: list: %v", err)
		}
		for _, p := range l.Pools {
			if p.Name == benchPoolName && p.Ready >= size {
				return
			}
		}
		if time.Now().After(deadline) {
			log.Fatalf("pools: the pool did not refill within %s: %+v", poolReadyTimeout, l.Pools)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
