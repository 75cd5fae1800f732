package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/statedir"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/modelfake"
	"github.com/agentbox/agentbox/internal/wire"
)

const chatKey = "sk-chat-e2e-NEVER-STORED-7f3a"

// lastTool is the content of the newest tool message of a request for tool name.
func lastTool(r modelfake.Request, name string) string {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		m := r.Messages[i]
		if m.Role == "tool" {
			for _, a := range r.Messages {
				for _, tc := range a.ToolCalls {
					if tc.ID == m.ToolCallID && tc.Function.Name == name {
						return m.Text()
					}
				}
			}
		}
	}
	return ""
}

type chatProc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr testenv.SyncBuffer
}

func startChat(t *testing.T, srv *testenv.Server, model *modelfake.Server, args ...string) *chatProc {
	t.Helper()
	return startChatAs(t, srv, srv.Token, model, args...)
}

// startChatAs runs the chat with token (an API key) as its agentbox credential.
func startChatAs(t *testing.T, srv *testenv.Server, token string, model *modelfake.Server, args ...string) *chatProc {
	t.Helper()
	r := &chatProc{}
	r.cmd = exec.Command(srv.Bin, append([]string{"chat", "--base-url", model.URL, "--model", "fake-model"}, args...)...)
	r.cmd.Env = append(os.Environ(), "AGENTBOX_URL="+srv.URL, "AGENTBOX_TOKEN="+token, "OPENAI_API_KEY="+chatKey, "HOME="+t.TempDir())
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			r.cmd.Process.Kill()
			r.cmd.Wait()
		}
	})
	return r
}

func (r *chatProc) wait(t *testing.T) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		r.cmd.Process.Kill()
		t.Fatalf("agentbox chat did not end\n%s", r.stderr.String())
	}
	return r.cmd.ProcessState.ExitCode()
}

