package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/testenv/modelfake"
	"github.com/agentbox/agentbox/internal/wire"
)

// The logic tier: the real loop, the real OpenAI client and the real MCP client against the
// scripted model server and an in-memory MCP server with tools of the same names and shapes
// as agentbox's. The end-to-end tier (cmd/agentbox) runs it against a real server.

type memRecorder struct {
	mu      sync.Mutex
	conv    wire.Conversation
	msgs    []wire.ChatMessage
	sandbox []string
}

func (r *memRecorder) Create(_ context.Context, c wire.ConversationCreate) (wire.Conversation, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conv = wire.Conversation{ID: "conv-1", Title: c.Title, Model: c.Model, Endpoint: c.Endpoint}
	return r.conv, nil
}

func (r *memRecorder) Append(_ context.Context, id string, msgs []wire.ChatMessage) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		if m.Seq != len(r.msgs)+1 {
			return fmt.Errorf("seq %d after %d", m.Seq, len(r.msgs))
		}
		r.msgs = append(r.msgs, m)
	}
	return nil
}

func (r *memRecorder) SetSandbox(_ context.Context, id, sb string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sandbox = append(r.sandbox, sb)
	return nil
}

func (r *memRecorder) messages() []wire.ChatMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]wire.ChatMessage(nil), r.msgs...)
}

// toolServer is an MCP server with agentbox-shaped tools.
type toolServer struct {
	mu        sync.Mutex
	created   int
	destroyed []string
	calls     []map[string]any
	barrier   chan struct{} // run_python with "wait": every such call waits for the others
	waiting   int
	waitN     int
	block     chan struct{} // run_shell blocks until closed or canceled
	canceled  chan struct{}
	big       int
}

type pyIn struct {
	Code      string `json:"code"`
	SandboxID string `json:"sandbox_id,omitempty"`
}

type sbIn struct {
	SandboxID string `json:"sandbox_id"`
}

func (ts *toolServer) start(t *testing.T) mcp.Transport {
	srv := mcp.NewServer(&mcp.Implementation{Name: "fake-agentbox", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "sandbox_create", Description: "make a sandbox"}, func(ctx context.Context, _ *mcp.CallToolRequest, in struct {
		TTL    int               `json:"ttl_seconds,omitempty"`
		Labels map[string]string `json:"labels,omitempty"`
		Key    string            `json:"idempotency_key,omitempty"`
	}) (*mcp.CallToolResult, map[string]any, error) {
		ts.mu.Lock()
		ts.created++
		id := fmt.Sprintf("sb-%d", ts.created)
		ts.mu.Unlock()
		return nil, map[string]any{"sandbox_id": id, "state": "running"}, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "sandbox_get"}, func(ctx context.Context, _ *mcp.CallToolRequest, in sbIn) (*mcp.CallToolResult, map[string]any, error) {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		for _, d := range ts.destroyed {
			if d == in.SandboxID {
				return nil, map[string]any{"sandbox_id": in.SandboxID, "state": "destroyed"}, nil
			}
		}
		return nil, map[string]any{"sandbox_id": in.SandboxID, "state": "running"}, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "sandbox_destroy"}, func(ctx context.Context, _ *mcp.CallToolRequest, in sbIn) (*mcp.CallToolResult, map[string]any, error) {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		ts.destroyed = append(ts.destroyed, in.SandboxID)
		return nil, map[string]any{"sandbox_id": in.SandboxID, "state": "destroyed"}, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "run_python", Description: "run python"}, func(ctx context.Context, _ *mcp.CallToolRequest, in pyIn) (*mcp.CallToolResult, map[string]any, error) {
		ts.mu.Lock()
		ts.calls = append(ts.calls, map[string]any{"code": in.Code, "sandbox_id": in.SandboxID})
		big := ts.big
		var wait chan struct{}
		if strings.Contains(in.Code, "wait") {
			ts.waiting++
			if ts.waiting == ts.waitN {
				close(ts.barrier)
			}
			wait = ts.barrier
		}
		ts.mu.Unlock()
		if wait != nil {
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		out := "ran " + in.Code + " in " + in.SandboxID
		if big > 0 {
			out = strings.Repeat("é", big)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out}}}, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "run_shell"}, func(ctx context.Context, req *mcp.CallToolRequest, in pyIn) (*mcp.CallToolResult, map[string]any, error) {
		if tok := req.Params.GetProgressToken(); tok != nil {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok,
				Message: "waiting for an operator to approve ap-123 (run_shell, digest abc): `agentbox approvals approve ap-123`; 5m0s left"})
		}
		select {
		case <-ts.block:
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "shell done"}}}, nil, nil
		case <-ctx.Done():
			close(ts.canceled)
			return nil, nil, ctx.Err()
		}
	})
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	return ct
}

