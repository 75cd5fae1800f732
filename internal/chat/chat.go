// Package chat is `agentbox chat`'s agent loop: an MCP client of agentbox that sends a
// conversation and the tools' JSON schemas to an OpenAI-compatible chat-completions endpoint,
// runs the tool calls the model asks for (several at once too) and feeds their results back
// until the model answers, within bounds (steps, tool-output bytes, tokens, wall-clock time).
// Every message is handed to a Recorder as it happens, so that a crash or an interrupt loses
// nothing and a conversation can be resumed; the API key is never recorded.
package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/openai/openai-go/v3"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// Defaults of Options.
const (
	DefaultMaxSteps        = 20
	DefaultMaxOutputBytes  = 16 << 10
	DefaultTimeout         = 15 * time.Minute
	DefaultMaxRetries      = 4
	DefaultSandboxTTL      = 3600
	maxTitleRunes          = 80
	interruptedCallMessage = "the chat process stopped before this call returned: its outcome is unknown (look in the sandbox before repeating it)"
	canceledCallMessage    = "canceled by the user (Ctrl-C) before it returned; its command was stopped"
)

// Recorder keeps a conversation as it happens (the server's store, over REST).
type Recorder interface {
	// Create records a new conversation and returns it with its id.
	Create(ctx context.Context, c wire.ConversationCreate) (wire.Conversation, error)
	// Append records messages in order (their Seq set).
	Append(ctx context.Context, id string, msgs []wire.ChatMessage) error
	// SetSandbox records the conversation's sandbox.
	SetSandbox(ctx context.Context, id, sandboxID string) error
}

// Output is where the loop shows what happens (the terminal, or nothing).
type Output interface {
	Token(s string)                                       // a piece of the model's answer
	ToolStart(call wire.ChatToolCall)                     // a call about to run
	ToolEnd(call wire.ChatToolCall, res wire.ChatMessage) // its result as fed back
}

// Approver decides a gated call in the terminal: the server waits for a decision on
// approvalID (tool, digest); it returns when the user answered or ctx ended.
type Approver func(ctx context.Context, approvalID string, progress string)

// Options configure a Session.
type Options struct {
	Model Model
	// Tools offered to the model (empty: every tool the server lists).
	Tools []string
	// System is the system prompt ("": DefaultSystemPrompt()).
	System string
	// MaxSteps bounds the model calls of one question; MaxOutputBytes the bytes of one tool
	// result fed back (cut with a note); Timeout the wall-clock time of one question.
	MaxSteps       int
	MaxOutputBytes int
	Timeout        time.Duration
	// Keep leaves the conversation's sandbox when the session closes.
	Keep     bool
	Recorder Recorder
	Out      Output
	Approve  Approver
	Logger   *slog.Logger
}

// Conn is an MCP session with agentbox (streamable HTTP to a server's /mcp, or stdio to
// `agentbox mcp`): the tools, and agentbox's REST API through its api_call tool.
type Conn struct {
	cs       *mcp.ClientSession
	progress sync.Map // progress token → func(string)
	nextTok  atomic.Int64
}

// Dial opens the MCP session over t.
func Dial(ctx context.Context, t mcp.Transport) (*Conn, error) {
	c := &Conn{}
	cl := mcp.NewClient(&mcp.Implementation{Name: "agentbox-chat", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			if f, ok := c.progress.Load(fmt.Sprint(r.Params.ProgressToken)); ok {
				f.(func(string))(r.Params.Message)
			}
		},
	})
	cs, err := cl.Connect(ctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("chat: connect to agentbox's MCP endpoint: %w", err)
	}
	c.cs = cs
	return c, nil
}

// Close ends the MCP session (and, over stdio, lets `agentbox mcp` exit).
func (c *Conn) Close() error { return c.cs.Close() }