// TestChatEndToEnd: a real server with runc sandboxes, the real chat binary, the scripted
// model. A question is answered through run_python (in the conversation's own sandbox) and
// execute_sql over the audit log, asked for in one reply (parallel calls); the conversation is
// recorded with every step, visible over REST, in execute_sql's views and in the exports;
// the sandbox is destroyed at the end; the API key is in no record, log or transcript.
func TestChatEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abchat"), testToken)
	model := modelfake.New()
	defer model.Close()
	model.Key = chatKey
	model.Push(modelfake.Reply{Content: "Let me compute and look.", ToolCalls: []modelfake.ToolCall{
		{Name: "run_python", Args: `{"code":"import os\nprint(6*7, os.getcwd())"}`},
		{Name: "execute_sql", Args: `{"query":"SELECT count(*) AS n FROM audit_log WHERE tool = 'sandbox_create'"}`},
	}})
	model.Respond(func(r modelfake.Request) modelfake.Reply {
		return modelfake.Reply{Content: "python said: " + strings.TrimSpace(lastTool(r, "run_python")) + " | sql said: " + lastTool(r, "execute_sql")}
	})
	run := startChat(t, srv, model, "--json", "--tools", "run_python,execute_sql,fetch_metrics", "what is six times seven, and how many sandboxes were created?")
	if code := run.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, run.stdout.String(), run.stderr.String())
	}
	var res struct {
		ConversationID string `json:"conversation_id"`
		Answer         string `json:"answer"`
		SandboxID      string `json:"sandbox_id"`
		Messages       int    `json:"messages"`
	}
	if err := json.Unmarshal(run.stdout.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, run.stdout.String())
	}
	if !strings.Contains(res.Answer, "42 /workspace") || !strings.Contains(res.Answer, "(1 rows") || res.SandboxID == "" || res.Messages != 6 {
		t.Fatalf("result %+v\n%s", res, run.stderr.String())
	}
	reqs := model.Requests()
	if len(reqs) != 2 || len(reqs[0].Tools) != 3 || !reqs[0].Stream {
		t.Fatalf("model requests: %d, tools %v", len(reqs), reqs[0].Tools)
	}
	c := srv.Client()
	ctx := t.Context()
	d, err := c.GetConversation(ctx, res.ConversationID)
	if err != nil {
		t.Fatal(err)
	}
	roles := ""
	for _, m := range d.Transcript {
		roles += m.Role[:1]
	}
	if roles != "suatta" || d.SandboxID != res.SandboxID || d.Model != "fake-model" || d.Endpoint != model.URL || d.PromptTokens == 0 {
		t.Fatalf("recorded %q %+v", roles, d.Conversation)
	}
	for _, m := range d.Transcript {
		if m.Tool == "run_python" && m.DurationMS < 10 { // python3's start alone takes longer
			t.Fatalf("run_python's recorded duration: %d ms", m.DurationMS)
		}
	}
	// The sandbox was the conversation's own, and is gone.
	if sb, err := c.Get(ctx, res.SandboxID); err == nil && sb.State == wire.StateRunning {
		t.Fatalf("the conversation's sandbox still runs: %+v", sb)
	}
	// execute_sql's views show it.
	q, err := c.Query(ctx, "SELECT c.id, count(m.seq) FROM conversations c JOIN conversation_messages m ON m.conversation_id = c.id GROUP BY c.id", 0)
	if err != nil || q.RowCount != 1 {
		t.Fatalf("views: %+v %v", q, err)
	}
	// Exports.
	cli := func(args ...string) string {
		cmd := exec.CommandContext(ctx, srv.Bin, args...)
		cmd.Env = append(os.Environ(), "AGENTBOX_URL="+srv.URL, "AGENTBOX_TOKEN="+testToken)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	md := cli("chat", "export", res.ConversationID, "--format", "markdown")
	if !strings.Contains(md, "**Tool call** `run_python`") || !strings.Contains(md, "## User") || !strings.Contains(md, "42 /workspace") {
		t.Fatalf("markdown:\n%s", md)
	}
	js := cli("chat", "export", res.ConversationID, "--format", "json")
	var back wire.ConversationDetail
	if err := json.Unmarshal([]byte(js), &back); err != nil || len(back.Transcript) != 6 {
		t.Fatalf("json export: %v %d", err, len(back.Transcript))
	}
	if ls := cli("chat", "ls"); !strings.Contains(ls, res.ConversationID) {
		t.Fatalf("ls:\n%s", ls)
	}
	// The key: in no transcript, export, log, or file of the state dir.
	for what, s := range map[string]string{"markdown": md, "json": js, "server log": srv.Logs.String(), "chat output": run.stdout.String() + run.stderr.String()} {
		if strings.Contains(s, chatKey) {
			t.Fatalf("the API key is in the %s", what)
		}
	}
	filepath.WalkDir(srv.StateDir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(chatKey)) {
			t.Errorf("the API key is in %s", p)
		}
		return nil
	})
	if out := cli("chat", "rm", res.ConversationID); !strings.Contains(out, "deleted") {
		t.Fatal(out)
	}
	if _, err := c.GetConversation(ctx, res.ConversationID); !errcode.Is(err, errcode.ConversationNotFound) {
		t.Fatalf("after rm: %v", err)
	}
}

