package mcpserver

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Prompt names.
const (
	PromptTestRepo     = "test-repo-in-clean-sandbox"
	PromptReproduceBug = "reproduce-bug-in-clean-machine"
)

func (s *Server) addPrompts() {
	s.mcp.AddPrompt(&mcp.Prompt{
		Name:        PromptTestRepo,
		Title:       "Test a repository in a clean sandbox",
		Description: "Copy a repository into a fresh sandbox, run its tests there, report the result and clean up.",
		Arguments: []*mcp.PromptArgument{
			{Name: "repo", Title: "Repository", Description: "The repository to test: a local path (or URL of a checkout you have locally).", Required: true},
			{Name: "command", Title: "Test command", Description: "The command that runs the tests, e.g. \"go test ./...\"; default: work it out from the repository."},
		},
	}, s.promptTestRepo)
	s.mcp.AddPrompt(&mcp.Prompt{
		Name:        PromptReproduceBug,
		Title:       "Reproduce a bug on a clean machine",
		Description: "Reproduce a reported bug in a fresh sandbox, with the smallest steps that show it, and report what happened.",
		Arguments: []*mcp.PromptArgument{
			{Name: "description", Title: "Bug description", Description: "What goes wrong, with any error messages and the steps known so far.", Required: true},
			{Name: "repo", Title: "Repository", Description: "The repository involved, if any: a local path."},
		},
	}, s.promptReproduceBug)
}

const sandboxFacts = `Facts about agentbox sandboxes:
- They have NO network: nothing can be cloned, downloaded or installed from the internet inside them. Bring files in with file_write (text as content, binary as content_base64, at most 10 MiB per call). For a whole repository, make an archive on your side (e.g. git archive --format=tar.gz HEAD, or tar czf), write it with content_base64 (split into parts over 10 MiB and join them with cat), then exec ["tar", "-xzf", "repo.tar.gz", "-C", "/workspace/repo"] after ["mkdir", "-p", "/workspace/repo"].
- The host's tools are there read-only (sh, coreutils, git, python3, and whatever else the host has in /usr); /workspace is writable and the default working directory.
- exec takes an argv array, not a shell string: use ["sh", "-c", "..."] for pipes and redirection. A non-zero exit_code is a result to read, not a tool failure.
- Commands longer than about a minute: run them in the background (["sh", "-c", "nohup CMD > /workspace/out.log 2>&1 &"]) and poll the log.
- Errors say what to change: CAPACITY_UNAVAILABLE means wait or destroy sandboxes you do not need; SANDBOX_NOT_RUNNING means the sandbox is gone, create a new one.`

func argOr(req *mcp.GetPromptRequest, name, def string) string {
	if v := strings.TrimSpace(req.Params.Arguments[name]); v != "" {
		return v
	}
	return def
}

func requireArg(req *mcp.GetPromptRequest, name, what string) (string, error) {
	v := strings.TrimSpace(req.Params.Arguments[name])
	if v == "" {
		return "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("prompt %s: missing required argument %q: %s", req.Params.Name, name, what)}
	}
	return v, nil
}

func userPrompt(desc, text string) *mcp.GetPromptResult {
	return &mcp.GetPromptResult{Description: desc, Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: text}}}}
}

func (s *Server) promptTestRepo(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	repo, err := requireArg(req, "repo", "the repository to test (a local path)")
	if err != nil {
		return nil, err
	}
	cmd := argOr(req, "command", "")
	run := "Work out the test command from the repository (Makefile, go.mod, package.json, pyproject.toml, …) and run it."
	if cmd != "" {
		run = fmt.Sprintf("Run the tests with: %s (as exec [\"sh\", \"-c\", %q] with cwd /workspace/repo).", cmd, cmd)
	}
	text := fmt.Sprintf(`Test the repository %s in a clean agentbox sandbox, so that nothing on this machine affects the result.

1. sandbox_create with a ttl_seconds that fits the job (e.g. 1800) and note its sandbox_id.
2. Copy the repository in: archive it on your side (only tracked files, e.g. git archive), file_write it to /workspace/repo.tar.gz with content_base64, then exec ["sh", "-c", "mkdir -p /workspace/repo && tar -xzf /workspace/repo.tar.gz -C /workspace/repo"].
3. %s
4. Report: the exact command, the exit code, and the failing tests with their error output (read long logs with file_read and offset/length rather than dumping them).
5. sandbox_destroy the sandbox when you are done, also when something failed.

%s`, repo, run, sandboxFacts)
	return userPrompt("Test "+repo+" in a clean sandbox", text), nil
}

