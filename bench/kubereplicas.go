package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes/kubetest"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/postgres"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
	"github.com/agentbox/agentbox/internal/wire"
)

// Several replicas: n creates (REST create → running, the call's whole latency)
// spread over two replicas — two sandbox services, each with its own Postgres connections, its
// own kubernetes runtime and its own REST server, on one Postgres (pglab) and one namespace,
// sharing the node kube:<namespace> — next to the same n creates on one replica, in the same
// run. conc creates are in flight at once; each sandbox is destroyed once made (createRound).

const (
	measureReplicasCreate     = "create → running, %d creates, %d in flight, ≤16 alive (REST)"
	measureReplicasThroughput = "throughput of %d creates, %d in flight"
)

// replica is one in-process agentbox server of the bench.
type replica struct {
	svc   *sandbox.Service
	c     *client.Client
	close func()
}

func newReplica(ctx context.Context, lab *kubetest.Lab, ns, dsn string, maxSandboxes int) (*replica, error) {
	st, err := postgres.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	rt, err := lab.Runtime(ctx, ns, runtime.IsolationProcess, "runc")
	if err != nil {
		st.Close()
		return nil, err
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{Node: "kube:" + ns, Shared: true, DefaultRuntime: rt.Name(),
		MaxSandboxes: maxSandboxes}, nil)
	if err != nil {
		st.Close()
		return nil, err
	}
	const token = "bench-token-0123456789abcdef"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		svc.Close()
		st.Close()
		return nil, err
	}
	hs := &http.Server{Handler: api.New(svc, api.Options{Token: token})}
	go hs.Serve(ln)
	return &replica{svc: svc, c: client.New("http://"+ln.Addr().String(), token), close: func() {
		hs.Close()
		svc.Close()
		rt.Close(context.Background())
		st.Close()
	}}, nil
}

// createRound creates n sandboxes through reps in turn, conc at a time, and returns each
// create's latency in ms and the round's creates per second. Each sandbox is destroyed as soon as
// it is made (not timed; off the creating worker), and at most maxLive are alive at once: a
// single-node test cluster of 2 cores has room for a few dozen pods, not n.
func createRound(ctx context.Context, reps []*replica, n, conc, maxLive int, shape wire.CreateRequest) ([]float64, float64) {
	lat := make([]float64, n)
	next := make(chan int)
	live := make(chan struct{}, maxLive)
	var wg, dwg sync.WaitGroup
	t0 := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				live <- struct{}{}
				rep := reps[i%len(reps)]
				t := time.Now()
				sb, err := rep.c.Create(ctx, shape)
				if err != nil {
					log.Fatalf("replicas: create %d: %v", i, err)
				}
				lat[i] = ms(time.Since(t))
				dwg.Add(1)
				go func() {
					defer func() { <-live; dwg.Done() }()
					if _, err := rep.c.Destroy(ctx, sb.ID); err != nil {
						log.Printf("replicas: destroy %s: %v", sb.ID, err)
					}
				}()
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	wall := time.Since(t0)
	dwg.Wait()
	return lat, float64(n) / wall.Seconds()
}

// runKubeReplicasBench measures n creates on one replica, then over two, on namespace ns.
func runKubeReplicasBench(ctx context.Context, lab *kubetest.Lab, ns string, n, conc int) []Stat {
	pg, err := pglab.Start(ctx)
	if err != nil {
		log.Fatalf("replicas: start Postgres: %v", err)
	}
	defer pg.Stop()
	dsn, err := pg.CreateDatabase(ctx)
	if err != nil {
		log.Fatal(err)
	}
	reps := make([]*replica, 2)
	for i := range reps {
		if reps[i], err = newReplica(ctx, lab, ns, dsn, n); err != nil {
			log.Fatalf("replicas: replica %d: %v", i, err)
		}
		defer reps[i].close()
	}
	// maxLive of these fit the one node's 2 cores (cpu is the pods' request and limit).
	const maxLive = 16
	shape := wire.CreateRequest{Runtime: "kubernetes", CPU: 0.1, MemoryMB: 128, DiskMB: 64}
	var stats []Stat
	for _, round := range []struct {
		reps  []*replica
		label string
	}{{reps[:1], "one replica (floor)"}, {reps, "two replicas"}} {
		lat, rate := createRound(ctx, round.reps, n, conc, maxLive, shape)
		s := summarize(fmt.Sprintf(measureReplicasCreate, n, conc), "ms", lat)
		s.Runtime = "kubernetes, " + round.label
		s.Floor = "the same creates on one replica, same run"
		t := summarize(fmt.Sprintf(measureReplicasThroughput, n, conc), "creates/s", []float64{rate})
		t.Runtime = "kubernetes, " + round.label
		t.Floor = s.Floor
		stats = append(stats, s, t)
		log.Printf("replicas: %s: %d creates, p50 %.0f ms, p99 %.0f ms, %.2f creates/s", round.label, n, s.P50, s.P99, rate)
	}
	return stats
}