type env struct {
	model *modelfake.Server
	tools *toolServer
	rec   *memRecorder
	s     *Session
	out   *bufOut
}

type bufOut struct {
	mu     sync.Mutex
	tokens strings.Builder
	starts []string
}

func (b *bufOut) Token(s string) { b.mu.Lock(); b.tokens.WriteString(s); b.mu.Unlock() }
func (b *bufOut) ToolStart(c wire.ChatToolCall) {
	b.mu.Lock()
	b.starts = append(b.starts, c.Name)
	b.mu.Unlock()
}
func (b *bufOut) ToolEnd(wire.ChatToolCall, wire.ChatMessage) {}

const testKey = "sk-test-SECRET-4242"

func newEnv(t *testing.T, stream bool, mod func(*Options), script ...modelfake.Reply) *env {
	t.Helper()
	e := &env{model: modelfake.New(script...), tools: &toolServer{block: make(chan struct{}), canceled: make(chan struct{})}, rec: &memRecorder{}, out: &bufOut{}}
	t.Cleanup(e.model.Close)
	e.model.Key = testKey
	opts := Options{Model: Model{BaseURL: e.model.URL, Name: "test-model", APIKey: testKey, Stream: stream, MaxRetries: 2},
		Recorder: e.rec, Out: e.out}
	if mod != nil {
		mod(&opts)
	}
	ctx := context.Background()
	s, err := Connect(ctx, e.tools.start(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	e.s = s
	t.Cleanup(func() { s.Close(context.Background()) })
	return e
}

func call(name, args string) modelfake.ToolCall { return modelfake.ToolCall{Name: name, Args: args} }

// A question answered through a tool, streamed and not: the schemas go to the model, the
// sandbox is made once on first use and filled in, the result is fed back, every message is
// recorded in order with its usage, and Close destroys the sandbox.
func TestLoopAnswersThroughTools(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			e := newEnv(t, stream, nil,
				modelfake.Reply{ToolCalls: []modelfake.ToolCall{call("run_python", `{"code":"print(6*7)"}`)}, PromptTokens: 100, CompletionTokens: 10},
				modelfake.Reply{ToolCalls: []modelfake.ToolCall{call("run_python", `{"code":"print(2)"}`)}},
				modelfake.Reply{Content: "The answer is 42.", PromptTokens: 200, CompletionTokens: 5})
			ans, err := e.s.Ask(context.Background(), "what is six times seven?")
			if err != nil || ans != "The answer is 42." {
				t.Fatalf("answer %q, %v", ans, err)
			}
			if e.out.tokens.String() != "The answer is 42." {
				t.Fatalf("streamed %q", e.out.tokens.String())
			}
			reqs := e.model.Requests()
			if len(reqs) != 3 || reqs[0].Stream != stream || reqs[0].Model != "test-model" {
				t.Fatalf("requests %+v", reqs)
			}
			if _, ok := reqs[0].ToolSchemas["run_python"]; !ok || !strings.Contains(string(reqs[0].ToolSchemas["run_python"]), `"code"`) {
				t.Fatalf("tools offered %v", reqs[0].ToolSchemas)
			}
			last := reqs[2].Messages
			if last[0].Role != "system" || !strings.Contains(last[0].Text(), "sandbox_create") || last[1].Text() != "what is six times seven?" {
				t.Fatalf("conversation sent %+v", last[:2])
			}
			if last[3].Role != "tool" || last[3].Text() != "ran print(6*7) in sb-1" || last[3].ToolCallID != last[2].ToolCalls[0].ID {
				t.Fatalf("tool result fed back %+v", last[3])
			}
			if e.tools.created != 1 || len(e.rec.sandbox) != 1 || e.s.Conversation().SandboxID != "sb-1" {
				t.Fatalf("sandboxes: created %d, recorded %v", e.tools.created, e.rec.sandbox)
			}
			msgs := e.rec.messages()
			roles := ""
			for _, m := range msgs {
				roles += m.Role[:1]
			}
			if roles != "suatata" {
				t.Fatalf("recorded roles %q", roles)
			}
			if msgs[2].PromptTokens != 100 || msgs[2].CompletionTokens != 10 || msgs[6].PromptTokens != 200 || msgs[2].Model != "test-model" {
				t.Fatalf("usage recorded %+v / %+v", msgs[2], msgs[6])
			}
			if c := e.s.Conversation(); c.PromptTokens < 300 || c.Endpoint != e.model.URL {
				t.Fatalf("conversation %+v", c)
			}
			if err := e.s.Close(context.Background()); err != nil || len(e.tools.destroyed) != 1 || e.tools.destroyed[0] != "sb-1" {
				t.Fatalf("close: %v, destroyed %v", err, e.tools.destroyed)
			}
			b, _ := json.Marshal(msgs)
			if strings.Contains(string(b), testKey) {
				t.Fatal("the API key is in the recorded conversation")
			}
			for _, r := range reqs {
				if r.Authorization != "Bearer "+testKey {
					t.Fatalf("authorization %q", r.Authorization)
				}
			}
		})
	}
}

