package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/wire"
)

// benchMetrics measures GET /metrics with live runc sandboxes (topping the live ones up to
// live; the ones it creates are destroyed at the end) and the exec round trip on execID while
// /metrics is scraped every second and while it is not, in alternating 3 s phases.
func benchMetrics(ctx context.Context, c *client.Client, base, token, execID string, live, scrapes int) []Stat {
	have, err := c.List(ctx, []string{"running"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	var made []string
	defer func() {
		for _, id := range made {
			c.Destroy(ctx, id)
		}
	}()
	// Creates in parallel (4 at a time) to reach the live count sooner.
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := len(have); i < live; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			sb, err := c.Create(ctx, wire.CreateRequest{Runtime: "runc"})
			if err != nil {
				log.Fatalf("metrics bench: create: %v", err)
			}
			mu.Lock()
			made = append(made, sb.ID)
			mu.Unlock()
		}()
	}
	wg.Wait()
	n := len(have) + len(made)
	scrape := func() time.Duration {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		t0 := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			log.Fatalf("GET /metrics: %s", resp.Status)
		}
		return time.Since(t0)
	}
	scrape() // the first sample of each sandbox
	var took, cpu []float64
	for i := 0; i < scrapes; i++ {
		before := cpuTime()
		took = append(took, ms(scrape()))
		cpu = append(cpu, ms(cpuTime()-before))
		time.Sleep(100 * time.Millisecond)
	}
	trueCmd := wire.ExecRequest{Command: []string{"true"}}
	var quiet, scraped []float64
	for round := 0; round < 5; round++ {
		for _, withScrape := range []bool{false, true} {
			pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			done := make(chan struct{})
			if withScrape {
				go func() {
					defer close(done)
					for {
						scrape()
						select {
						case <-pctx.Done():
							return
						case <-time.After(time.Second):
						}
					}
				}()
			} else {
				close(done)
			}
			for pctx.Err() == nil {
				t0 := time.Now()
				if _, err := c.Exec(ctx, execID, trueCmd, nil); err != nil {
					log.Fatal(err)
				}
				if withScrape {
					scraped = append(scraped, ms(time.Since(t0)))
				} else {
					quiet = append(quiet, ms(time.Since(t0)))
				}
			}
			cancel()
			<-done
		}
	}
	return []Stat{
		summarize(fmt.Sprintf("GET /metrics with %d live sandboxes", n), "ms", took),
		summarize(fmt.Sprintf("GET /metrics with %d live sandboxes, CPU time (server and client)", n), "ms", cpu),
		summarize("exec round trip, /metrics not scraped", "ms", quiet),
		summarize("exec round trip, /metrics scraped every 1 s", "ms", scraped),
	}
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