// API sends one request to agentbox's REST API through the api_call tool (as the session's
// caller, under the same gate) and decodes the reply's JSON body into out (if non-nil). A REST
// error is an *errcode.Error with its code.
func (c *Conn) API(ctx context.Context, method, path string, body, out any) error {
	args := map[string]any{"method": method, "path": path}
	if body != nil {
		args["body"] = body
	}
	r, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: "api_call", Arguments: args})
	if err != nil {
		return err
	}
	if r.IsError {
		var e struct {
			Error struct {
				Code    errcode.Code   `json:"code"`
				Message string         `json:"message"`
				Details map[string]any `json:"details"`
			} `json:"error"`
		}
		if r.StructuredContent != nil && resultJSON(r, &e) == nil && e.Error.Code != "" {
			return &errcode.Error{Code: e.Error.Code, Message: e.Error.Message, Details: e.Error.Details}
		}
		return fmt.Errorf("%s %s: %s", method, path, resultText(r))
	}
	if out == nil {
		return nil
	}
	var reply struct {
		Body json.RawMessage `json:"body"`
	}
	if err := resultJSON(r, &reply); err != nil {
		return fmt.Errorf("%s %s: api_call's reply: %w", method, path, err)
	}
	return json.Unmarshal(reply.Body, out)
}

// Session is one conversation over one MCP session.
type Session struct {
	opts    Options
	conn    *Conn
	mcp     *mcp.ClientSession
	model   *modelClient
	tools   []openai.ChatCompletionToolUnionParam
	schemas map[string]map[string]any

	mu        sync.Mutex // the conversation
	conv      wire.Conversation
	msgs      []wire.ChatMessage
	sandboxMu sync.Mutex
}

// Connect opens the MCP session over t and starts a Session on it (Dial, then Start).
func Connect(ctx context.Context, t mcp.Transport, opts Options) (*Session, error) {
	c, err := Dial(ctx, t)
	if err != nil {
		return nil, err
	}
	s, err := c.Start(ctx, opts)
	if err != nil {
		c.Close()
		return nil, err
	}
	return s, nil
}

// Start lists the tools to offer and returns a Session on c, which it owns from then on
// (Session.Close closes it); it records nothing yet.
func (c *Conn) Start(ctx context.Context, opts Options) (*Session, error) {
	if opts.MaxSteps <= 0 {
		opts.MaxSteps = DefaultMaxSteps
	}
	if opts.MaxOutputBytes <= 0 {
		opts.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.System == "" {
		opts.System = DefaultSystemPrompt()
	}
	if opts.Model.Name == "" || opts.Model.BaseURL == "" {
		return nil, fmt.Errorf("chat: a model (--model) and a base URL (--base-url) are required")
	}
	s := &Session{opts: opts, conn: c, mcp: c.cs, model: newModelClient(opts.Model), schemas: map[string]map[string]any{}}
	cs := c.cs
	chosen, want := map[string]bool{}, map[string]bool{}
	for _, n := range opts.Tools {
		chosen[n], want[n] = true, true
	}
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("chat: list agentbox's tools: %w", err)
		}
		if len(chosen) > 0 && !chosen[tool.Name] {
			continue
		}
		delete(want, tool.Name)
		var schema map[string]any
		b, _ := json.Marshal(tool.InputSchema)
		_ = json.Unmarshal(b, &schema)
		if schema == nil {
			schema = map[string]any{"type": "object", "properties": map[string]any{}}
		}
		s.schemas[tool.Name] = schema // the tools offered (the loop calls the lifecycle tools itself)
		s.tools = append(s.tools, toolParam(tool.Name, tool.Description, schema))
	}
	if len(want) > 0 {
		var missing []string
		for n := range want {
			missing = append(missing, n)
		}
		slices.Sort(missing)
		return nil, fmt.Errorf("chat: --tools names %s, which the server does not offer (agentbox's tools are listed in docs/TOOLS.md)", strings.Join(missing, ", "))
	}
	return s, nil
}

// ToolNames are the tools offered, in the server's order.
func (s *Session) ToolNames() []string {
	var out []string
	for _, t := range s.tools {
		out = append(out, t.OfFunction.Function.Name)
	}
	return out
}

// Conversation is the conversation's record as the session knows it.
func (s *Session) Conversation() wire.Conversation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conv
}

