package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/chzyer/readline"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/term"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/chat"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// agentbox chat: an agent loop of its own against an OpenAI-compatible endpoint, using this
// server's tools (internal/chat); conversations kept by the server (/v1/conversations).

const chatUsage = `usage: agentbox chat [QUESTION] [--model M] [--base-url URL] [--api-key-env NAME] [--tools a,b] [--keep]
                    [--max-steps N] [--yes] [--resume ID] [--json] [--system TEXT|@FILE] [--no-stream]
                    [--max-output-bytes N] [--max-tokens N] [--timeout D] [--stdio] [--state-dir DIR]
       agentbox chat ls [--limit N] [--json] | show ID [--json] | rm ID | export ID [--format json|markdown]
`

const chatIntro = `
Asks QUESTION once (the answer on stdout, the tool calls on stderr), or without one talks until
Ctrl-D: a model of your choice answers using agentbox's tools, in a sandbox of the conversation's
own, and every step is kept (agentbox chat ls). The model: any OpenAI-compatible endpoint
(--base-url, --model; the key from $OPENAI_API_KEY). The tools: the server's (--server, else
$AGENTBOX_URL or the local one), else "agentbox mcp" over stdio. More in docs/CHAT.md.

  agentbox chat "how many run_python calls failed in the last hour?"
  agentbox chat --base-url http://127.0.0.1:11434/v1 --model qwen2.5:7b
  agentbox chat --resume conv-1a2b3c4d "and per week?"
`

const chatInteractiveHelp = `  /help      this help          /tools   the tools offered
  /exit      end (or Ctrl-D)    Ctrl-C   interrupt the answer (the conversation is kept)
  Up/Down    history            Ctrl-R   search the history
  conversation %s, sandbox %s
  tools: %s
`

func orNone(s string) string {
	if s == "" {
		return "(none yet: made on first use)"
	}
	return s
}