// TestChatInterruptAndKillThenResume: Ctrl-C while a tool runs stops the call and keeps the
// conversation (the call answered as canceled); SIGKILL of the chat process mid-step loses
// nothing recorded, and --resume answers the call left open and goes on, in the same
// sandbox, which it destroys at the end.
func TestChatInterruptAndKillThenResume(t *testing.T) {
	testenv.RequireRoot(t)
	srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abchatk"), testToken)
	c := srv.Client()
	ctx := t.Context()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			model := modelfake.New(modelfake.Reply{ToolCalls: []modelfake.ToolCall{{Name: "run_shell", Args: `{"code":"echo started > /workspace/mark; sleep 120"}`}}})
			defer model.Close()
			run := startChat(t, srv, model, "--json", "--keep", "start the long job")
			// Wait until the call runs in the sandbox.
			var conv wire.Conversation
			deadline := time.Now().Add(90 * time.Second)
			for {
				if time.Now().After(deadline) {
					t.Fatalf("the call never ran\n%s", run.stderr.String())
				}
				l, err := c.ListConversations(ctx, 1)
				if err == nil && len(l.Conversations) == 1 && l.Conversations[0].SandboxID != "" && l.Conversations[0].Messages >= 3 {
					conv = l.Conversations[0]
					if rc, _, err := c.ReadFile(ctx, conv.SandboxID, "/workspace/mark", 0, 0); err == nil {
						rc.Close()
						break
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			run.cmd.Process.Signal(sig)
			code := run.wait(t)
			want := 130
			if sig == syscall.SIGKILL {
				want = -1
			}
			if code != want {
				t.Fatalf("exit %d, want %d\n%s", code, want, run.stderr.String())
			}
			d, err := c.GetConversation(ctx, conv.ID)
			if err != nil {
				t.Fatal(err)
			}
			n := len(d.Transcript)
			if sig == syscall.SIGINT {
				if n != 4 || d.Transcript[3].Role != "tool" || !strings.Contains(d.Transcript[3].Content, "canceled by the user") {
					t.Fatalf("after Ctrl-C: %+v", d.Transcript)
				}
			} else if n != 3 || len(d.Transcript[2].ToolCalls) != 1 {
				t.Fatalf("after SIGKILL: %+v", d.Transcript)
			}
			// Resume: the model sees the whole history, well-formed, and answers.
			model.Push(modelfake.Reply{Content: "resumed fine"})
			res := startChat(t, srv, model, "--json", "--resume", conv.ID, "is it done?")
			if code := res.wait(t); code != 0 {
				t.Fatalf("resume exit %d\n%s\n%s", code, res.stdout.String(), res.stderr.String())
			}
			sent := model.Requests()[1].Messages
			if len(sent) != 5 || sent[3].Role != "tool" || sent[4].Text() != "is it done?" {
				t.Fatalf("resumed conversation sent: %+v", sent)
			}
			d, _ = c.GetConversation(ctx, conv.ID)
			if len(d.Transcript) != 6 || d.Transcript[5].Content != "resumed fine" || d.SandboxID != conv.SandboxID {
				t.Fatalf("after resume: %d messages, sandbox %s (was %s)", len(d.Transcript), d.SandboxID, conv.SandboxID)
			}
			if sig == syscall.SIGKILL && !strings.Contains(d.Transcript[3].Content, "stopped before this call returned") {
				t.Fatalf("the open call was answered %q", d.Transcript[3].Content)
			}
			// --keep on the first run kept the sandbox for the resume; the resume (no --keep)
			// destroys it.
			if sb, err := c.Get(ctx, conv.SandboxID); err == nil && sb.State == wire.StateRunning {
				t.Fatalf("sandbox still running after the resumed chat ended")
			}
			c.DeleteConversation(ctx, conv.ID)
		})
	}
}