// Messages are the conversation's messages so far.
func (s *Session) Messages() []wire.ChatMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// Resume continues a kept conversation: calls left without a result (the process ended
// mid-step) get one saying so, recorded, so that the model sees a well-formed history.
func (s *Session) Resume(ctx context.Context, conv wire.Conversation, msgs []wire.ChatMessage) error {
	s.mu.Lock()
	s.conv, s.msgs = conv, slices.Clone(msgs)
	s.mu.Unlock()
	answered := map[string]bool{}
	for _, m := range msgs {
		if m.Role == "tool" {
			answered[m.ToolCallID] = true
		}
	}
	var fix []wire.ChatMessage
	for _, m := range msgs {
		for _, tc := range m.ToolCalls {
			if !answered[tc.ID] {
				fix = append(fix, wire.ChatMessage{Role: "tool", ToolCallID: tc.ID, Tool: tc.Name, IsError: true, Content: interruptedCallMessage})
			}
		}
	}
	return s.record(ctx, fix...)
}

// Ask adds the user's question and runs the loop until the model answers without tool calls.
// It returns the answer. An interrupt (ctx canceled) or a limit keeps everything recorded.
func (s *Session) Ask(ctx context.Context, question string) (string, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.opts.Timeout, errTimeLimit)
	defer cancel()
	if err := s.start(ctx, question); err != nil {
		return "", err
	}
	if err := s.record(ctx, wire.ChatMessage{Role: "user", Content: question}); err != nil {
		return "", err
	}
	for step := 0; step < s.opts.MaxSteps; step++ {
		msgs := s.Messages()
		t0 := time.Now()
		rep, err := s.model.complete(ctx, msgs, s.tools, s.token)
		took := time.Since(t0)
		if err != nil {
			if rep.content != "" { // the part that streamed before the interrupt or the drop
				_ = s.record(context.WithoutCancel(ctx), wire.ChatMessage{Role: "assistant", Content: rep.content + "\n[interrupted]",
					Model: s.opts.Model.Name, DurationMS: took.Milliseconds()})
			}
			return "", err
		}
		msg := wire.ChatMessage{Role: "assistant", Content: rep.content, ToolCalls: rep.calls, Model: s.opts.Model.Name,
			PromptTokens: rep.promptTokens, CompletionTokens: rep.completionTokens, DurationMS: took.Milliseconds()}
		for i := range msg.ToolCalls {
			if msg.ToolCalls[i].ID == "" {
				msg.ToolCalls[i].ID = fmt.Sprintf("call_%d_%d", len(msgs), i)
			}
		}
		// The calls are recorded before they run: a crash leaves them to be answered on resume.
		if err := s.record(context.WithoutCancel(ctx), msg); err != nil {
			return "", err
		}
		if len(msg.ToolCalls) == 0 {
			return rep.content, nil
		}
		if err := s.runCalls(ctx, msg.ToolCalls); err != nil {
			return "", err
		}
	}
	return "", &Error{Code: StepLimit, Message: fmt.Sprintf("the model still asked for tools after %d steps (--max-steps); the conversation is kept: resume it to go on", s.opts.MaxSteps)}
}

// start records the conversation on its first question.
func (s *Session) start(ctx context.Context, question string) error {
	s.mu.Lock()
	started := s.conv.ID != ""
	s.mu.Unlock()
	if started {
		return nil
	}
	title := strings.Join(strings.Fields(question), " ")
	if utf8.RuneCountInString(title) > maxTitleRunes {
		title = string([]rune(title)[:maxTitleRunes-1]) + "…"
	}
	create := wire.ConversationCreate{Title: title, Model: s.opts.Model.Name, Endpoint: s.opts.Model.BaseURL, Tools: s.opts.Tools}
	conv := wire.Conversation{Title: title, Model: create.Model, Endpoint: create.Endpoint, Tools: create.Tools, CreatedAt: time.Now()}
	if s.opts.Recorder != nil {
		var err error
		if conv, err = s.opts.Recorder.Create(ctx, create); err != nil {
			return fmt.Errorf("chat: record the conversation: %w", err)
		}
	} else {
		conv.ID = fmt.Sprintf("local-%d", time.Now().UnixNano())
	}
	s.mu.Lock()
	s.conv = conv
	s.mu.Unlock()
	return s.record(ctx, wire.ChatMessage{Role: "system", Content: s.opts.System})
}