func cmdChat(args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "ls", "list":
			return chatList(args[1:])
		case "show":
			return chatExport(args[1:], "text")
		case "export":
			return chatExport(args[1:], "")
		case "rm", "delete":
			return chatRemove(args[1:])
		}
	}
	return chatRun(args)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func chatRun(args []string) int {
	c := newClientCmd("chat", strings.TrimSpace(chatUsage))
	fs := c.fs
	model := fs.String("model", envOr("AGENTBOX_CHAT_MODEL", "gpt-4o-mini"), "the model ($AGENTBOX_CHAT_MODEL sets the default)")
	baseURL := fs.String("base-url", envOr("OPENAI_BASE_URL", "https://api.openai.com/v1"), "the OpenAI-compatible endpoint ($OPENAI_BASE_URL sets the default): OpenAI, llama.cpp (http://127.0.0.1:8080/v1), vLLM, Ollama (http://127.0.0.1:11434/v1), LM Studio")
	keyEnv := fs.String("api-key-env", "OPENAI_API_KEY", "the environment variable holding the endpoint's API key (never recorded or logged; a local endpoint may need none)")
	tools := fs.String("tools", "", "only these tools, comma-separated (default: all of the server's), e.g. run_python,execute_sql,fetch_metrics")
	keep := fs.Bool("keep", false, "keep the conversation's sandbox at the end (default: destroyed)")
	maxSteps := fs.Int("max-steps", chat.DefaultMaxSteps, "most model calls for one question")
	yes := fs.Bool("yes", false, "approve gated tool calls without asking, for unattended runs (refused when the server's policy holds this chat's calls and the key cannot approve)")
	resume := fs.String("resume", "", "continue the conversation of this id")
	system := fs.String("system", "", "the system prompt, or @FILE (default: the agentbox skill, docs/skills)")
	noStream := fs.Bool("no-stream", false, "ask for whole replies instead of server-sent events")
	maxOut := fs.Int("max-output-bytes", chat.DefaultMaxOutputBytes, "most bytes of one tool result fed back to the model (the rest cut with a note)")
	maxTokens := fs.Int("max-tokens", 0, "most tokens of one model reply (0: the endpoint's default)")
	timeout := fs.Duration("timeout", chat.DefaultTimeout, "wall-clock limit of one question")
	stdio := fs.Bool("stdio", false, "reach the tools through \"agentbox mcp\" over stdio (spawned with an argv, never a shell) instead of the server's /mcp; chosen by itself when no server answers")
	stateDir := fs.String("state-dir", "", "over stdio: the `DIR` of \"agentbox mcp --state-dir\" (its server is used if one runs, else the control plane runs in that process)")
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, chatUsage+chatIntro+"\nflags:\n")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) > 1 {
		pos = []string{strings.Join(pos, " ")}
	}
	if *maxSteps < 1 || *maxSteps > 1000 || *maxOut < 256 || *maxOut > 1<<20 || *maxTokens < 0 || *timeout <= 0 {
		fmt.Fprintln(os.Stderr, "agentbox chat: --max-steps must be 1-1000, --max-output-bytes 256-1048576, --max-tokens ≥ 0, --timeout > 0")
		return 2
	}
	if *system != "" && strings.HasPrefix(*system, "@") {
		b, err := os.ReadFile((*system)[1:])
		if err != nil {
			return fail(fmt.Errorf("--system %s: %w", *system, err))
		}
		*system = string(b)
	}
	// OpenAI's endpoint without a key fails on the first question: say so before anything starts.
	if os.Getenv(*keyEnv) == "" && strings.Contains(*baseURL, "api.openai.com") {
		return fail(&chat.Error{Code: chat.ModelAuthFailed, Message: fmt.Sprintf("$%s is empty, and %s needs an API key: export %s=sk-…, or name another variable with --api-key-env; "+
			"for a local model server (llama.cpp, Ollama, vLLM…) give its --base-url and --model", *keyEnv, *baseURL, *keyEnv)})
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	in := newLineReader()
	defer in.close()

	conn, be, err := chatConnect(ctx, c, *stdio, *stateDir)
	if err != nil {
		return fail(err)
	}
	var conv wire.ConversationDetail
	if *resume != "" {
		if conv, err = be.GetConversation(ctx, *resume); err != nil {
			conn.Close()
			return fail(err)
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["model"] && conv.Model != "" {
			*model = conv.Model
		}
		if !set["base-url"] && conv.Endpoint != "" {
			*baseURL = conv.Endpoint
		}
		if !set["tools"] && len(conv.Tools) > 0 {
			*tools = strings.Join(conv.Tools, ",")
		}
	}
	var toolList []string
	for _, t := range strings.Split(*tools, ",") {
		if t = strings.TrimSpace(t); t != "" {
			toolList = append(toolList, t)
		}
	}
	// The server's approval policy: whether this key can decide the calls it holds (asked in
	// the terminal) and whether --yes may run.
	policy, policyErr := be.ApprovalPolicy(ctx)
	cannotDecide := policy.CannotDecide
	if policyErr != nil || !policy.Required && len(policy.Tools) == 0 {
		cannotDecide = "" // unknown, or nothing held: a decision asked for is tried
	}
	out := &termOut{json: c.json}
	opts := chat.Options{
		Model: chat.Model{BaseURL: *baseURL, Name: *model, APIKey: os.Getenv(*keyEnv), Stream: !*noStream, MaxRetries: chat.DefaultMaxRetries,
			MaxTokens: *maxTokens},
		Tools: toolList, System: *system, MaxSteps: *maxSteps, MaxOutputBytes: *maxOut, Timeout: *timeout, Keep: *keep,
		Recorder: be, Out: out,
		Approve: func(actx context.Context, id, msg string) {
			approveInTerminal(actx, be, in, id, msg, *yes, cannotDecide)
		},
	}
	s, err := conn.Start(ctx, opts)
	if err != nil {
		conn.Close()
		return fail(err)
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer ccancel()
		if err := s.Close(cctx); err != nil {
			fmt.Fprintf(os.Stderr, "agentbox chat: %v\n", err)
		}
		if id := s.Conversation().ID; id != "" && !c.json {
			fmt.Fprintf(os.Stderr, "conversation %s kept: agentbox chat --resume %s\n", id, id)
		}
	}()
	// --yes approves in this process: against a server that would hold any of this chat's
	// calls, the key must be able to.
	if *yes {
		if err := yesAllowed(be.Where(), policy, policyErr, s.ToolNames()); err != nil {
			return fail(err)
		}
	}
	if *resume != "" {
		if err := s.Resume(ctx, conv.Conversation, conv.Transcript); err != nil {
			return fail(err)
		}
	}

	// Ctrl-C cancels the question being answered (its tool calls too); the conversation stays.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ask := func(q string) (string, error) {
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGTERM {
					stop()
				}
				cancel()
			case <-done:
			}
		}()
		return s.Ask(actx, q)
	}

	if len(pos) == 1 { // one-shot
		ans, err := ask(pos[0])
		if c.json {
			conv := s.Conversation()
			res := map[string]any{"conversation_id": conv.ID, "answer": ans, "sandbox_id": conv.SandboxID, "messages": conv.Messages,
				"prompt_tokens": conv.PromptTokens, "completion_tokens": conv.CompletionTokens}
			if err != nil {
				res["error"] = map[string]string{"code": chat.CodeOf(err), "message": err.Error()}
			}
			printJSON(res)
		} else if ans != "" && !out.streamed() {
			fmt.Println(ans)
		} else if ans != "" {
			fmt.Println()
		}
		if err != nil {
			if !c.json {
				fmt.Fprintf(os.Stderr, "agentbox chat: %v\n", err)
			}
			if chat.CodeOf(err) == chat.Canceled {
				return 130
			}
			return 1
		}
		return 0
	}
	// Interactive: line editing and history; Ctrl-D (or "exit") ends.
	if err := in.interactive(); err != nil {
		return fail(err)
	}
	fmt.Fprintf(os.Stderr, "agentbox chat with %s at %s, %d tools of %s; Ctrl-C interrupts an answer, Ctrl-D or /exit ends, /help helps\n",
		*model, *baseURL, len(s.ToolNames()), be.Where())
	for {
		q, err := in.next(ctx, questionPrompt)
		if err != nil {
			if errors.Is(err, readline.ErrInterrupt) {
				fmt.Fprintln(os.Stderr, "(Ctrl-D or /exit ends the chat)")
				continue
			}
			if in.rl == nil {
				fmt.Fprintln(os.Stderr) // the input ended after a prompt
			}
			return 0
		}
		q = strings.TrimSpace(q)
		switch q {
		case "":
			continue
		case "exit", "quit", "/exit", "/quit", "/q":
			return 0
		case "/help", "/?", "help":
			conv := s.Conversation()
			id := conv.ID
			if id == "" {
				id = "(none yet: it starts with the first question)"
			}
			fmt.Fprintf(os.Stderr, chatInteractiveHelp, id, orNone(conv.SandboxID), strings.Join(s.ToolNames(), ", "))
			continue
		case "/tools":
			fmt.Fprintln(os.Stderr, strings.Join(s.ToolNames(), "\n"))
			continue
		}
		if strings.HasPrefix(q, "/") && !strings.Contains(q, " ") {
			fmt.Fprintf(os.Stderr, "%s: no such command (/help lists them); to ask it, add a word\n", q)
			continue
		}
		out.reset()
		if _, err := ask(q); err != nil {
			fmt.Fprintf(os.Stderr, "\nagentbox chat: %v\n", err)
			if ctx.Err() != nil {
				return 1
			}
			continue
		}
		fmt.Println()
	}
}

