package mcpserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
)

// TestPoolTools: pool_set, pool_list and pool_delete; a create of the pool's shape is claimed from it and says so, and sees its env.
func TestPoolTools(t *testing.T) {
	for _, tc := range []struct{ name string }{{"in process"}} {
		t.Run(tc.name, func(t *testing.T) {
			svc := fakeService(t)
			pools.New(svc.Core(), svc.Core().Store()) // wired before the loop starts its refill
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { svc.Run(ctx); close(done) }() // the refill loop runs with the control loop
			t.Cleanup(func() { cancel(); <-done })
			var b mcpserver.Backend = svc
			srv := mcpserver.New(b, mcpserver.Options{})
			t.Cleanup(srv.Close)
			c := connect(t, srv, protocolVersions[len(protocolVersions)-1])

			c.fails("pool_set", obj{"name": "py"}, "INVALID_ARGUMENT")
			c.fails("pool_set", obj{"name": "Bad!", "size": 1}, "INVALID_ARGUMENT")
			c.fails("pool_set", obj{"name": "py", "size": 1000}, "INVALID_ARGUMENT")
			c.fails("pool_delete", obj{"name": "nope"}, "POOL_NOT_FOUND")
			var set mcpserver.PoolInfo
			c.ok("pool_set", obj{"name": "py", "size": 2, "memory_mb": 256}, &set)
			if set.Name != "py" || set.Size != 2 || set.MemoryMB != 256 || set.Image != "host" || set.Network != "none" {
				t.Fatalf("pool_set: %+v", set)
			}
			var l mcpserver.PoolListOut
			deadline := time.Now().Add(20 * time.Second)
			for {
				c.ok("pool_list", nil, &l)
				if l.Count == 1 && l.Pools[0].Ready == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the pool never filled: %+v", l)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if l.MaxPooled != sandbox.DefaultMaxSandboxes/2 {
				t.Fatalf("max_pooled %d", l.MaxPooled)
			}
			var sb mcpserver.SandboxInfo
			c.ok("sandbox_create", obj{"memory_mb": 256, "env": obj{"POOL_TOOL_ENV": "yes"}}, &sb)
			if !sb.FromPool {
				t.Fatalf("sandbox_create of the pool's shape: %+v; want from_pool", sb)
			}
			var ex mcpserver.ExecOut
			c.ok("exec", obj{"sandbox_id": sb.SandboxID, "command": []string{"sh", "-c", "echo $POOL_TOOL_ENV"}}, &ex)
			if ex.Stdout != "yes\n" {
				t.Fatalf("exec in the claimed sandbox: %q", ex.Stdout)
			}
			var cold mcpserver.SandboxInfo
			c.ok("sandbox_create", nil, &cold)
			if cold.FromPool {
				t.Fatal("a create of another shape was claimed from the pool")
			}
			var list mcpserver.SandboxList
			c.ok("sandbox_list", nil, &list)
			if list.Count != 2 {
				t.Fatalf("sandbox_list shows %d sandboxes; want the caller's 2 (pooled ones hidden)", list.Count)
			}
			var h mcpserver.HealthOut
			c.ok("health", nil, &h)
			if len(h.Capacity.Pools) != 1 || h.Capacity.Pools[0].Hits != 1 || h.Capacity.Pools[0].Size != 2 || h.Capacity.MaxPooled == 0 {
				t.Fatalf("health's capacity.pools: %+v", h.Capacity)
			}
			var del mcpserver.PoolDeleteOut
			c.ok("pool_delete", obj{"name": "py"}, &del)
			c.ok("pool_list", nil, &l)
			if l.Count != 0 || !del.Deleted {
				t.Fatalf("after pool_delete: %+v", l)
			}
		})
	}
}