func (s *Server) promptReproduceBug(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	desc, err := requireArg(req, "description", "what goes wrong")
	if err != nil {
		return nil, err
	}
	repo := argOr(req, "repo", "")
	bring := "If the bug needs files from this machine, copy in only what it needs with file_write."
	if repo != "" {
		bring = fmt.Sprintf("Copy the repository %s in: archive it on your side (e.g. git archive), file_write it with content_base64 to /workspace/repo.tar.gz and extract it into /workspace/repo with exec.", repo)
	}
	text := fmt.Sprintf(`Reproduce this bug on a clean machine (an agentbox sandbox), starting from nothing:

%s

1. sandbox_create (ttl_seconds about as long as you expect to need) and note its sandbox_id.
2. %s
3. Find the smallest sequence of exec steps that shows the bug. Keep every command you ran and its output.
4. Report whether it reproduced, the minimal steps (exact argv), the observed versus expected output, and what the clean environment rules out.
5. sandbox_destroy the sandbox when you are done.

%s`, desc, bring, sandboxFacts)
	return userPrompt("Reproduce a bug in a clean sandbox", text), nil
}

// complete answers completion/complete: sandbox ids for the sandbox resource template, and
// common test commands for the test prompt. Anything else gets no suggestions.
func (s *Server) complete(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	ref, arg := req.Params.Ref, req.Params.Argument
	var values []string
	switch {
	case ref.Type == "ref/resource" && ref.URI == URISandboxTemplate && arg.Name == "id":
		values = s.completeIDs(ctx, req.Session, arg.Value)
	case ref.Type == "ref/prompt" && ref.Name == PromptTestRepo && arg.Name == "command":
		for _, c := range []string{"go test ./...", "make test", "npm test", "pytest", "python3 -m pytest", "python3 -m unittest", "cargo test", "mvn test", "./gradlew test"} {
			if strings.HasPrefix(c, arg.Value) {
				values = append(values, c)
			}
		}
	}
	res := &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{}, Total: len(values)}}
	if len(values) > 100 {
		values, res.Completion.HasMore = values[:100], true
	}
	res.Completion.Values = append(res.Completion.Values, values...)
	return res, nil
}

// completeIDs suggests ids starting with prefix: the caller's sandboxes first, then the other
// live ones on the control plane.
func (s *Server) completeIDs(ctx context.Context, ss *mcp.ServerSession, prefix string) []string {
	held := s.held.ids(s.ownerOf(ctx, ss))
	isHeld := map[string]bool{}
	var out []string
	for _, id := range held {
		isHeld[id] = true
		if strings.HasPrefix(id, prefix) {
			out = append(out, id)
		}
	}
	principal, _ := authz.ListPrincipal(ctx) // another principal's ids are never offered
	all, err := s.b.List(ctx, sandbox.ListFilter{States: []sandbox.State{sandbox.StateCreating, sandbox.StateRunning}, Limit: sandbox.MaxList, Principal: principal})
	if err != nil {
		return out
	}
	var others []string
	for _, sb := range all {
		if !isHeld[sb.ID] && strings.HasPrefix(sb.ID, prefix) {
			others = append(others, sb.ID)
		}
	}
	sort.Strings(others)
	return append(out, others...)
}