// TestChatApprovalInTerminal: on a server gating run_python, the chat shows the call's tool,
// arguments and digest and asks; "y" on its input approves it (the call runs, once), "n"
// denies it (the model is told it was refused and the command never ran).
func TestChatApprovalInTerminal(t *testing.T) {
	testenv.RequireRoot(t)
	srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abchata"), testToken, "--approval-tools", "run_python", "--approval-timeout", "60s")
	for _, answer := range []string{"y", "n", "rest"} {
		t.Run(answer, func(t *testing.T) {
			model := modelfake.New(modelfake.Reply{ToolCalls: []modelfake.ToolCall{{Name: "run_python", Args: `{"code":"print('approved-' + 'ran')"}`}}})
			defer model.Close()
			model.Respond(func(r modelfake.Request) modelfake.Reply {
				return modelfake.Reply{Content: "tool said: " + lastTool(r, "run_python")}
			})
			run := &chatProc{}
			run.cmd = exec.Command(srv.Bin, "chat", "--base-url", model.URL, "--model", "fake-model", "--json", "run it")
			run.cmd.Env = append(os.Environ(), "AGENTBOX_URL="+srv.URL, "AGENTBOX_TOKEN="+srv.Token, "OPENAI_API_KEY="+chatKey, "HOME="+t.TempDir())
			stdin, err := run.cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			run.cmd.Stdout, run.cmd.Stderr = &run.stdout, &run.stderr
			if err := run.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer run.cmd.Process.Kill()
			deadline := time.Now().Add(90 * time.Second)
			for !strings.Contains(run.stderr.String(), "approve this call? [y/N]") {
				if time.Now().After(deadline) {
					t.Fatalf("no approval prompt\n%s", run.stderr.String())
				}
				time.Sleep(50 * time.Millisecond)
			}
			prompt := run.stderr.String()
			if !strings.Contains(prompt, "run_python") || !strings.Contains(prompt, "digest: ") || !strings.Contains(prompt, "approved-") {
				t.Fatalf("prompt does not show tool, arguments and digest:\n%s", prompt)
			}
			if answer == "rest" {
				// An operator approves over REST while the terminal asks: the prompt is
				// withdrawn and the loop goes on, with nothing typed.
				c := srv.Client()
				l, err := c.ListApprovals(t.Context(), wire.ApprovalPending, 0)
				if err != nil || len(l) != 1 {
					t.Fatalf("pending: %+v %v", l, err)
				}
				if _, err := c.DecideApproval(t.Context(), l[0].ID, true, "ok from the console"); err != nil {
					t.Fatal(err)
				}
				answer = "y"
			} else {
				stdin.Write([]byte(answer + "\n"))
			}
			if code := run.wait(t); code != 0 {
				t.Fatalf("exit %d\n%s", code, run.stderr.String())
			}
			if t.Name() == "TestChatApprovalInTerminal/rest" && !regexp.MustCompile(`approved elsewhere by .*\(ok from the console\)`).MatchString(run.stderr.String()) {
				t.Fatalf("the prompt does not say it was decided elsewhere:\n%s", run.stderr.String())
			}
			var res struct{ Answer string }
			json.Unmarshal(run.stdout.Bytes(), &res)
			if answer == "y" && !strings.Contains(res.Answer, "approved-ran") {
				t.Fatalf("approved call: %q\n%s", res.Answer, run.stderr.String())
			}
			if answer == "n" && (strings.Contains(res.Answer, "approved-ran") || !strings.Contains(res.Answer, "APPROVAL_REFUSED")) {
				t.Fatalf("denied call: %q\n%s", res.Answer, run.stderr.String())
			}
		})
	}
}

