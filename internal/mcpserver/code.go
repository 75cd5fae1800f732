package mcpserver

import (
	"context"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/interp"
)

// RunCodeCellIn is run_code's arguments.
type RunCodeCellIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox whose interpreter runs the code (one from sandbox_create)"`
	Code      string `json:"code" jsonschema:"Python source: statements, then optionally an expression whose value is the result (like a notebook cell)"`
	Language  string `json:"language,omitempty" jsonschema:"python (the default and only language)"`
	ContextID string `json:"context_id,omitempty" jsonschema:"a context from code_context_create; omitted: the sandbox's default context"`
}

// CodeContextIn is code_context_create's arguments.
type CodeContextIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox whose interpreter gets the context"`
	Language  string `json:"language,omitempty" jsonschema:"python (the default and only language)"`
	Cwd       string `json:"cwd,omitempty" jsonschema:"the context's working directory (absolute); default the interpreter's"`
}

func (s *Server) interpreter() (*interp.Manager, error) {
	if s.opts.Interpreter == nil {
		return nil, errcode.New(errcode.UnsupportedOp, "the code interpreter runs only in agentbox serve or agentbox mcp's own control plane; this MCP server has none")
	}
	return s.opts.Interpreter, nil
}

func (s *Server) addCodeTools() {
	addTool(s, &mcp.Tool{
		Name:  "run_code",
		Title: "Run code in a stateful interpreter",
		Description: `Run a Python cell in the sandbox's long-lived interpreter: variables, imports and functions stay for the next call (run_code("x = 41") then run_code("x + 1") gives 42), per context (code_context_create makes a fresh one; without context_id the sandbox's default context).
Reply: {results: [{is_main_result, text, html, png, …}] (the last expression's value as a MIME bundle, and what display() showed), logs: {stdout: [...], stderr: [...]}, exception: {name, value, traceback} (what the cell raised: a normal result, not a tool error), execution_count}.
The interpreter starts on first use (python3 must be in the image: the host image has it) and ends with the sandbox; a call cancelled mid-cell ends it too (its state is lost). For one-off scripts in a fresh sandbox use run_python.
` + errorsDoc(errNotFound, errNotRunning, errInvalid, "FILE_NOT_FOUND (no such context_id: create one with code_context_create)", "UNSUPPORTED_OPERATION (the sandbox has no python3)"),
		Annotations: &mcp.ToolAnnotations{Title: "Run code in a stateful interpreter", DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["code"].MaxLength = ptr(interp.MaxCode)
		in.Properties["language"].Enum = []any{"python"}
	}, func(ctx context.Context, req *mcp.CallToolRequest, in RunCodeCellIn) (interp.Execution, string, error) {
		m, err := s.interpreter()
		if err != nil {
			return interp.Execution{}, "", err
		}
		if in.SandboxID == "" {
			return interp.Execution{}, "", errcode.New(errcode.InvalidArgument, "sandbox_id is required (create one with sandbox_create)")
		}
		ex, err := m.Run(ctx, in.SandboxID, interp.ExecuteRequest{Code: in.Code, Language: in.Language, ContextID: in.ContextID})
		return ex, "", err
	})
	addTool(s, &mcp.Tool{
		Name:  "code_context_create",
		Title: "Create a code context",
		Description: `Create a fresh context (its own variables) in the sandbox's interpreter, for run_code's context_id.
Reply: {id, language, cwd}.
` + errorsDoc(errNotFound, errNotRunning, errInvalid, "UNSUPPORTED_OPERATION (the sandbox has no python3)"),
		Annotations: &mcp.ToolAnnotations{Title: "Create a code context", DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["language"].Enum = []any{"python"}
	}, func(ctx context.Context, req *mcp.CallToolRequest, in CodeContextIn) (interp.Context, string, error) {
		m, err := s.interpreter()
		if err != nil {
			return interp.Context{}, "", err
		}
		if in.SandboxID == "" {
			return interp.Context{}, "", errcode.New(errcode.InvalidArgument, "sandbox_id is required (create one with sandbox_create)")
		}
		c, err := m.CreateContext(ctx, in.SandboxID, in.Language, in.Cwd)
		return c, "", err
	})
}
