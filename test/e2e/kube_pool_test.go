//go:build linux

package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentbox/agentbox/internal/runtime/kubernetes"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestKubePool: a warm pool on the kubernetes runtime holds pre-created pods; a create of the
// pool's shape claims one (from_pool, the same pod, the claimant's command runs in it), and the
// pool refills with a new pod.
func TestKubePool(t *testing.T) {
	lab, ns, start := kubeServer(t)
	s := start(testenv.ShortTempDir(t, "abkubepool"))
	ctx := context.Background()
	c := s.client()
	shape := wire.Pool{Name: "kp", Image: "host", Runtime: kubernetes.NameProcess, CPU: 0.25, MemoryMB: 128, DiskMB: 256, Size: 2}
	if _, err := c.SetPool(ctx, shape); err != nil {
		t.Fatalf("pool_set: %v\n%s", err, s.Logs)
	}
	ready := func(want int) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			l, err := c.ListPools(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Pools) == 1 && l.Pools[0].Ready >= want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool not %d ready within 90 s: %+v\n%s", want, l.Pools, s.Logs)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	ready(2)
	pods, err := lab.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 2 {
		t.Fatalf("pods of a pool of 2: %v %d", err, len(pods.Items))
	}
	pooled := map[string]bool{}
	for _, p := range pods.Items {
		pooled[p.Name] = true
	}
	t0 := time.Now()
	sb, err := c.Create(ctx, wire.CreateRequest{Image: "host", Runtime: kubernetes.NameProcess, CPU: 0.25, MemoryMB: 128, DiskMB: 256})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	claim := time.Since(t0)
	if !sb.FromPool || !pooled[sb.ID] || sb.State != wire.StateRunning {
		t.Fatalf("create of the pool's shape: from_pool %v, id %s (pooled pods %v), state %s", sb.FromPool, sb.ID, pooled, sb.State)
	}
	res, err := c.Exec(ctx, sb.ID, apiExec("sh", "-c", "echo claimed > /workspace/c && cat /workspace/c"), nil)
	if err != nil || res.ExitCode != 0 || res.Stdout != "claimed\n" {
		t.Fatalf("exec in the claimed sandbox: %+v %v", res, err)
	}
	t.Logf("claimed pooled pod %s in %v", sb.ID, claim.Round(time.Millisecond))
	ready(2) // refilled: a new pod
	l, err := c.ListPools(ctx)
	if err != nil || l.Pools[0].Hits != 1 {
		t.Fatalf("pool after a claim: %+v %v", l.Pools, err)
	}
	if _, err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeletePool(ctx, "kp"); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, lab, ns, sb.ID)
}