// TestChatInteractiveUnderTmux: the interactive chat in a terminal (a tmux pane), as a person
// uses it: /help, an unknown command and Ctrl-C at the prompt (none reaches the model); a
// question typed at the prompt, a gated call's approval asked and answered with y in the
// terminal, the answer shown; the next call's approval decided over REST while the terminal
// asks (the prompt withdrawn, the loop going on); the history recalled with the Up key, Ctrl-D
// to leave.
func TestChatInteractiveUnderTmux(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is not installed: `sudo make deps` installs it (apt-get install tmux)")
	}
	srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abchatt"), testToken, "--approval-tools", "run_python", "--approval-timeout", "60s")
	model := modelfake.New()
	defer model.Close()
	model.Respond(func(r modelfake.Request) modelfake.Reply {
		if last := r.Messages[len(r.Messages)-1]; last.Role == "user" { // a question: run a tool
			word := "tmux-approved"
			if strings.Contains(last.Text(), "second") {
				word = "rest-approved"
			}
			return modelfake.Reply{ToolCalls: []modelfake.ToolCall{{Name: "run_python", Args: `{"code":"print('` + word + `')"}`}}}
		}
		out := strings.Fields(lastTool(r, "run_python"))
		if len(out) == 0 {
			return modelfake.Reply{Content: "ANSWER none"}
		}
		return modelfake.Reply{Content: "ANSWER " + out[len(out)-1]} // the stdout's last word
	})
	sock := "abchat-" + filepath.Base(t.TempDir())
	tm := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("tmux", append([]string{"-L", sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %q: %v: %s", args, err, out)
		}
		return string(out)
	}
	t.Cleanup(func() { exec.Command("tmux", "-L", sock, "kill-server").Run() })
	waitFor := func(re string) string {
		t.Helper()
		rx := regexp.MustCompile(re)
		deadline := time.Now().Add(60 * time.Second)
		var screen string
		for time.Now().Before(deadline) {
			screen = tm("capture-pane", "-p", "-t", "c")
			if rx.MatchString(screen) {
				return screen
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("the pane never showed %q; it shows:\n%s", re, screen)
		return ""
	}
	cmd := "env AGENTBOX_URL=" + srv.URL + " AGENTBOX_TOKEN=" + srv.Token + " OPENAI_API_KEY=" + chatKey + " HOME=" + t.TempDir() + " TERM=xterm-256color " +
		srv.Bin + " chat --base-url " + model.URL + " --model fake-model; echo CHAT-EXIT=$?; sleep 600"
	tm("new-session", "-d", "-s", "c", "-x", "160", "-y", "40", cmd)
	screen := waitFor(`(?m)^>\s*$`) // (the pane drops trailing spaces)
	if !strings.Contains(screen, "/help helps") || !strings.Contains(screen, "tools of the server at "+srv.URL) {
		t.Fatalf("the greeting:\n%s", screen)
	}
	// What a new user tries first: /help, an unknown command, Ctrl-C at an empty prompt.
	tm("send-keys", "-t", "c", "/help", "Enter")
	waitFor(`(?s)/tools\s+the tools offered.*conversation \(none yet.*tools: .*run_python.*\n>\s*$`)
	tm("send-keys", "-t", "c", "/frobnicate", "Enter")
	waitFor(`/frobnicate: no such command \(/help lists them\)`)
	tm("send-keys", "-t", "c", "C-c")
	waitFor(`\(Ctrl-D or /exit ends the chat\)\s*\n>\s*$`)
	if len(model.Requests()) != 0 {
		t.Fatalf("a command reached the model: %d requests", len(model.Requests()))
	}
	tm("send-keys", "-t", "c", "run the tmux check", "Enter")
	screen = waitFor(`approve this call\? \[y/N\]`)
	if !strings.Contains(screen, "run_python") || !strings.Contains(screen, "digest: ") {
		t.Fatalf("the approval shows no tool or digest:\n%s", screen)
	}
	tm("send-keys", "-t", "c", "y", "Enter")
	waitFor(`ANSWER tmux-approved`)
	waitFor(`(?m)^>\s*$`)
	// The next call's approval is decided over REST while the terminal asks: the prompt is
	// withdrawn, the answer shows, and the prompt is back for a question.
	tm("send-keys", "-t", "c", "the second check", "Enter")
	waitFor(`(?s)print\('rest-approved'\).*approve this call\? \[y/N\]`)
	var pending []wire.Approval
	for deadline := time.Now().Add(30 * time.Second); len(pending) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		pending, _ = srv.Client().ListApprovals(t.Context(), wire.ApprovalPending, 0)
	}
	if len(pending) != 1 {
		t.Fatalf("pending approvals: %+v", pending)
	}
	if _, err := srv.Client().DecideApproval(t.Context(), pending[0].ID, true, "from the console"); err != nil {
		t.Fatal(err)
	}
	screen = waitFor(`(?s)approve this call\? \[y/N\]\s*\n\s*approved elsewhere by [^\n]*\(from the console\).*ANSWER rest-approved\s*\n>\s*$`)
	tm("send-keys", "-t", "c", "Up")
	waitFor(`(?m)^> the second check\s*\z`) // the newest question, not the "y" typed at an approval
	tm("send-keys", "-t", "c", "Up")
	waitFor(`(?m)^> run the tmux check\s*\z`)
	tm("send-keys", "-t", "c", "C-u")
	tm("send-keys", "-t", "c", "C-d")
	screen = waitFor(`CHAT-EXIT=\d+`)
	if !strings.Contains(screen, "CHAT-EXIT=0") || !strings.Contains(screen, "agentbox chat --resume conv-") {
		t.Fatalf("the chat's end:\n%s", screen)
	}
	if strings.Contains(screen, chatKey) {
		t.Fatal("the key shows in the terminal")
	}
}

// TestChatYesFollowsThePolicy: --yes reads the server's published approval policy. Without a
// policy an operate key runs unattended; with one gating a tool the chat offers, the operate
// key is refused before anything is recorded (a typed error saying what to change), and an
// admin key runs, its gated call approved without asking.
func TestChatYesFollowsThePolicy(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := t.Context()
	operateKey := func(srv *testenv.Server) string {
		k, err := srv.Client().CreateKey(ctx, wire.KeyCreateRequest{Name: "chat-yes", Scope: "operate"})
		if err != nil {
			t.Fatal(err)
		}
		return k.Secret
	}
	script := func() *modelfake.Server {
		model := modelfake.New(modelfake.Reply{ToolCalls: []modelfake.ToolCall{{Name: "run_python", Args: `{"code":"print('unattended-' + 'ran')"}`}}})
		model.Respond(func(r modelfake.Request) modelfake.Reply {
			return modelfake.Reply{Content: "tool said: " + lastTool(r, "run_python")}
		})
		return model
	}
	answer := func(run *chatProc) string {
		t.Helper()
		if code := run.wait(t); code != 0 {
			t.Fatalf("exit %d\n%s\n%s", code, run.stdout.String(), run.stderr.String())
		}
		var res struct{ Answer string }
		json.Unmarshal(run.stdout.Bytes(), &res)
		return res.Answer
	}

	t.Run("no policy, operate key", func(t *testing.T) {
		srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abchaty"), testToken)
		key := operateKey(srv)
		kc, err := client.NewTLS(srv.URL, key, client.TLS{Fingerprint: srv.Fingerprint})
		if err != nil {
			t.Fatal(err)
		}
		p, err := kc.ApprovalPolicy(ctx)
		if err != nil || p.Required || len(p.Tools) != 0 || p.CanDecide || !strings.Contains(p.CannotDecide, "admin") {
			t.Fatalf("policy seen by an operate key: %+v %v", p, err)
		}
		model := script()
		defer model.Close()
		if ans := answer(startChatAs(t, srv, key, model, "--json", "--yes", "--tools", "run_python", "run it")); !strings.Contains(ans, "unattended-ran") {
			t.Fatalf("answer %q", ans)
		}
	})

	t.Run("policy on", func(t *testing.T) {
		srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abchatp"), testToken, "--approval-tools", "run_python,file_write", "--approval-timeout", "60s")
		key := operateKey(srv)
		p, err := srv.Client().ApprovalPolicy(ctx)
		if err != nil || p.Required || strings.Join(p.Tools, ",") != "file_write,run_python" || !p.CanDecide || p.TimeoutSeconds != 60 {
			t.Fatalf("policy seen by the admin: %+v %v", p, err)
		}
		// The operate key: refused, nothing recorded, the error says what to change.
		model := script()
		defer model.Close()
		run := startChatAs(t, srv, key, model, "--yes", "--tools", "run_python,execute_sql", "run it")
		if code := run.wait(t); code == 0 {
			t.Fatalf("--yes ran with an operate key against a gating server\n%s", run.stdout.String())
		}
		errs := run.stderr.String()
		for _, want := range []string{"PERMISSION_DENIED", "run_python", "run without --yes", "scope admin"} {
			if !strings.Contains(errs, want) {
				t.Fatalf("the refusal does not say %q:\n%s", want, errs)
			}
		}
		if len(model.Requests()) != 0 {
			t.Fatal("the model was asked before the refusal")
		}
		if l, err := srv.Client().ListConversations(ctx, 0); err != nil || len(l.Conversations) != 0 {
			t.Fatalf("a refused --yes recorded %+v %v", l, err)
		}
		// The same key, offered only tools the policy does not hold: runs.
		quiet := modelfake.New(modelfake.Reply{ToolCalls: []modelfake.ToolCall{{Name: "run_shell", Args: `{"code":"echo $((6*7))"}`}}})
		defer quiet.Close()
		quiet.Respond(func(r modelfake.Request) modelfake.Reply {
			return modelfake.Reply{Content: "shell said: " + lastTool(r, "run_shell")}
		})
		if ans := answer(startChatAs(t, srv, key, quiet, "--json", "--yes", "--tools", "run_shell", "six times seven?")); !strings.Contains(ans, "42") {
			t.Fatalf("answer %q", ans)
		}
		// The admin key: runs, the gated call approved without asking.
		if ans := answer(startChat(t, srv, model, "--json", "--yes", "--tools", "run_python", "run it")); !strings.Contains(ans, "unattended-ran") {
			t.Fatalf("answer %q", ans)
		}
		l, err := srv.Client().ListApprovals(ctx, wire.ApprovalUsed, 0)
		if err != nil || len(l) != 1 || l[0].Tool != "run_python" || !strings.Contains(l[0].Reason, "agentbox chat") {
			t.Fatalf("approvals: %+v %v", l, err)
		}
	})
}

// TestChatOverStdio: with no server answering, the chat spawns `agentbox mcp` over stdio (its
// control plane in process) and keeps the conversation there through api_call; a Ctrl-C sent
// to the terminal's process group interrupts the question without stopping the tools' process,
// so the next question runs; a resume over stdio continues it; a server started later on the
// state dir shows it whole, the sandbox destroyed. With --stdio and a server running, `agentbox
// mcp` relays to it and the server keeps the conversation.
func TestChatOverStdio(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := t.Context()
	t.Run("no server", func(t *testing.T) {
		dir := testenv.ShortTempDir(t, "abchats")
		id, _ := statedir.Identity(dir)
		t.Cleanup(func() { removeCgroupParent(id) })
		model := modelfake.New(modelfake.Reply{ToolCalls: []modelfake.ToolCall{{Name: "run_shell", Args: `{"code":"echo started > /workspace/mark; sleep 120"}`}}})
		defer model.Close()
		model.Push(modelfake.Reply{ToolCalls: []modelfake.ToolCall{{Name: "run_python", Args: `{"code":"print('after-ctrl-c-' + str(6*7))"}`}}})
		model.Respond(func(r modelfake.Request) modelfake.Reply {
			return modelfake.Reply{Content: "python said: " + strings.TrimSpace(lastTool(r, "run_python"))}
		})
		run := &chatProc{}
		run.cmd = exec.Command(testenv.Binary(t), "chat", "--base-url", model.URL, "--model", "fake-model", "--state-dir", dir, "--tools", "run_shell,run_python")
		// No server where the CLI looks: the dead port, and a state dir with none.
		run.cmd.Env = append(os.Environ(), "AGENTBOX_URL=http://127.0.0.1:1", "AGENTBOX_TOKEN=unused", "OPENAI_API_KEY="+chatKey, "HOME="+t.TempDir())
		run.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a terminal's foreground group of its own
		stdin, err := run.cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		run.cmd.Stdout, run.cmd.Stderr = &run.stdout, &run.stderr
		if err := run.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer run.cmd.Process.Kill()
		stdin.Write([]byte("start the long job\n"))
		deadline := time.Now().Add(90 * time.Second)
		for !strings.Contains(run.stderr.String(), "→ run_shell") || len(model.Requests()) < 1 {
			if time.Now().After(deadline) {
				t.Fatalf("the call never started\n%s", run.stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		syscall.Kill(-run.cmd.Process.Pid, syscall.SIGINT) // Ctrl-C: the whole foreground group
		for !strings.Contains(run.stderr.String(), "CANCELED") && !strings.Contains(run.stderr.String(), "canceled") {
			if time.Now().After(deadline) {
				t.Fatalf("Ctrl-C did not interrupt the question\n%s", run.stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		stdin.Write([]byte("what is in the mark?\n"))
		stdin.Close() // then end the session
		if code := run.wait(t); code != 0 {
			t.Fatalf("exit %d\n%s\n%s", code, run.stdout.String(), run.stderr.String())
		}
		if out := run.stdout.String(); !strings.Contains(out, "python said: ") || !strings.Contains(out, "after-ctrl-c-42") {
			t.Fatalf("the second question after Ctrl-C: %q\n%s", out, run.stderr.String())
		}
		m := regexp.MustCompile(`agentbox chat --resume (conv-\S+)`).FindStringSubmatch(run.stderr.String())
		if m == nil {
			t.Fatalf("no conversation id:\n%s", run.stderr.String())
		}
		// Resume over stdio (found by itself: still no server).
		model.Push(modelfake.Reply{Content: "resumed over stdio"})
		res := &chatProc{}
		res.cmd = exec.Command(testenv.Binary(t), "chat", "--base-url", model.URL, "--model", "fake-model", "--state-dir", dir, "--json", "--resume", m[1], "and now?")
		res.cmd.Env = run.cmd.Env
		res.cmd.Stdout, res.cmd.Stderr = &res.stdout, &res.stderr
		if err := res.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if code := res.wait(t); code != 0 || !strings.Contains(res.stdout.String(), "resumed over stdio") {
			t.Fatalf("resume over stdio: exit %d\n%s\n%s", code, res.stdout.String(), res.stderr.String())
		}
		if sent := model.Requests()[len(model.Requests())-1].Messages; len(sent) < 9 {
			t.Fatalf("the resumed conversation sent %d messages", len(sent))
		}
		// The state dir's own server sees it all (and could start: no `agentbox mcp` holds
		// the state dir any more).
		srv := testenv.StartServerDefaults(t, dir, testToken)
		d, err := srv.Client().GetConversation(ctx, m[1])
		if err != nil {
			t.Fatal(err)
		}
		roles := ""
		for _, msg := range d.Transcript {
			roles += msg.Role[:1]
		}
		// system, user, the call, canceled; user, call, result, answer; user, answer
		if roles != "suatuataua" || !strings.Contains(d.Transcript[3].Content, "canceled by the user") || d.SandboxID == "" {
			t.Fatalf("kept in the state dir: %q %+v", roles, d.Conversation)
		}
		if sb, err := srv.Client().Get(ctx, d.SandboxID); err == nil && sb.State == wire.StateRunning {
			t.Fatalf("the conversation's sandbox still runs: %+v", sb)
		}
		if strings.Contains(run.stderr.String()+res.stderr.String(), chatKey) {
			t.Fatal("the key shows in the chat's output")
		}
	})
	t.Run("--stdio relays to the server", func(t *testing.T) {
		srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abchatr"), testToken)
		model := modelfake.New(modelfake.Reply{ToolCalls: []modelfake.ToolCall{{Name: "run_python", Args: `{"code":"print(6*7)"}`}}})
		defer model.Close()
		model.Respond(func(r modelfake.Request) modelfake.Reply {
			return modelfake.Reply{Content: "python said: " + strings.TrimSpace(lastTool(r, "run_python"))}
		})
		run := startChat(t, srv, model, "--stdio", "--json", "six times seven?")
		if code := run.wait(t); code != 0 {
			t.Fatalf("exit %d\n%s\n%s", code, run.stdout.String(), run.stderr.String())
		}
		var res struct {
			ConversationID string `json:"conversation_id"`
			Answer         string `json:"answer"`
			SandboxID      string `json:"sandbox_id"`
		}
		if err := json.Unmarshal(run.stdout.Bytes(), &res); err != nil || !strings.HasPrefix(res.Answer, "python said: ") || !strings.HasSuffix(res.Answer, "\n42") {
			t.Fatalf("%v: %s\n%s", err, run.stdout.String(), run.stderr.String())
		}
		d, err := srv.Client().GetConversation(ctx, res.ConversationID)
		if err != nil || len(d.Transcript) != 5 || d.SandboxID != res.SandboxID {
			t.Fatalf("kept by the server: %+v %v", d.Conversation, err)
		}
		if sb, err := srv.Client().Get(ctx, res.SandboxID); err == nil && sb.State == wire.StateRunning {
			t.Fatalf("the conversation's sandbox still runs: %+v", sb)
		}
		// The tools' calls came through the relay's MCP session: the audit log says mcp.
		q, err := srv.Client().Query(ctx, "SELECT count(*) FROM audit_log WHERE tool = 'run_python' AND surface = 'mcp'", 0)
		if err != nil || q.RowCount != 1 || fmt.Sprint(q.Rows[0][0]) != "1" {
			t.Fatalf("audit: %+v %v", q, err)
		}
	})
}

// TestChatMissingKey: against OpenAI's endpoint without a key the chat stops before anything
// starts, saying what to set.
func TestChatMissingKey(t *testing.T) {
	cmd := exec.Command(testenv.Binary(t), "chat", "what is up?")
	cmd.Env = append(os.Environ(), "OPENAI_API_KEY=", "OPENAI_BASE_URL=", "AGENTBOX_URL=http://127.0.0.1:1", "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v\n%s", err, out)
	}
	for _, want := range []string{"MODEL_AUTH_FAILED", "$OPENAI_API_KEY is empty", "--api-key-env", "--base-url"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("the error does not say %q:\n%s", want, out)
		}
	}
}
