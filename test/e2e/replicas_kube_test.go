//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/lease"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/kubelab"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
	"github.com/agentbox/agentbox/internal/wire"
)

// leaseHeld reads GET /health's replica.held of s.
func leaseHeld(t *testing.T, s *server) bool {
	t.Helper()
	resp, err := http.Get(s.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct {
		Replica *lease.Status `json:"replica"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h.Replica == nil {
		t.Fatalf("/health: %v %+v", err, h)
	}
	return h.Replica.Held
}

// TestKubeReplicas: two `agentbox serve` processes on one Postgres and one cluster
// namespace. Exactly one holds the lifecycle lease; 12 creates spread over both at once never
// exceed the live bound of 4 (the rest CAPACITY_UNAVAILABLE; 4 pods); a watcher on B sees A's
// creates and destroys within a second; then the holder is
// SIGKILLed right after making a sandbox with a short TTL: the other takes the lease over
// within the lease TTL and destroys the sandbox (and its pod) once it expires.
func TestKubeReplicas(t *testing.T) {
	lab, ns, _ := kubeServer(t)
	kc := os.Getenv(kubelab.EnvKubeconfig)
	ctx := context.Background()
	pg, err := pglab.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	dsn, err := pg.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const leaseTTL = 3 * time.Second
	args := []string{"--runtime", "kubernetes", "--kube-config", kc, "--kube-namespace", ns,
		"--kube-guest-image", lab.GuestImage, "--kube-host-image", lab.HostImage,
		"--store", dsn, "--max-sandboxes", "4", "--lease-ttl", leaseTTL.String()}
	a := startServer(t, testenv.ShortTempDir(t, "abrepa"), args...)
	b := startServer(t, testenv.ShortTempDir(t, "abrepb"), args...)
	if ha, hb := leaseHeld(t, a), leaseHeld(t, b); ha == hb {
		t.Fatalf("lease held: A %v, B %v; want exactly one\nA:\n%s\nB:\n%s", ha, hb, a.Logs, b.Logs)
	}
	holder, other := a, b
	if !leaseHeld(t, a) {
		holder, other = b, a
	}

	// Admission across the replicas.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok []string
	refused := 0
	for i := range 12 {
		wg.Go(func() {
			sb, err := []*server{a, b}[i%2].client().Create(ctx, wire.CreateRequest{CPU: 0.1, MemoryMB: 64, TTLSeconds: 600})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok = append(ok, sb.ID)
			case errcode.Of(err) == errcode.CapacityUnavailable:
				refused++
			default:
				t.Errorf("create %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if len(ok) != 4 || refused != 8 {
		t.Fatalf("%d admitted, %d refused for capacity; want 4 and 8\nA:\n%s\nB:\n%s", len(ok), refused, a.Logs, b.Logs)
	}
	pods, err := lab.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelRuntime})
	if err != nil || len(pods.Items) != 4 {
		t.Fatalf("pods after the creates: %v, %d; want 4", err, len(pods.Items))
	}
	for _, id := range ok {
		if _, err := other.client().Destroy(ctx, id); err != nil {
			t.Fatalf("destroy %s: %v\nA:\n%s\nB:\n%s", id, err, a.Logs, b.Logs)
		}
	}

	// A watcher on B (the REST long poll of GET /v1/events) sees A's create and destroy at
	// once (Postgres NOTIFY), not at B's 2-second recheck.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	evs := subscribeEvents(wctx, b.URL)
	await := func(id string, to sandbox.State) time.Duration {
		t.Helper()
		start := time.Now()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case ev := <-evs:
				if ev.SandboxID == id && ev.To == to {
					return time.Since(start)
				}
			case <-timeout:
				t.Fatalf("B's watcher did not see %s become %s", id, to)
			}
		}
	}
	for i := range 3 {
		sb, err := a.client().Create(ctx, wire.CreateRequest{CPU: 0.1, MemoryMB: 64, TTLSeconds: 600})
		if err != nil {
			t.Fatal(err)
		}
		dc := await(sb.ID, sandbox.StateRunning)
		time.Sleep(time.Duration(300+200*i) * time.Millisecond)
		if _, err := a.client().Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		dd := await(sb.ID, sandbox.StateDestroyed)
		t.Logf("B's watcher saw A's create %v and its destroy %v after A's call returned", dc.Round(time.Millisecond), dd.Round(time.Millisecond))
		if max(dc, dd) > time.Second {
			t.Errorf("B's watcher saw A's events up to %v late; want well under its 2 s recheck", max(dc, dd))
		}
	}
	wcancel()

	// The holder dies right after making a sandbox with a short TTL.
	sb, err := holder.client().Create(ctx, wire.CreateRequest{CPU: 0.1, MemoryMB: 64, TTLSeconds: 5})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, holder.Logs)
	}
	holder.kill()
	killed := time.Now()
	for !leaseHeld(t, other) {
		if time.Since(killed) > leaseTTL+2*time.Second {
			t.Fatalf("the other replica did not take the lease within %v of the holder's SIGKILL\n%s", leaseTTL, other.Logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(killed)
	c := other.client()
	deadline := sb.ExpiresAt.Add(leaseTTL + 10*time.Second)
	for {
		got, err := c.Get(ctx, sb.ID)
		if err == nil && got.State == wire.StateDestroyed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead holder's sandbox %s was not destroyed by %v (expired %v): %+v %v\n%s", sb.ID, deadline, sb.ExpiresAt, got, err, other.Logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	reaped := time.Now()
	waitPodGone(t, lab, ns, sb.ID)
	t.Logf("lease taken over %v after the SIGKILL (lease TTL %v); the dead holder's sandbox destroyed %v after its expiry",
		took.Round(time.Millisecond), leaseTTL, reaped.Sub(sb.ExpiresAt).Round(time.Millisecond))
}

// subscribeEvents long-polls GET /v1/events?after=N&wait=25s on the server at url, delivering
// every event in order until ctx ends (then the channel closes); a failed poll is retried from
// the last event delivered.
func subscribeEvents(ctx context.Context, url string) <-chan sandbox.Event {
	out := make(chan sandbox.Event, 64)
	go func() {
		defer close(out)
		var cursor int64
		for ctx.Err() == nil {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/events?after=%d&wait=25s", url, cursor), nil)
			if err != nil {
				return
			}
			req.Header.Set("Authorization", "Bearer "+token)
			var l struct {
				Events []sandbox.Event `json:"events"`
			}
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("GET /v1/events: %s", resp.Status)
				} else {
					err = json.NewDecoder(resp.Body).Decode(&l)
				}
				resp.Body.Close()
			}
			if err != nil {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				continue
			}
			for _, ev := range l.Events {
				select {
				case out <- ev:
					cursor = ev.Seq
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}