// chatBackend is what the chat needs of agentbox beside the tools: the conversation's record,
// kept as it happens, and the approvals. restBackend serves it over the server's REST API;
// mcpBackend through the MCP session's api_call tool, for `agentbox mcp` running the control
// plane in process (no REST server to call).
type chatBackend interface {
	chat.Recorder
	Where() string
	GetConversation(ctx context.Context, id string) (wire.ConversationDetail, error)
	ApprovalPolicy(ctx context.Context) (wire.ApprovalPolicy, error)
	GetApproval(ctx context.Context, id string) (wire.Approval, error)
	DecideApproval(ctx context.Context, id string, approve bool, reason string) (wire.Approval, error)
}

type restBackend struct{ *client.Client }

func (r restBackend) Where() string { return "the server at " + r.BaseURL() }

func (r restBackend) Create(ctx context.Context, c wire.ConversationCreate) (wire.Conversation, error) {
	return r.CreateConversation(ctx, c)
}

func (r restBackend) Append(ctx context.Context, id string, msgs []wire.ChatMessage) error {
	_, err := r.AppendConversation(ctx, id, msgs)
	return err
}

func (r restBackend) SetSandbox(ctx context.Context, id, sandboxID string) error {
	_, err := r.UpdateConversation(ctx, id, wire.ConversationUpdate{SandboxID: &sandboxID})
	return err
}

