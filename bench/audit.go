package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// The audit figure: what the audit log adds to an MCP call. Two servers over the same
// service and store, one with the audit recorder as its gate and one without, take turns
// call by call (health, and exec of `true` in a warm runc sandbox), so that the host's noise
// falls on both alike; the difference of the p50s is the figure (≤ 0.2 ms).

type auditFlags struct {
	only  *bool
	calls *int
}

func auditBenchFlags() auditFlags {
	return auditFlags{
		only:  flag.Bool("audit-only", false, "measure only the audit log's overhead (writes -out only if it is not the default bench/results.json; make bench-audit writes bench/results-audit.json)"),
		calls: flag.Int("audit-calls", 2000, "MCP calls per tool and per server (audit on, audit off) for the audit figure"),
	}
}

// Names of the audit figures.
const (
	measureAuditHealth = "MCP health round trip"
	measureAuditExec   = "MCP exec of `true` round trip"
	measureAuditAdds   = "audit log adds to an MCP call (p50 on − p50 off)"
)

// auditServer serves svc's REST API and /mcp on loopback with gates; it returns the /mcp URL.
func auditServer(svc jobs.Sandboxes, token string, gates gate.Chain, st *sqlite.Store) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	m := mcpserver.New(svc, mcpserver.Options{Gate: gates})
	h := api.New(svc.Service, api.Options{Token: token, Gate: gates, Audit: st, SandboxJobs: svc.Jobs(),
		Mount: map[string]http.Handler{"/mcp": m.StreamableHTTPHandler(mcpserver.HTTPOptions{MaxBodyBytes: api.MaxJSONBody})}})
	hs := &http.Server{Handler: h}
	go hs.Serve(ln)
	return "http://" + ln.Addr().String() + "/mcp", func() { hs.Close(); m.Close(); h.Close() }
}

// timedGate times what its gate takes of a call: Enter and exit together.
type timedGate struct {
	g  gate.Gate
	mu sync.Mutex
	xs map[string][]float64 // by tool
}

func (t *timedGate) Enter(ctx context.Context, c *gate.Call) (func(error), error) {
	t0 := time.Now()
	exit, err := t.g.Enter(ctx, c)
	in := time.Since(t0)
	if err != nil {
		return nil, err
	}
	return func(outcome error) {
		t1 := time.Now()
		exit(outcome)
		d := in + time.Since(t1)
		t.mu.Lock()
		t.xs[c.Tool] = append(t.xs[c.Tool], float64(d.Nanoseconds())/1e6)
		t.mu.Unlock()
	}, nil
}

func benchAudit(ctx context.Context, svc *sandbox.Service, st *sqlite.Store, token, sandboxID string, n int) []Stat {
	rec := audit.New(st, audit.Config{}, nil)
	defer rec.Close()
	timed := &timedGate{g: rec, xs: map[string][]float64{}}
	sbs := jobs.With(svc)
	offURL, stopOff := auditServer(sbs, token, nil, st)
	defer stopOff()
	onURL, stopOn := auditServer(sbs, token, gate.Chain{timed}, st)
	defer stopOn()
	off, on := mcpSession(ctx, offURL, token), mcpSession(ctx, onURL, token)
	defer off.Close()
	defer on.Close()
	var stats []Stat
	for _, tc := range []struct {
		name string
		tool string
		args map[string]any
	}{
		{measureAuditHealth, "health", nil},
		{measureAuditExec, "exec", map[string]any{"sandbox_id": sandboxID, "command": []string{"true"}}},
	} {
		for range 50 { // warm both
			callTool(ctx, off, tc.tool, tc.args)
			callTool(ctx, on, tc.tool, tc.args)
		}
		var xsOff, xsOn []float64
		for i := range n {
			first, second, a, b := off, on, &xsOff, &xsOn
			if i%2 == 1 {
				first, second, a, b = on, off, &xsOn, &xsOff
			}
			t0 := time.Now()
			callTool(ctx, first, tc.tool, tc.args)
			*a = append(*a, ms(time.Since(t0)))
			t0 = time.Now()
			callTool(ctx, second, tc.tool, tc.args)
			*b = append(*b, ms(time.Since(t0)))
		}
		sOff, sOn := summarize(tc.name+", audit off", "ms", xsOff), summarize(tc.name+", audit on", "ms", xsOn)
		d := Stat{Name: measureAuditAdds + ": " + tc.tool, Unit: "ms", N: n, P50: sOn.P50 - sOff.P50, P99: sOn.P99 - sOff.P99,
			Mean: sOn.Mean - sOff.Mean, Floor: "≤ 0.5 ms p50"}
		timed.mu.Lock()
		own := summarize(fmt.Sprintf("audit gate's own time in an MCP %s call (Enter + exit)", tc.tool), "ms", timed.xs[tc.tool])
		timed.mu.Unlock()
		stats = append(stats, sOff, sOn, d, own)
	}
	if err := rec.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	if d := rec.Dropped(); d > 0 {
		log.Printf("audit bench: %d records dropped", d)
	}
	got, _, err := st.ListAudit(ctx, audit.Filter{Tool: "health", Limit: 1})
	if err != nil || len(got) == 0 {
		log.Fatalf("audit bench: no health records written (%v)", err)
	}
	fmt.Printf("audit bench: %d records dropped; newest health record seq %d\n", rec.Dropped(), got[0].Seq)
	return stats
}
