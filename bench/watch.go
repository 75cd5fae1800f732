package main

import (
	"context"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/wire"
)

// benchWatch measures event → watcher delivery: extend a sandbox n times and time each from the
// extend call's return to its event's arrival over SSE (GET …/watch?stream=events) and as an MCP
// notifications/progress of the watch tool (streamable HTTP). An event that arrives before the
// call returns counts as 0.
func benchWatch(ctx context.Context, c *client.Client, mcpURL, token, sandboxID string, n int) []Stat {
	// extendAndTime returns, per event, the time from the extend's return to the message (0
	// when the message came first) and from the extend's start (the call's own round trip
	// included).
	extendAndTime := func(arrivals <-chan time.Time) (fromReturn, fromStart []float64) {
		for i := 0; i < n; i++ {
			start := time.Now()
			if _, err := c.Extend(ctx, sandboxID, int64(1800+i%60)); err != nil {
				log.Fatalf("watch bench: extend: %v", err)
			}
			returned := time.Now()
			select {
			case at := <-arrivals:
				fromReturn = append(fromReturn, ms(max(0, at.Sub(returned))))
				fromStart = append(fromStart, ms(at.Sub(start)))
			case <-time.After(10 * time.Second):
				log.Fatalf("watch bench: event %d not delivered in 10 s", i)
			}
		}
		return fromReturn, fromStart
	}

	// SSE.
	wctx, stop := context.WithCancel(ctx)
	arrivals := make(chan time.Time, n)
	opened := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Watch(wctx, sandboxID, client.WatchOptions{Stream: "events", DurationSeconds: 3600, OnOpen: func() { close(opened) }}, func(m wire.WatchMessage) error {
			if m.Kind == wire.WatchEvent {
				arrivals <- time.Now()
			}
			return nil
		})
	}()
	<-opened
	sse, sseStart := extendAndTime(arrivals)
	stop()
	<-done

	// MCP progress.
	progress := make(chan time.Time, n+8)
	hc := &http.Client{Transport: bearer{token, http.DefaultTransport}}
	cl := mcp.NewClient(&mcp.Implementation{Name: "agentbox-bench", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			if strings.Contains(r.Params.Message, " event ") {
				progress <- time.Now()
			}
		},
	})
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: mcpURL, HTTPClient: hc}, nil)
	if err != nil {
		log.Fatalf("mcp connect: %v", err)
	}
	defer cs.Close()
	mctx, mstop := context.WithCancel(ctx)
	called := make(chan struct{})
	go func() {
		defer close(called)
		p := &mcp.CallToolParams{Name: "watch", Arguments: map[string]any{"sandbox_id": sandboxID, "stream": "events", "duration_seconds": 3600}}
		p.SetProgressToken("bench")
		cs.CallTool(mctx, p)
	}()
	time.Sleep(300 * time.Millisecond) // the call is in flight and its watch registered
	mcpx, mcpStart := extendAndTime(progress)
	mstop()
	<-called

	return []Stat{
		summarize("event → SSE delivery (extend returns → message)", "ms", sse),
		summarize("event → MCP progress delivery (watch tool)", "ms", mcpx),
		summarize("extend call start → SSE message", "ms", sseStart),
		summarize("extend call start → MCP progress", "ms", mcpStart),
	}
}
