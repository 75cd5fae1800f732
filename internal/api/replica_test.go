package api_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/lease"
)

// Several replicas: GET /health says which replica answered and whether it holds
// its node's lifecycle lease (the reply fits the OpenAPI document), and /metrics has the gauge.
func TestHealthAndMetricsReportTheLease(t *testing.T) {
	var held atomic.Bool
	prom := api.NewPrometheus()
	srv := httptest.NewServer(api.New(nil, api.Options{Token: "s3cret", Prometheus: prom,
		Lease: func() lease.Status {
			return lease.Status{Replica: "host-0a1b2c3d", Lease: "lifecycle:kube:ns", Held: held.Load()}
		}}))
	t.Cleanup(srv.Close)
	get := func(path string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer s3cret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	v := newDocValidator(t)
	for _, h := range []bool{false, true} {
		held.Store(h)
		prom.ObserveLease(h)
		body := get("/health")
		v.validate(t, "GET", "/health", 200, []byte(body))
		want := `"replica":{"replica":"host-0a1b2c3d","lease":"lifecycle:kube:ns","held":false}`
		gauge := "agentbox_lifecycle_lease_held 0"
		if h {
			want = strings.Replace(want, "false", "true", 1)
			gauge = "agentbox_lifecycle_lease_held 1"
		}
		if !strings.Contains(body, want) {
			t.Errorf("/health = %s; want it to contain %s", body, want)
		}
		if m := get("/metrics"); !strings.Contains(m, gauge) {
			t.Errorf("/metrics lacks %q", gauge)
		}
	}
}
