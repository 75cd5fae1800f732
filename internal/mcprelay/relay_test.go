package mcprelay_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/mcprelay"
)

// relayed starts an SDK server behind the streamable HTTP handler, relays an in-memory client
// transport to it and returns the client's end; the relay's result arrives on done.
func relayed(t *testing.T, srv *mcp.Server) (mcp.Transport, <-chan error) {
	t.Helper()
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	ct, st := mcp.NewInMemoryTransports()
	done := make(chan error, 1)
	go func() { done <- mcprelay.Run(context.Background(), st, mcprelay.Options{Endpoint: hs.URL}) }()
	return ct, done
}

type input struct {
	N int `json:"n"`
}

type output struct {
	Said string `json:"said"`
}

// TestRelay: a server's elicitation during a call reaches the client and its answer goes back; a
// cancelled call is cancelled on the server; the client's end closes the server session and ends
// the relay with no error.
func TestRelay(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "s", Version: "1"}, nil)
	var cancelled atomic.Bool
	started := make(chan struct{}, 1)
	mcp.AddTool(srv, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, _ input) (*mcp.CallToolResult, output, error) {
		res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "go on?", RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}}})
		if err != nil {
			return nil, output{}, err
		}
		return nil, output{Said: res.Action}, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "hang"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ input) (*mcp.CallToolResult, output, error) {
		started <- struct{}{}
		<-ctx.Done()
		cancelled.Store(true)
		return nil, output{}, ctx.Err()
	})
	sessionEnded := make(chan struct{})
	ct, done := relayed(t, srv)

	c := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
		},
	})
	ctx := context.Background()
	cs, err := c.Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	var ss *mcp.ServerSession
	for s := range srv.Sessions() {
		ss = s
	}
	if ss == nil {
		t.Fatal("no server session")
	}
	go func() { ss.Wait(); close(sessionEnded) }()

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "ask", Arguments: input{}})
	if err != nil || res.IsError {
		t.Fatalf("ask: %v %+v", err, res)
	}
	if m, _ := res.StructuredContent.(map[string]any); m["said"] != "accept" {
		t.Fatalf("the elicitation's answer: %+v", res.StructuredContent)
	}

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "hang", Arguments: input{}})
		errc <- err
	}()
	<-started
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled call: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); !cancelled.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server's handler was not cancelled")
		}
	}
	// The session goes on after a cancellation.
	if err := cs.Ping(ctx, nil); err != nil {
		t.Fatalf("ping after the cancellation: %v", err)
	}

	cs.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("relay: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not end with its client")
	}
	select {
	case <-sessionEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the server session is still open")
	}
}