// record appends msgs to the conversation and the recorder, in order.
func (s *Session) record(ctx context.Context, msgs ...wire.ChatMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UTC()
	for i := range msgs {
		msgs[i].Seq = len(s.msgs) + i + 1
		msgs[i].CreatedAt = now
	}
	if s.opts.Recorder != nil {
		if err := s.opts.Recorder.Append(ctx, s.conv.ID, msgs); err != nil {
			return fmt.Errorf("chat: record conversation %s: %w", s.conv.ID, err)
		}
	}
	s.msgs = append(s.msgs, msgs...)
	s.conv.Messages = len(s.msgs)
	for _, m := range msgs {
		s.conv.PromptTokens += m.PromptTokens
		s.conv.CompletionTokens += m.CompletionTokens
	}
	return nil
}

func (s *Session) token(t string) {
	if s.opts.Out != nil {
		s.opts.Out.Token(t)
	}
}

// runCalls runs the calls at once and records each result as it comes.
func (s *Session) runCalls(ctx context.Context, calls []wire.ChatToolCall) error {
	var wg sync.WaitGroup
	errs := make([]error, len(calls))
	for i, tc := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.opts.Out != nil {
				s.opts.Out.ToolStart(tc)
			}
			res := s.call(ctx, tc)
			if s.opts.Out != nil {
				s.opts.Out.ToolEnd(tc, res)
			}
			errs[i] = s.record(context.WithoutCancel(ctx), res)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctxError(ctx, ctx.Err())
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

var approvalProgress = regexp.MustCompile(`waiting for an operator to approve (\S+) `)

// call runs one tool call; its result message is what the model is fed back.
func (s *Session) call(ctx context.Context, tc wire.ChatToolCall) (res wire.ChatMessage) {
	res = wire.ChatMessage{Role: "tool", ToolCallID: tc.ID, Tool: tc.Name}
	t0 := time.Now()
	defer func() { res.DurationMS = time.Since(t0).Milliseconds() }()
	schema, ok := s.schemas[tc.Name]
	if !ok {
		res.IsError, res.Content = true, fmt.Sprintf("no tool %q here; the tools are: %s", tc.Name, strings.Join(s.ToolNames(), ", "))
		return res
	}
	var args map[string]any
	if strings.TrimSpace(tc.Arguments) != "" {
		if err := json.Unmarshal([]byte(tc.Arguments), &args); err != nil {
			res.IsError, res.Content = true, fmt.Sprintf("the arguments are not a JSON object (%v); call %s again with valid JSON", err, tc.Name)
			return res
		}
	}
	if args == nil {
		args = map[string]any{}
	}
	if takesSandbox(schema) && args["sandbox_id"] == nil {
		id, err := s.sandbox(ctx)
		if err != nil {
			res.IsError, res.Content = true, "could not make the conversation's sandbox: "+err.Error()
			if ctx.Err() != nil {
				res.Content = canceledCallMessage
			}
			return res
		}
		args["sandbox_id"] = id
	}
	params := &mcp.CallToolParams{Name: tc.Name, Arguments: args}
	tok := fmt.Sprintf("chat-%d", s.conn.nextTok.Add(1))
	params.SetProgressToken(tok)
	var asked atomic.Bool
	actx, stopAsk := context.WithCancel(ctx)
	approverDone := make(chan struct{})
	s.conn.progress.Store(tok, func(msg string) {
		if m := approvalProgress.FindStringSubmatch(msg); m != nil && s.opts.Approve != nil && asked.CompareAndSwap(false, true) {
			go func() {
				defer close(approverDone)
				s.opts.Approve(actx, m[1], msg)
			}()
		}
	})
	r, err := s.mcp.CallTool(ctx, params)
	// The call is over: the approver's question is withdrawn, and has gone before the result
	// shows.
	s.conn.progress.Delete(tok)
	stopAsk()
	if asked.Load() {
		<-approverDone
	}
	switch {
	case ctx.Err() != nil:
		res.IsError, res.Content = true, canceledCallMessage
		return res
	case err != nil:
		res.IsError, res.Content = true, "the call failed: "+err.Error()
		return res
	}
	res.IsError = r.IsError
	text := resultText(r)
	res.OutputBytes = int64(len(text))
	if len(text) > s.opts.MaxOutputBytes {
		cut := s.opts.MaxOutputBytes
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut] + fmt.Sprintf("\n[output truncated: %d of %d bytes shown; ask for less, or read the rest in pieces]", cut, len(text))
		res.Truncated = true
	}
	res.Content = text
	return res
}

