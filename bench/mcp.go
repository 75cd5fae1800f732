package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// bearer adds the token to every request of an MCP client.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// mcpSession connects the Go SDK's client to url over streamable HTTP.
func mcpSession(ctx context.Context, url, token string) *mcp.ClientSession {
	hc := &http.Client{Transport: bearer{token, http.DefaultTransport}}
	cl := mcp.NewClient(&mcp.Implementation{Name: "agentbox-bench", Version: "1"}, nil)
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		log.Fatalf("mcp connect: %v", err)
	}
	return cs
}

func callTool(ctx context.Context, cs *mcp.ClientSession, name string, args map[string]any) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		log.Fatalf("mcp %s: %v", name, err)
	}
	if res.IsError {
		log.Fatalf("mcp %s: tool error: %+v", name, res.Content)
	}
}

// benchMCP measures MCP round trips over streamable HTTP: health and exec of `true` in a live
// sandbox (p50, p99), and health calls per second with 8 concurrent sessions.
func benchMCP(ctx context.Context, url, token, sandboxID string, n int) []Stat {
	cs := mcpSession(ctx, url, token)
	defer cs.Close()
	time1 := func(name string, args map[string]any) []float64 {
		var xs []float64
		for i := 0; i < n; i++ {
			t0 := time.Now()
			callTool(ctx, cs, name, args)
			xs = append(xs, ms(time.Since(t0)))
		}
		return xs
	}
	health := summarize("MCP health round trip (streamable HTTP)", "ms", time1("health", nil))
	exec := summarize("MCP exec of `true` round trip (streamable HTTP)", "ms",
		time1("exec", map[string]any{"sandbox_id": sandboxID, "command": []string{"true"}}))

	const sessions = 8
	const window = 3 * time.Second
	var calls atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(window)
	for i := 0; i < sessions; i++ {
		s := mcpSession(ctx, url, token)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Close()
			for time.Now().Before(deadline) {
				callTool(ctx, s, "health", nil)
				calls.Add(1)
			}
		}()
	}
	wg.Wait()
	rate := float64(calls.Load()) / window.Seconds()
	tput := Stat{Name: fmt.Sprintf("MCP health calls per second, %d sessions", sessions), Unit: "calls/s", N: int(calls.Load()), P50: rate, P99: rate, Mean: rate}
	return []Stat{health, exec, tput}
}
