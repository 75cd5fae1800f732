package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
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
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// agentbox chat: an agent loop of its own against an OpenAI-compatible endpoint, using this
// server's tools (internal/chat); conversations kept by the server (/v1/conversations).

const chatUsage = `usage: agentbox chat [QUESTION] [--model M] [--base-url URL] [--api-key-env NAME] [--tools a,b] [--keep]
                    [--max-steps N] [--yes] [--resume ID] [--json] [--system TEXT|@FILE] [--no-stream]
                    [--max-output-bytes N] [--max-tokens N] [--timeout D]
       agentbox chat ls [--limit N] [--json] | show ID [--json] | rm ID | export ID [--format json|markdown]
`

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
	model := fs.String("model", envOr("AGENTBOX_CHAT_MODEL", "gpt-4o-mini"), "the model (default: $AGENTBOX_CHAT_MODEL or gpt-4o-mini)")
	baseURL := fs.String("base-url", envOr("OPENAI_BASE_URL", "https://api.openai.com/v1"), "the OpenAI-compatible endpoint (default: $OPENAI_BASE_URL or OpenAI's); llama.cpp, vLLM, Ollama (http://127.0.0.1:11434/v1), LM Studio")
	keyEnv := fs.String("api-key-env", "OPENAI_API_KEY", "the environment variable holding the endpoint's API key (never recorded or logged)")
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
	cl, err := c.client()
	if err != nil {
		return fail(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	in := newLineReader()
	defer in.close()

	var conv wire.ConversationDetail
	if *resume != "" {
		if conv, err = cl.GetConversation(ctx, *resume); err != nil {
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
	out := &termOut{json: c.json}
	opts := chat.Options{
		Model: chat.Model{BaseURL: *baseURL, Name: *model, APIKey: os.Getenv(*keyEnv), Stream: !*noStream, MaxRetries: chat.DefaultMaxRetries,
			MaxTokens: *maxTokens},
		Tools: toolList, System: *system, MaxSteps: *maxSteps, MaxOutputBytes: *maxOut, Timeout: *timeout, Keep: *keep,
		Recorder: restRecorder{cl}, Out: out,
		Approve: func(actx context.Context, id, msg string) { approveInTerminal(actx, cl, in, id, msg, *yes) },
	}
	transport := &mcp.StreamableClientTransport{Endpoint: cl.BaseURL() + "/mcp", HTTPClient: cl.HTTP()}
	s, err := chat.Connect(ctx, transport, opts)
	if err != nil {
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
		if err := yesAllowed(ctx, cl, s.ToolNames()); err != nil {
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
	fmt.Fprintf(os.Stderr, "agentbox chat with %s at %s, %d tools; Ctrl-C interrupts an answer, Ctrl-D ends\n", *model, *baseURL, len(s.ToolNames()))
	for {
		q, err := in.next(ctx, "> ")
		if err != nil {
			if errors.Is(err, readline.ErrInterrupt) {
				continue
			}
			return 0
		}
		q = strings.TrimSpace(q)
		if q == "" {
			continue
		}
		if q == "exit" || q == "quit" {
			return 0
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

// restRecorder keeps the conversation on the server, as it happens.
type restRecorder struct{ cl *client.Client }

func (r restRecorder) Create(ctx context.Context, c wire.ConversationCreate) (wire.Conversation, error) {
	return r.cl.CreateConversation(ctx, c)
}

func (r restRecorder) Append(ctx context.Context, id string, msgs []wire.ChatMessage) error {
	_, err := r.cl.AppendConversation(ctx, id, msgs)
	return err
}

func (r restRecorder) SetSandbox(ctx context.Context, id, sandboxID string) error {
	_, err := r.cl.UpdateConversation(ctx, id, wire.ConversationUpdate{SandboxID: &sandboxID})
	return err
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
func yesAllowed(ctx context.Context, cl *client.Client, offered []string) error {
	p, err := cl.ApprovalPolicy(ctx)
	if errcode.Is(err, errcode.ApprovalNotFound) { // a server older than the route
		return errcode.New(errcode.PermissionDenied, "--yes: the server at %s does not publish its approval policy (it is older than this agentbox): run without --yes to approve in the terminal, or upgrade the server", cl.BaseURL())
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
	return errcode.New(errcode.PermissionDenied, "--yes approves gated calls, but the server at %s holds %s for an operator's decision and this key cannot decide (%s): "+
		"run without --yes to approve each call in the terminal (an operator may decide too), use a key of scope admin (AGENTBOX_TOKEN), or choose --tools the server does not gate",
		cl.BaseURL(), held, p.CannotDecide).With("approval_required", p.Required).With("approval_tools", p.Tools)
}

// approveInTerminal shows a gated call (tool, arguments, digest) and asks y/n; whichever
// comes first, this answer or an operator's in the console or over REST, decides (the server
// keeps the first decision). With --yes it approves without asking.
func approveInTerminal(ctx context.Context, cl *client.Client, in *lineReader, id, progress string, yes bool) {
	a, err := cl.GetApproval(ctx, id)
	if err != nil {
		fmt.Fprintf(os.Stderr, "\n⏸ %s\n  (this key cannot decide it: an operator must, `agentbox approvals approve %s`)\n", progress, id)
		return
	}
	fmt.Fprintf(os.Stderr, "\n⏸ approval %s: %s\n  arguments: %s\n  digest: %s\n", a.ID, a.Tool, oneLine(string(a.Summary), 400), a.Digest)
	approve := yes
	if !yes {
		ans, err := in.next(ctx, "approve this call? [y/N] ")
		if err != nil {
			if ctx.Err() != nil {
				fmt.Fprintln(os.Stderr, "(decided elsewhere)")
			}
			return
		}
		ans = strings.ToLower(strings.TrimSpace(ans))
		approve = ans == "y" || ans == "yes"
	}
	reason := "in agentbox chat"
	if _, err := cl.DecideApproval(ctx, id, approve, reason); err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "agentbox chat: deciding %s: %v\n", id, err)
	}
}

// lineReader reads lines from the terminal: readline (editing, history) when interactive,
// else stdin. A read abandoned by its context (an approval decided elsewhere) is kept for the
// next one, so no line is lost or read twice.
type lineReader struct {
	mu      sync.Mutex
	rl      *readline.Instance
	std     *bufio.Reader
	pending chan lineResult
}

type lineResult struct {
	s   string
	err error
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
	rl, err := readline.NewEx(&readline.Config{Prompt: "> ", HistoryFile: hist, InterruptPrompt: "^C", EOFPrompt: "exit", HistorySearchFold: true})
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
	ch := r.pending
	if ch == nil {
		ch = make(chan lineResult, 1)
		r.pending = ch
		rl := r.rl
		go func() {
			var res lineResult
			if rl != nil {
				rl.SetPrompt(prompt)
				res.s, res.err = rl.Readline()
			} else {
				fmt.Fprint(os.Stderr, prompt)
				res.s, res.err = r.std.ReadString('\n')
				if res.err == io.EOF && res.s != "" {
					res.err = nil
				}
			}
			ch <- res
		}()
	}
	r.mu.Unlock()
	select {
	case res := <-ch:
		r.mu.Lock()
		r.pending = nil
		r.mu.Unlock()
		return strings.TrimRight(res.s, "\r\n"), res.err
	case <-ctx.Done():
		return "", ctx.Err()
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