// resultJSON decodes a tool result's structured content (else its text) into v.
func resultJSON(r *mcp.CallToolResult, v any) error {
	if r.StructuredContent != nil {
		b, err := json.Marshal(r.StructuredContent)
		if err != nil {
			return err
		}
		return json.Unmarshal(b, v)
	}
	return json.Unmarshal([]byte(resultText(r)), v)
}

// resultText is a tool result as text: its text contents, else its structured content.
func resultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			if b.Len() > 0 {
				b.WriteString("\n")
			}
			b.WriteString(t.Text)
		}
	}
	if b.Len() == 0 && r.StructuredContent != nil {
		j, _ := json.Marshal(r.StructuredContent)
		return string(j)
	}
	return b.String()
}

func takesSandbox(schema map[string]any) bool {
	props, _ := schema["properties"].(map[string]any)
	_, ok := props["sandbox_id"]
	return ok
}

// sandbox is the conversation's sandbox, created on first use.
func (s *Session) sandbox(ctx context.Context) (string, error) {
	s.sandboxMu.Lock()
	defer s.sandboxMu.Unlock()
	s.mu.Lock()
	id, convID := s.conv.SandboxID, s.conv.ID
	s.mu.Unlock()
	if id != "" {
		// A kept sandbox may be gone (its TTL, a destroy): make a new one then.
		r, err := s.mcp.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_get", Arguments: map[string]any{"sandbox_id": id}})
		if err == nil && !r.IsError {
			var sb struct {
				State string `json:"state"`
			}
			if resultJSON(r, &sb) == nil && sb.State == "running" {
				return id, nil
			}
		}
	}
	r, err := s.mcp.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_create", Arguments: map[string]any{
		"ttl_seconds": DefaultSandboxTTL, "labels": map[string]string{"agentbox.chat": convID}, "idempotency_key": "chat-" + convID + "-" + id}})
	if err != nil {
		return "", err
	}
	if r.IsError {
		return "", fmt.Errorf("%s", resultText(r))
	}
	var sb struct {
		ID string `json:"sandbox_id"`
	}
	if err := resultJSON(r, &sb); err != nil || sb.ID == "" {
		return "", fmt.Errorf("sandbox_create's reply has no id: %.200s", resultText(r))
	}
	s.mu.Lock()
	s.conv.SandboxID = sb.ID
	s.mu.Unlock()
	if s.opts.Recorder != nil && convID != "" {
		if err := s.opts.Recorder.SetSandbox(context.WithoutCancel(ctx), convID, sb.ID); err != nil {
			return sb.ID, err
		}
	}
	return sb.ID, nil
}

// Close destroys the conversation's sandbox unless Keep, and ends the MCP session.
func (s *Session) Close(ctx context.Context) error {
	defer s.mcp.Close()
	s.mu.Lock()
	id := s.conv.SandboxID
	s.mu.Unlock()
	if id == "" || s.opts.Keep {
		return nil
	}
	r, err := s.mcp.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_destroy", Arguments: map[string]any{"sandbox_id": id}})
	if err != nil {
		return fmt.Errorf("chat: destroy sandbox %s: %w", id, err)
	}
	if r.IsError && !strings.Contains(resultText(r), "NOT_FOUND") {
		return fmt.Errorf("chat: destroy sandbox %s: %s", id, resultText(r))
	}
	return nil
}
