package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// The vm runtime's own figures (the cold create and the exec round trip are measured with the
// other runtimes' in turns, main.go): host memory per idle VM, and a claim from a warm pool of
// booted VMs.

const (
	vmPoolName = "bench-vm"
	vmPoolSize = 2
)

// vmIdleRSS is the host memory an idle VM takes: its QEMU's RSS (MiB) after idle seconds of
// idling, for each of the VMs named.
func vmIdleRSS(root string, ids []string, idle time.Duration) Stat {
	time.Sleep(idle)
	var xs []float64
	for _, id := range ids {
		b, err := os.ReadFile(filepath.Join(root, "sandboxes", id, "qemu.json"))
		if err != nil {
			log.Fatalf("vm: %v", err)
		}
		var p struct{ PID int }
		if err := json.Unmarshal(b, &p); err != nil {
			log.Fatalf("vm: qemu.json: %v", err)
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
		if err != nil {
			log.Fatalf("vm: %v", err)
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				xs = append(xs, kb/1024)
			}
		}
	}
	s := summarize(fmt.Sprintf("host memory per idle VM (QEMU RSS after %s idle, %d MiB guest)", idle, 256), "MiB", xs)
	s.Runtime = "vm"
	return s
}

// benchVMPool measures n claims from a warm pool of booted VMs (pool size vmPoolSize, refilled
// between claims): create → reply, and create → first exec.
func benchVMPool(ctx context.Context, svc *sandbox.Service, c *client.Client, rt runtime.Runtime, warmID string, n int) []Stat {
	if n <= 0 {
		return nil
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { svc.Run(rctx); close(done) }() // the control loop and the pools' refill loop
	defer func() { cancel(); <-done }()
	shape := wire.CreateRequest{Runtime: "vm", CPU: 1, MemoryMB: 256, DiskMB: 256}
	if _, err := c.SetPool(ctx, wire.Pool{Name: vmPoolName, Runtime: shape.Runtime, CPU: shape.CPU,
		MemoryMB: shape.MemoryMB, DiskMB: shape.DiskMB, Size: vmPoolSize}); err != nil {
		log.Fatalf("vm pool: set: %v", err)
	}
	defer func() {
		// The pool's ready VMs are destroyed in the background, by the control loop: wait for
		// them while it runs, or they would outlive the bench.
		if err := c.DeletePool(context.Background(), vmPoolName); err != nil {
			log.Fatalf("vm pool: delete: %v", err)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			ids, err := rt.List(ctx) // every VM holding anything on the host
			if err != nil {
				log.Fatalf("vm pool: list: %v", err)
			}
			left := 0
			for _, id := range ids {
				if id != warmID {
					left++
				}
			}
			if left == 0 {
				return
			}
			if time.Now().After(deadline) {
				log.Fatalf("vm pool: %d pooled VMs not destroyed within 2 minutes", left)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	trueCmd := wire.ExecRequest{Command: []string{"true"}}
	var claims, firsts []float64
	for i := 0; i < n; i++ {
		waitPool(ctx, c, vmPoolName, vmPoolSize, 5*time.Minute)
		t0 := time.Now()
		sb, err := c.Create(ctx, shape)
		if err != nil {
			log.Fatalf("vm pool: create: %v", err)
		}
		tc := time.Now()
		if r, err := c.Exec(ctx, sb.ID, trueCmd, nil); err != nil || r.ExitCode != 0 {
			log.Fatalf("vm pool: first exec: %v %+v", err, r)
		}
		if !sb.FromPool {
			log.Fatalf("vm pool: create %d was not claimed from the pool", i)
		}
		claims, firsts = append(claims, ms(tc.Sub(t0))), append(firsts, ms(time.Since(t0)))
		c.Destroy(ctx, sb.ID)
	}
	a := summarize("create from a warm pool of booted VMs: claim (REST reply)", "ms", claims)
	b := summarize("create from a warm pool of booted VMs → first exec result", "ms", firsts)
	a.Runtime, b.Runtime = "vm", "vm"
	return []Stat{a, b}
}

func waitPool(ctx context.Context, c *client.Client, name string, size int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		l, err := c.ListPools(ctx)
		if err != nil {
			log.Fatalf("pools: list: %v", err)
		}
		for _, p := range l.Pools {
			if p.Name == name && p.Ready >= size {
				return
			}
		}
		if time.Now().After(deadline) {
			log.Fatalf("pool %s did not refill within %s: %+v", name, timeout, l.Pools)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
