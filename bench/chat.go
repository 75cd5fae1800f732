package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	goruntime "runtime"
	"sort"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/chat"
	"github.com/agentbox/agentbox/internal/testenv/modelfake"
	"github.com/agentbox/agentbox/internal/wire"
)

// The chat loop's own overhead per step: the scripted model server (internal/testenv/
// modelfake, on loopback, streaming) answers at once and the tool (an in-process MCP server
// over the SDK's in-memory transport) returns at once, so a step's wall time — the model call
// (request built, SSE read and accumulated), the tool call, both recorded — is the loop's
// overhead plus two loopback round trips: an upper bound of it. p50 ≤ 5 ms.

type chatBenchFlags struct {
	only  *bool
	steps *int
}

func chatFlags() chatBenchFlags {
	return chatBenchFlags{
		only:  flag.Bool("chat-only", false, "measure only the chat loop's overhead per step (no sandboxes, no root; make bench-chat writes bench/results-chat.json)"),
		steps: flag.Int("chat-steps", 500, "timed steps of the chat loop"),
	}
}

const measureChatStep = "agentbox chat: one step (model call + tool call), instant model and tool"

// stepClock records when each tool call starts: the time between two is one step.
type stepClock struct{ starts []time.Time }

func (c *stepClock) Token(string)                                {}
func (c *stepClock) ToolStart(wire.ChatToolCall)                 { c.starts = append(c.starts, time.Now()) }
func (c *stepClock) ToolEnd(wire.ChatToolCall, wire.ChatMessage) {}

type nopRecorder struct{}

func (nopRecorder) Create(_ context.Context, c wire.ConversationCreate) (wire.Conversation, error) {
	return wire.Conversation{ID: "bench", Title: c.Title}, nil
}
func (nopRecorder) Append(context.Context, string, []wire.ChatMessage) error { return nil }
func (nopRecorder) SetSandbox(context.Context, string, string) error         { return nil }

func runChatBench(ctx context.Context, f chatBenchFlags, out string) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "run_python"}, func(ctx context.Context, _ *mcp.CallToolRequest, in struct {
		Code string `json:"code"`
	}) (*mcp.CallToolResult, map[string]any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "42\n"}}}, nil, nil
	})
	model := modelfake.New()
	defer model.Close()
	// Questions of perQuestion steps each (the default --max-steps is 20), each in a
	// conversation of its own, until n steps are timed: the history a step sends stays the size
	// a real question's does.
	const perQuestion = 20
	model.Respond(func(r modelfake.Request) modelfake.Reply {
		if len(r.Messages) >= 2*perQuestion {
			return modelfake.Reply{Content: "done"}
		}
		return modelfake.Reply{Content: "computing", ToolCalls: []modelfake.ToolCall{{Name: "run_python", Args: `{"code":"print(6*7)"}`}}}
	})
	n := *f.steps
	var xs []float64
	msgs := 0
	for q := 0; len(xs) < n; q++ {
		ct, st := mcp.NewInMemoryTransports()
		ss, err := srv.Connect(ctx, st, nil)
		if err != nil {
			log.Fatal(err)
		}
		clock := &stepClock{}
		s, err := chat.Connect(ctx, ct, chat.Options{Model: chat.Model{BaseURL: model.URL, Name: "bench", APIKey: "k", Stream: true},
			MaxSteps: perQuestion + 5, Recorder: nopRecorder{}, Out: clock, Timeout: time.Hour})
		if err != nil {
			log.Fatal(err)
		}
		if _, err := s.Ask(ctx, "go"); err != nil {
			log.Fatal(err)
		}
		msgs = max(msgs, len(s.Messages()))
		s.Close(ctx)
		ss.Close()
		if q == 0 {
			continue // warm-up
		}
		for i := 1; i < len(clock.starts); i++ {
			xs = append(xs, ms(clock.starts[i].Sub(clock.starts[i-1])))
		}
	}
	sort.Float64s(xs)
	res := Results{CPUs: goruntime.NumCPU(), When: time.Now().UTC(), Skipped: map[string]string{}}
	res.Host, _ = os.Hostname()
	st1 := summarize(measureChatStep, "ms", xs)
	st1.Floor = fmt.Sprintf("overhead p50 ≤ 5 ms (an upper bound: includes the loopback HTTP model call, SSE, and the in-memory MCP call); questions of %d steps, %d messages at most", perQuestion, msgs)
	res.Stats = append(res.Stats, st1)
	printStats(res.Stats)
	if out != "bench/results.json" {
		writeResults(res, out)
	}
}