type mcpBackend struct{ conn *chat.Conn }

func (m mcpBackend) Where() string { return "agentbox mcp (stdio)" }

func (m mcpBackend) Create(ctx context.Context, c wire.ConversationCreate) (out wire.Conversation, err error) {
	return out, m.conn.API(ctx, "POST", "/v1/conversations", c, &out)
}

func (m mcpBackend) Append(ctx context.Context, id string, msgs []wire.ChatMessage) error {
	return m.conn.API(ctx, "POST", "/v1/conversations/"+url.PathEscape(id)+"/messages", wire.ConversationMessages{Messages: msgs}, nil)
}

func (m mcpBackend) SetSandbox(ctx context.Context, id, sandboxID string) error {
	return m.conn.API(ctx, "PATCH", "/v1/conversations/"+url.PathEscape(id), wire.ConversationUpdate{SandboxID: &sandboxID}, nil)
}

func (m mcpBackend) GetConversation(ctx context.Context, id string) (out wire.ConversationDetail, err error) {
	return out, m.conn.API(ctx, "GET", "/v1/conversations/"+url.PathEscape(id), nil, &out)
}

func (m mcpBackend) ApprovalPolicy(ctx context.Context) (out wire.ApprovalPolicy, err error) {
	return out, m.conn.API(ctx, "GET", "/v1/approvals/policy", nil, &out)
}

func (m mcpBackend) GetApproval(ctx context.Context, id string) (out wire.Approval, err error) {
	return out, m.conn.API(ctx, "GET", "/v1/approvals/"+url.PathEscape(id), nil, &out)
}

func (m mcpBackend) DecideApproval(ctx context.Context, id string, approve bool, reason string) (out wire.Approval, err error) {
	verb := "deny"
	if approve {
		verb = "approve"
	}
	return out, m.conn.API(ctx, "POST", "/v1/approvals/"+url.PathEscape(id)+"/"+verb, wire.DecisionRequest{Reason: reason}, &out)
}