// Parallel tool calls run at once: each waits for the other, so run one after the other
// they would never return.
func TestParallelToolCalls(t *testing.T) {
	e := newEnv(t, true, func(o *Options) { o.Timeout = 30 * time.Second },
		modelfake.Reply{ToolCalls: []modelfake.ToolCall{call("run_python", `{"code":"wait a"}`), call("run_python", `{"code":"wait b"}`), call("run_python", `{"code":"wait c"}`)}},
		modelfake.Reply{Content: "all three ran"})
	e.tools.barrier, e.tools.waitN = make(chan struct{}), 3
	ans, err := e.s.Ask(context.Background(), "three at once")
	if err != nil || ans != "all three ran" {
		t.Fatalf("%q %v", ans, err)
	}
	reqs := e.model.Requests()
	var ids []string
	for _, m := range reqs[1].Messages {
		if m.Role == "tool" {
			ids = append(ids, m.ToolCallID)
		}
	}
	if len(ids) != 3 || e.tools.created != 1 {
		t.Fatalf("tool results %v, sandboxes created %d", ids, e.tools.created)
	}
}

// Bad calls are fed back as tool errors the model can act on; long output is cut with a note.
func TestBadCallsAndTruncation(t *testing.T) {
	e := newEnv(t, false, func(o *Options) { o.MaxOutputBytes = 101 },
		modelfake.Reply{ToolCalls: []modelfake.ToolCall{call("run_python", `{"code": oops`), call("no_such_tool", `{}`), call("run_python", `{"code":"big"}`)}},
		modelfake.Reply{Content: "ok"})
	e.tools.big = 1000
	if _, err := e.s.Ask(context.Background(), "go"); err != nil {
		t.Fatal(err)
	}
	byID := map[string]wire.ChatMessage{}
	for _, m := range e.rec.messages() {
		if m.Role == "tool" {
			byID[m.ToolCallID] = m
		}
	}
	calls := e.rec.messages()[2].ToolCalls
	bad, unknown, big := byID[calls[0].ID], byID[calls[1].ID], byID[calls[2].ID]
	if !bad.IsError || !strings.Contains(bad.Content, "not a JSON object") {
		t.Fatalf("malformed args: %+v", bad)
	}
	if !unknown.IsError || !strings.Contains(unknown.Content, `no tool "no_such_tool"`) {
		t.Fatalf("unknown tool: %+v", unknown)
	}
	if !big.Truncated || big.OutputBytes != 2000 || !strings.Contains(big.Content, "[output truncated: 100 of 2000 bytes shown") || !strings.HasPrefix(big.Content, strings.Repeat("é", 50)+"\n") {
		t.Fatalf("truncation: %+v", big)
	}
}

