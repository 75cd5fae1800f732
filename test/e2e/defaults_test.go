package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestDefaultsHoldTheLiveBound: a server with its default admission (no budget flags) on this
// 2-core host takes the whole live bound (200) of default sandboxes — 1 core, 512 MiB, 1 GiB of
// disk each, 200 cores and 100 GiB of limits — each answering exec, and refuses the 201st for
// the bound, not for a budget. (Summed ceilings refused the ninth before.)
func TestDefaultsHoldTheLiveBound(t *testing.T) {
	testenv.RequireRoot(t)
	if testing.Short() {
		t.Skip("creates 200 real sandboxes")
	}
	dir := testenv.ShortTempDir(t, "abe2e")
	s := startServer(t, dir)
	c := s.client()
	ctx := context.Background()
	ids := make(chan string, 200)
	errs := make(chan error, 200)
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				sb, err := c.Create(ctx, wire.CreateRequest{})
				if err != nil {
					errs <- fmt.Errorf("default sandbox %d: %w", i, err)
					continue
				}
				ids <- sb.ID
				res, err := c.Exec(ctx, sb.ID, apiExec("echo", "ok"), nil)
				if err != nil || res.Stdout != "ok\n" {
					errs <- fmt.Errorf("exec in %s: %+v %v", sb.ID, res, err)
				}
			}
		}()
	}
	for i := range 200 {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	close(ids)
	for err := range errs {
		t.Fatal(err)
	}
	_, err := c.Create(ctx, wire.CreateRequest{})
	if errcode.Of(err) != errcode.CapacityUnavailable {
		t.Fatalf("201st default sandbox: %v, want CAPACITY_UNAVAILABLE", err)
	}
	if e, ok := errcode.As(err); !ok || e.Details["max_sandboxes"] == nil {
		t.Fatalf("201st refused for another reason than the live bound: %v", err)
	}
	var all []string
	for id := range ids {
		all = append(all, id)
	}
	var dwg sync.WaitGroup
	sem := make(chan struct{}, 6)
	for _, id := range all {
		dwg.Add(1)
		sem <- struct{}{}
		go func() {
			defer dwg.Done()
			defer func() { <-sem }()
			if _, err := c.Destroy(ctx, id); err != nil {
				t.Errorf("destroy %s: %v", id, err)
			}
		}()
	}
	dwg.Wait()
	s.stop()
	assertHostClean(t, dir, all)
}