// chatConnect finds agentbox as every CLI verb does (--server, $AGENTBOX_URL, the local
// server; with --state-dir, that state dir's server) and opens the MCP session: the server's
// /mcp when one answers, else (or with --stdio) `agentbox mcp` spawned over stdio, which relays
// to the running server or runs the control plane in process. The conversation is recorded
// over the server's REST API when one answers, else through the session's api_call.
func chatConnect(ctx context.Context, c *clientCmd, stdio bool, stateDir string) (*chat.Conn, chatBackend, error) {
	u := c.server
	if u == "" && stateDir != "" {
		if info, err := config.ReadServerInfo(stateDir); err == nil && info.URL != "" {
			u = info.URL
		}
	}
	if u == "" {
		u = config.ServerURL()
	}
	up := serverAnswers(ctx, u, c.tls.forURL(u))
	if !up && c.server != "" && !stdio {
		return nil, nil, errcode.New(errcode.Unavailable, "no agentbox server answers at %s (--server): start one (`agentbox serve`), give the right --server, or drop --server to run the tools through `agentbox mcp` over stdio", u)
	}
	var cl *client.Client
	if up {
		c.server = u
		var err error
		if cl, err = c.client(); err != nil {
			return nil, nil, err
		}
		if !stdio {
			conn, err := chat.Dial(ctx, &mcp.StreamableClientTransport{Endpoint: cl.BaseURL() + "/mcp", HTTPClient: cl.HTTP()})
			if err != nil {
				return nil, nil, err
			}
			return conn, restBackend{cl}, nil
		}
	} else if os.Getenv("AGENTBOX_APPROVAL_REQUIRED") == "1" {
		// In process, every api_call (the chat's own records) would wait for a decision that
		// only a REST API can take.
		return nil, nil, errcode.New(errcode.InvalidArgument, "AGENTBOX_APPROVAL_REQUIRED=1 and no agentbox server answers at %s: approvals are decided over a server's REST API, "+
			"so start one (`agentbox serve --approval-required`) and chat with it, or unset AGENTBOX_APPROVAL_REQUIRED to run the tools in process", u)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("finding this program to run `agentbox mcp`: %w", err)
	}
	argv := []string{"mcp", "--log-level", "error"} // its errors only: the chat's terminal is the user's
	if stateDir != "" {
		argv = append(argv, "--state-dir", stateDir)
	}
	cmd := exec.Command(self, argv...) // an argv, never a shell string
	cmd.Stderr = os.Stderr             // its warnings; the protocol is on stdin/stdout
	cmd.Env = os.Environ()
	if up { // it relays to the server found here, with the same credential
		cmd.Args = append(cmd.Args, "--server", u)
		if c.token != "" {
			cmd.Env = append(cmd.Env, "AGENTBOX_TOKEN="+c.token) // the environment, never the argv
		}
	}
	ownProcessGroup(cmd) // Ctrl-C in the terminal is the chat's to handle, not the tools' process's
	conn, err := chat.Dial(ctx, &mcp.CommandTransport{Command: cmd})
	if err != nil {
		return nil, nil, fmt.Errorf("`agentbox mcp` over stdio: %w", err)
	}
	if up {
		return conn, restBackend{cl}, nil
	}
	return conn, mcpBackend{conn}, nil
}

// serverAnswers reports whether an agentbox server answers /health at u.
func serverAnswers(ctx context.Context, u string, trust client.TLS) bool {
	probe, err := client.NewTLS(u, "", trust)
	if err != nil {
		return false
	}
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return probe.Health(hctx) == nil
}

// termOut shows the answer as it streams (stdout) and the tool calls (stderr).
type termOut struct {
	json bool
	mu   sync.Mutex
	n    int
}