// The endpoint's failures are typed errors saying what to change.
func TestModelErrors(t *testing.T) {
	cases := []struct {
		name  string
		reply modelfake.Reply
		key   string
		code  string
	}{
		{"wrong key", modelfake.Reply{}, "sk-wrong", ModelAuthFailed},
		{"no tools", modelfake.Reply{Status: 400, Message: "registry.ollama.ai/library/gemma:2b does not support tools"}, testKey, ModelNoTools},
		{"malformed", modelfake.Reply{Raw: `{"choices": [ {"message": `}, testKey, ModelBadReply},
		{"dropped stream", modelfake.Reply{Content: "a long answer that never ends", DropAfter: 3}, testKey, ModelBadReply},
		{"rate limited", modelfake.Reply{Status: 429, RetryAfter: "0", Message: "slow down"}, testKey, ModelRateLimited},
		{"server error", modelfake.Reply{Status: 404, Message: "model not found"}, testKey, ModelFailed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			script := []modelfake.Reply{c.reply}
			if c.code == ModelRateLimited {
				script = []modelfake.Reply{c.reply, c.reply, c.reply}
			}
			e := newEnv(t, c.name == "dropped stream", func(o *Options) { o.Model.APIKey = c.key }, script...)
			_, err := e.s.Ask(context.Background(), "hi")
			if CodeOf(err) != c.code {
				t.Fatalf("error %v, want %s", err, c.code)
			}
			if strings.Contains(err.Error(), testKey) || strings.Contains(err.Error(), "sk-wrong") {
				t.Fatalf("the key is in the error: %v", err)
			}
		})
	}
	// 429 with Retry-After, then an answer: retried, not an error.
	e := newEnv(t, true, nil, modelfake.Reply{Status: 429, RetryAfter: "1"}, modelfake.Reply{Status: 503, RetryAfter: "0"}, modelfake.Reply{Content: "fine"})
	t0 := time.Now()
	if ans, err := e.s.Ask(context.Background(), "hi"); err != nil || ans != "fine" {
		t.Fatalf("%q %v", ans, err)
	}
	if time.Since(t0) < time.Second {
		t.Fatal("Retry-After: 1 was not honoured")
	}
	// Nothing listening.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	e = newEnv(t, true, func(o *Options) { o.Model.BaseURL = "http://" + addr + "/v1"; o.Model.MaxRetries = 0 })
	if _, err := e.s.Ask(context.Background(), "hi"); CodeOf(err) != ModelUnreachable {
		t.Fatalf("unreachable: %v", err)
	}
}

// Ctrl-C mid-tool cancels the call (the tool sees it), keeps the conversation well-formed,
// and the next question goes on from it.
func TestInterruptMidToolThenGoOn(t *testing.T) {
	var asked sync.WaitGroup
	asked.Add(1)
	var approvalID string
	e := newEnv(t, true, func(o *Options) {
		o.Approve = func(ctx context.Context, id, msg string) { approvalID = id; asked.Done() }
	},
		modelfake.Reply{ToolCalls: []modelfake.ToolCall{call("run_shell", `{"code":"sleep 1000"}`)}})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		asked.Wait() // the approval prompt came up: the call is running
		cancel()
	}()
	_, err := e.s.Ask(ctx, "run something slow")
	if CodeOf(err) != Canceled {
		t.Fatalf("interrupt: %v", err)
	}
	<-e.tools.canceled // the server saw the cancellation
	if approvalID != "ap-123" {
		t.Fatalf("approval asked for %q", approvalID)
	}
	msgs := e.rec.messages()
	if last := msgs[len(msgs)-1]; last.Role != "tool" || last.Content != canceledCallMessage {
		t.Fatalf("last message %+v", last)
	}
	e.model.Push(modelfake.Reply{Content: "ok, stopped"})
	if ans, err := e.s.Ask(context.Background(), "never mind"); err != nil || ans != "ok, stopped" {
		t.Fatalf("after interrupt: %q %v", ans, err)
	}
	reqs := e.model.Requests()
	if n := len(reqs[1].Messages); n != 5 || reqs[1].Messages[4].Text() != "never mind" {
		t.Fatalf("second question sent %d messages", n)
	}
}

// Resuming a conversation whose process died mid-step answers the calls left open.
func TestResumeAnswersOpenCalls(t *testing.T) {
	e := newEnv(t, false, nil, modelfake.Reply{Content: "resumed"})
	kept := []wire.ChatMessage{
		{Seq: 1, Role: "system", Content: "sys"}, {Seq: 2, Role: "user", Content: "q"},
		{Seq: 3, Role: "assistant", ToolCalls: []wire.ChatToolCall{{ID: "c1", Name: "run_python", Arguments: "{}"}, {ID: "c2", Name: "run_python", Arguments: "{}"}}},
		{Seq: 4, Role: "tool", ToolCallID: "c1", Content: "done"},
	}
	e.rec.msgs = append(e.rec.msgs, kept...)
	if err := e.s.Resume(context.Background(), wire.Conversation{ID: "conv-1", SandboxID: "sb-9"}, kept); err != nil {
		t.Fatal(err)
	}
	if ans, err := e.s.Ask(context.Background(), "go on"); err != nil || ans != "resumed" {
		t.Fatalf("%q %v", ans, err)
	}
	sent := e.model.Requests()[0].Messages
	if len(sent) != 6 || sent[4].ToolCallID != "c2" || sent[4].Text() != interruptedCallMessage || sent[5].Text() != "go on" {
		t.Fatalf("sent %+v", sent)
	}
	if len(e.rec.messages()) != 7 {
		t.Fatalf("recorded %d", len(e.rec.messages()))
	}
}

