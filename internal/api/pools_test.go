package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/testenv/fakecp"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestPoolsREST: /v1/pools through the Go client, a claim over POST /v1/sandboxes (from_pool
// in the reply), capacity's pools, and the pool series on /metrics.
func TestPoolsREST(t *testing.T) {
	svc := fakecp.Service(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	prom := api.NewPrometheus()
	const token = "pools-test-token"
	h := api.New(svc, api.Options{Token: token, Prometheus: prom})
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Close(); h.Close() })
	c := client.New(srv.URL, token)

	// Validation: size required, bad name, unknown pool.
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v1/pools/p", strings.NewReader(`{"image":"host"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("PUT without size: %s", resp.Status)
	}
	if _, err := c.SetPool(t.Context(), wire.Pool{Name: "UPPER", Size: 1}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	if err := c.DeletePool(t.Context(), "nope"); !errcode.Is(err, errcode.PoolNotFound) {
		t.Fatalf("delete unknown: %v", err)
	}

	st, err := c.SetPool(t.Context(), wire.Pool{Name: "p", Size: 1})
	if err != nil || st.Size != 1 || st.Image != "host" {
		t.Fatalf("SetPool: %+v %v", st, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, err := c.ListPools(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if l.Count == 1 && l.Pools[0].Ready == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", l)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sb, err := c.Create(t.Context(), wire.CreateRequest{Env: map[string]string{"V": "1"}})
	if err != nil || !sb.FromPool || sb.Pool != "" {
		t.Fatalf("create: %+v %v; want from_pool", sb, err)
	}
	list, err := c.List(t.Context(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range list {
		if x.Pool != "" {
			t.Fatalf("GET /v1/sandboxes lists pooled sandbox %s", x.ID)
		}
	}
	cp, err := c.Capacity(t.Context())
	if err != nil || len(cp.Pools) != 1 || cp.Pools[0].Hits != 1 || cp.MaxPooled == 0 {
		t.Fatalf("capacity: %+v %v", cp, err)
	}
	fams := scrape(t, srv.URL, token)
	for name, want := range map[string]float64{"agentbox_pool_hits_total": 1, "agentbox_pool_misses_total": 0, "agentbox_pool_size": 1} {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 || labelsOf(f.GetMetric()[0])["pool"] != "p" {
			t.Fatalf("%s: %v", name, f)
		}
		m := f.GetMetric()[0]
		if got := m.GetCounter().GetValue() + m.GetGauge().GetValue(); got != want {
			t.Errorf("%s = %g, want %g", name, got, want)
		}
	}
	if fams["agentbox_pool_ready"] == nil {
		t.Error("no agentbox_pool_ready")
	}
	if err := c.DeletePool(t.Context(), "p"); err != nil {
		t.Fatal(err)
	}
}