func (o *termOut) Token(s string) {
	if o.json {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n += len(s)
	fmt.Print(s)
}

func (o *termOut) streamed() bool { o.mu.Lock(); defer o.mu.Unlock(); return o.n > 0 }
func (o *termOut) reset()         { o.mu.Lock(); o.n = 0; o.mu.Unlock() }

func (o *termOut) ToolStart(c wire.ChatToolCall) {
	if !o.json {
		fmt.Fprintf(os.Stderr, "\n→ %s %s\n", c.Name, oneLine(c.Arguments, 200))
	}
}

func (o *termOut) ToolEnd(c wire.ChatToolCall, res wire.ChatMessage) {
	if o.json {
		return
	}
	mark := "←"
	if res.IsError {
		mark = "✗"
	}
	fmt.Fprintf(os.Stderr, "%s %s (%d ms) %s\n", mark, c.Name, res.DurationMS, oneLine(res.Content, 200))
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// chatLifecycleTools are the tools the loop calls itself (the conversation's sandbox).
var chatLifecycleTools = []string{"sandbox_create", "sandbox_get", "sandbox_destroy"}

// yesAllowed decides whether --yes may run: the server publishes which calls it holds for a
// decision and whether this key may decide (GET /v1/approvals/policy). No call of this chat
// held (no policy, or one gating only tools it does not offer): yes. Some held: only with a
// key that can approve; else a typed error saying what to change.
func yesAllowed(where string, p wire.ApprovalPolicy, err error, offered []string) error {
	if errcode.Is(err, errcode.ApprovalNotFound) { // a server older than the route
		return errcode.New(errcode.PermissionDenied, "--yes: %s does not publish its approval policy (it is older than this agentbox): run without --yes to approve in the terminal, or upgrade the server", where)
	}
	if err != nil {
		return fmt.Errorf("--yes: reading the server's approval policy: %w", err)
	}
	var held string
	if p.Required {
		held = "every call that acts (serve --approval-required)"
	} else {
		var gated []string
		for _, t := range append(slices.Clone(offered), chatLifecycleTools...) {
			if slices.Contains(p.Tools, t) && !slices.Contains(gated, t) {
				gated = append(gated, t)
			}
		}
		if len(gated) == 0 {
			return nil // nothing this chat calls waits for a decision
		}
		held = "calls of " + strings.Join(gated, ", ") + " (serve --approval-tools)"
	}
	if p.CanDecide {
		return nil
	}
	return errcode.New(errcode.PermissionDenied, "--yes approves gated calls, but %s holds %s for an operator's decision and this key cannot decide (%s): "+
		"run without --yes to approve each call in the terminal (an operator may decide too), use a key of scope admin (AGENTBOX_TOKEN), or choose --tools the server does not gate",
		where, held, p.CannotDecide).With("approval_required", p.Required).With("approval_tools", p.Tools)
}

// approveInTerminal shows a gated call (tool, arguments, digest) and asks y/n; whichever
// comes first, this answer or an operator's in the console or over REST, decides (the server
// keeps the first decision): a decision made elsewhere withdraws the prompt, and the loop goes
// on. With --yes it approves without asking; with a key that cannot decide it says so and
// leaves the decision to an operator. Ctrl-C at the prompt interrupts the question.
func approveInTerminal(ctx context.Context, be chatBackend, in *lineReader, id, progress string, yes bool, cannotDecide string) {
	a, err := be.GetApproval(ctx, id)
	if err != nil {
		fmt.Fprintf(os.Stderr, "\n⏸ %s\n  (an operator decides: `agentbox approvals approve %s`)\n", progress, id)
		return
	}
	fmt.Fprintf(os.Stderr, "\n⏸ approval %s: %s\n  arguments: %s\n  digest: %s\n", a.ID, a.Tool, oneLine(string(a.Summary), 400), a.Digest)
	if cannotDecide != "" && !yes {
		fmt.Fprintf(os.Stderr, "  waiting for an operator's decision (`agentbox approvals approve %s`): this key cannot decide (%s)\n", id, cannotDecide)
		return
	}
	approve := yes
	if !yes {
		pctx, withdraw := context.WithCancel(ctx)
		defer withdraw()
		decided := make(chan wire.Approval, 1)
		go func() { // a decision made elsewhere (console, REST) withdraws the prompt
			t := time.NewTicker(approvalPoll)
			defer t.Stop()
			for {
				select {
				case <-pctx.Done():
					return
				case <-t.C:
				}
				if cur, err := be.GetApproval(pctx, id); err == nil && cur.State != wire.ApprovalPending {
					decided <- cur
					withdraw()
					return
				}
			}
		}()
		ans, err := in.next(pctx, "approve this call? [y/N] ")
		if err != nil {
			switch {
			case pctx.Err() != nil: // decided elsewhere (seen here, or the call ended first)
				var cur wire.Approval
				select {
				case cur = <-decided:
				default:
					gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
					cur, _ = be.GetApproval(gctx, id)
					cancel()
				}
				if cur.State != "" && cur.State != wire.ApprovalPending {
					fmt.Fprintf(os.Stderr, "  %s elsewhere%s\n", decidedAs(cur), decidedBy(cur))
				} else {
					fmt.Fprintln(os.Stderr, "  (the call ended meanwhile)")
				}
			case errors.Is(err, readline.ErrInterrupt): // Ctrl-C at the prompt (raw mode: no signal)
				if p, err := os.FindProcess(os.Getpid()); err == nil {
					p.Signal(os.Interrupt)
				}
			default: // no terminal answer (its input ended)
				fmt.Fprintf(os.Stderr, "  no answer from the terminal: an operator decides (`agentbox approvals approve %s`)\n", id)
			}
			return
		}
		ans = strings.ToLower(strings.TrimSpace(ans))
		approve = ans == "y" || ans == "yes"
	}
	cur, err := be.DecideApproval(ctx, id, approve, "in agentbox chat")
	switch {
	case errcode.Is(err, errcode.Conflict): // decided elsewhere first: that decision stands
		if cur, err = be.GetApproval(context.WithoutCancel(ctx), id); err == nil {
			fmt.Fprintf(os.Stderr, "  %s elsewhere first%s\n", decidedAs(cur), decidedBy(cur))
		}
	case err != nil && ctx.Err() == nil:
		fmt.Fprintf(os.Stderr, "agentbox chat: deciding %s: %v\n", id, err)
	}
}

// approvalPoll is how often a prompt looks for a decision made elsewhere.
const approvalPoll = 500 * time.Millisecond

func decidedAs(a wire.Approval) string {
	switch a.State {
	case wire.ApprovalApproved, wire.ApprovalUsed:
		return "approved"
	case wire.ApprovalDenied:
		return "denied"
	}
	return string(a.State)
}

func decidedBy(a wire.Approval) string {
	s := ""
	if a.Decider != "" {
		s = " by " + a.Decider
	}
	if a.Reason != "" {
		s += fmt.Sprintf(" (%s)", oneLine(a.Reason, 120))
	}
	return s
}

// lineReader reads lines from the terminal: readline (editing, history) when interactive,
// else stdin. A terminal read abandoned by its context (an approval decided elsewhere) is
// withdrawn; a piped one is kept for the next prompt, so no line is lost or read twice.
type lineReader struct {
	mu        sync.Mutex
	rl        *readline.Instance
	tty       *ttyInput
	std       *bufio.Reader
	pending   *lineRead
	withdrawn *lineRead // the read last withdrawn: its end answers no prompt
}

// ttyInput is readline's input: the terminal's bytes, and bytes the chat writes in itself
// (a Ctrl-C that ends a withdrawn prompt: readline's own WriteStdin waits for the next key).
type ttyInput struct {
	keys   chan []byte
	inject chan []byte
	rest   []byte
}

func newTTYInput(f *os.File) *ttyInput {
	in := &ttyInput{keys: make(chan []byte), inject: make(chan []byte, 1)}
	go func() {
		for {
			b := make([]byte, 256)
			n, err := f.Read(b)
			if n > 0 {
				in.keys <- b[:n]
			}
			if err != nil {
				close(in.keys)
				return
			}
		}
	}()
	return in
}

func (in *ttyInput) Read(p []byte) (int, error) {
	if len(in.rest) == 0 {
		select {
		case b, ok := <-in.keys:
			if !ok {
				return 0, io.EOF
			}
			in.rest = b
		case b := <-in.inject:
			in.rest = b
		}
	}
	n := copy(p, in.rest)
	in.rest = in.rest[n:]
	return n, nil
}

func (in *ttyInput) Close() error { return nil }

// questionPrompt asks for a question (the history keeps only these).
const questionPrompt = "> "

// lineRead is one read of a line; done is closed when it ended.
type lineRead struct {
	done chan struct{}
	s    string
	err  error
}

func newLineReader() *lineReader { return &lineReader{std: bufio.NewReader(os.Stdin)} }

func (r *lineReader) interactive() error {
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		return nil // piped questions, one a line
	}
	hist := ""
	if dir, err := os.UserConfigDir(); err == nil {
		if os.MkdirAll(filepath.Join(dir, "agentbox"), 0o700) == nil {
			hist = filepath.Join(dir, "agentbox", "chat_history")
		}
	}
	// Ctrl-C leaves the line as typed and starts a new one (no "^C" hint: a withdrawn prompt
	// ends the same way).
	r.tty = newTTYInput(os.Stdin)
	rl, err := readline.NewEx(&readline.Config{Prompt: "> ", HistoryFile: hist, Stdin: r.tty, InterruptPrompt: " ", EOFPrompt: "exit", HistorySearchFold: true})
	if err != nil {
		return err
	}
	r.rl = rl
	return nil
}

func (r *lineReader) close() {
	if r.rl != nil {
		r.rl.Close()
	}
}

func (r *lineReader) next(ctx context.Context, prompt string) (string, error) {
	r.mu.Lock()
	rd := r.pending
	if rd != nil && r.rl == nil {
		fmt.Fprint(os.Stderr, prompt) // a kept read of piped input now serves this prompt
	}
	if rd == nil {
		rd = &lineRead{done: make(chan struct{})}
		r.pending = rd
		rl := r.rl
		go func() {
			defer close(rd.done)
			if rl != nil {
				rl.SetPrompt(prompt)
				if prompt != questionPrompt { // an approval's y/n is no question to recall
					rl.HistoryDisable()
					defer rl.HistoryEnable()
				}
				rd.s, rd.err = rl.Readline()
				return
			}
			fmt.Fprint(os.Stderr, prompt)
			rd.s, rd.err = r.std.ReadString('\n')
			if rd.err == io.EOF && rd.s != "" {
				rd.err = nil
			}
		}()
	}
	r.mu.Unlock()
	select {
	case <-rd.done:
		r.mu.Lock()
		mine := r.pending == rd // one line answers one prompt (parallel approvals each ask)
		if mine {
			r.pending = nil
		}
		again := !mine || r.withdrawn == rd // taken, or the end of a withdrawn read
		r.mu.Unlock()
		if again {
			return r.next(ctx, prompt)
		}
		return strings.TrimRight(rd.s, "\r\n"), rd.err
	case <-ctx.Done():
		r.withdraw(rd)
		return "", ctx.Err()
	}
}

// withdraw ends a terminal read abandoned by its context (an approval decided elsewhere): a
// Ctrl-C written to readline's input ends it, so the prompt stops waiting and the terminal
// leaves raw mode before the answer prints; what was typed at it is dropped. A piped input's
// read is kept for the next prompt instead (no line is lost).
func (r *lineReader) withdraw(rd *lineRead) {
	r.mu.Lock()
	if r.rl == nil || r.pending != rd || r.withdrawn == rd {
		r.mu.Unlock()
		return
	}
	r.withdrawn = rd
	select {
	case r.tty.inject <- []byte{readline.CharInterrupt}:
	default:
	}
	r.mu.Unlock()
	select { // wait (briefly) for readline to let the terminal go
	case <-rd.done:
		r.mu.Lock()
		if r.pending == rd {
			r.pending = nil
		}
		r.mu.Unlock()
	case <-time.After(time.Second): // a later next() drops it when it ends
	}
}

// chat ls / show / export / rm

func chatList(args []string) int {
	c := newClientCmd("chat ls", "agentbox chat ls [--limit N] [--json]")
	limit := c.fs.Int("limit", 0, "at most this many, newest first (default 50)")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		l, err := cl.ListConversations(ctx, *limit)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tMODEL\tMESSAGES\tTOKENS\tSANDBOX\tUPDATED\tTITLE")
		for _, cv := range l.Conversations {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", cv.ID, cv.Model, cv.Messages, cv.PromptTokens+cv.CompletionTokens, cv.SandboxID,
				cv.UpdatedAt.Local().Format(time.DateTime), oneLine(cv.Title, 60))
		}
		tw.Flush()
		if l.Omitted > 0 {
			fmt.Fprintf(os.Stderr, "(%d older not shown: --limit)\n", l.Omitted)
		}
		return 0
	})
}

func chatRemove(args []string) int {
	c := newClientCmd("chat rm", "agentbox chat rm ID")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		if err := cl.DeleteConversation(ctx, pos[0]); err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(wire.DeletedConversation{ConversationID: pos[0], Deleted: true})
		} else {
			fmt.Printf("deleted %s\n", pos[0])
		}
		return 0
	})
}

// chatExport prints a conversation: show (text, or --json) and export (--format json|markdown).
func chatExport(args []string, def string) int {
	name := "chat export"
	if def == "text" {
		name = "chat show"
	}
	c := newClientCmd(name, "agentbox "+name+" ID [--format json|markdown]")
	format := c.fs.String("format", "markdown", "json or markdown")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		d, err := cl.GetConversation(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		f := *format
		if def == "text" {
			f = "text"
		}
		if c.json {
			f = "json"
		}
		switch f {
		case "json":
			printJSON(d)
		case "markdown", "md":
			fmt.Print(chat.Markdown(d))
		case "text":
			fmt.Print(chat.Text(d))
		default:
			fmt.Fprintf(os.Stderr, "agentbox chat export: --format %q: use json or markdown\n", f)
			return 2
		}
		return 0
	})
}