// A model that never stops calling tools hits the step bound.
func TestStepLimit(t *testing.T) {
	e := newEnv(t, false, func(o *Options) { o.MaxSteps = 3 })
	e.model.Respond(func(modelfake.Request) modelfake.Reply {
		return modelfake.Reply{ToolCalls: []modelfake.ToolCall{call("run_python", `{"code":"1"}`)}}
	})
	_, err := e.s.Ask(context.Background(), "loop")
	if CodeOf(err) != StepLimit || len(e.model.Requests()) != 3 {
		t.Fatalf("%v after %d requests", err, len(e.model.Requests()))
	}
	var le *Error
	if !errors.As(err, &le) || !strings.Contains(le.Message, "--max-steps") {
		t.Fatal(err)
	}
}

// --tools narrows the tools offered; an unknown name is refused before anything runs.
func TestToolsChosen(t *testing.T) {
	e := newEnv(t, false, func(o *Options) { o.Tools = []string{"run_python"} }, modelfake.Reply{Content: "x"})
	if got := e.s.ToolNames(); len(got) != 1 || got[0] != "run_python" {
		t.Fatalf("tools %v", got)
	}
	ts := &toolServer{}
	_, err := Connect(context.Background(), ts.start(t), Options{Model: Model{BaseURL: "http://x/v1", Name: "m"}, Tools: []string{"run_python", "fetch_nothing"}})
	if err == nil || !strings.Contains(err.Error(), "fetch_nothing") {
		t.Fatalf("unknown tool: %v", err)
	}
}

// The system prompt is the skill in docs/skills: the embedded copy must equal it.
func TestSkillInSync(t *testing.T) {
	want, err := os.ReadFile("../../docs/skills/agentbox/SKILL.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != skill {
		t.Fatal("internal/chat/skill.md differs from docs/skills/agentbox/SKILL.md: cp docs/skills/agentbox/SKILL.md internal/chat/skill.md")
	}
	if p := DefaultSystemPrompt(); strings.Contains(p, "description:") || !strings.Contains(p, "## The loop") {
		t.Fatalf("prompt %.200q", p)
	}
}

// TestConnAPI: agentbox's REST API through the api_call tool (the chat's records over stdio):
// a reply's JSON body decodes into out; a REST error comes back with its code.
func TestConnAPI(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "fake-agentbox", Version: "1"}, nil)
	var got []string
	mcp.AddTool(srv, &mcp.Tool{Name: "api_call"}, func(ctx context.Context, _ *mcp.CallToolRequest, in struct {
		Method string `json:"method"`
		Path   string `json:"path"`
		Body   any    `json:"body,omitempty"`
	}) (*mcp.CallToolResult, any, error) {
		b, _ := json.Marshal(in.Body)
		got = append(got, in.Method+" "+in.Path+" "+string(b))
		if strings.HasSuffix(in.Path, "/missing") {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "CONVERSATION_NOT_FOUND: no conversation missing"}},
				StructuredContent: map[string]any{"error": map[string]any{"code": "CONVERSATION_NOT_FOUND", "message": "no conversation missing", "details": map[string]any{"status": 404}}}}, nil, nil
		}
		return nil, map[string]any{"route": "GET /v1/conversations/{id}", "status": 200, "body_encoding": "json",
			"body": map[string]any{"id": "conv-1", "title": "hello", "messages": 2}}, nil
	})
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	c, err := Dial(t.Context(), ct)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var conv wire.Conversation
	if err := c.API(t.Context(), "POST", "/v1/conversations", wire.ConversationCreate{Title: "hello"}, &conv); err != nil || conv.ID != "conv-1" || conv.Messages != 2 {
		t.Fatalf("%+v %v", conv, err)
	}
	err = c.API(t.Context(), "GET", "/v1/conversations/missing", nil, &conv)
	if !errcode.Is(err, errcode.ConversationNotFound) || !strings.Contains(err.Error(), "no conversation missing") {
		t.Fatalf("error: %v", err)
	}
	if len(got) != 2 || !strings.HasPrefix(got[0], "POST /v1/conversations {") || !strings.Contains(got[0], `"title":"hello"`) || got[1] != "GET /v1/conversations/missing null" {
		t.Fatalf("requests: %q", got)
	}
}
