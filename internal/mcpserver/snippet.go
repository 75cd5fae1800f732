package mcpserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/snippet"
)

// SnippetRunner runs run_python and run_shell: a Backend that has it (the REST client's, which
// sends POST /v1/run_python to the server) is used as it is; else a snippet.Runner over the
// Backend's own methods.
type SnippetRunner interface {
	RunSnippet(ctx context.Context, lang snippet.Language, req snippet.Request) (snippet.Result, error)
}

// localSnippets runs snippets over the Backend's methods (in process).
type localSnippets struct{ r *snippet.Runner }

func (l localSnippets) RunSnippet(ctx context.Context, lang snippet.Language, req snippet.Request) (snippet.Result, error) {
	return l.r.Run(ctx, lang, req)
}

func (s *Server) snippets() SnippetRunner {
	if r, ok := s.b.(SnippetRunner); ok {
		return r
	}
	return localSnippets{snippet.New(s.b)}
}

// RunCodeIn are run_python's and run_shell's arguments.
type RunCodeIn struct {
	Code           string  `json:"code" jsonschema:"The program (at most 1 MiB)."`
	SandboxID      string  `json:"sandbox_id,omitempty" jsonschema:"Run in this existing sandbox (it is never destroyed, and files persist between calls); omit for a fresh locked-down sandbox."`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty" jsonschema:"Kill the program after this many seconds; default 30, at most 600."`
	Network        any     `json:"network,omitempty"`
	Keep           bool    `json:"keep,omitempty" jsonschema:"Keep the fresh sandbox afterwards (with the server's default TTL) instead of destroying it, to read its files with file_read or run more code in it with sandbox_id."`
	MaxOutputBytes int64   `json:"max_output_bytes,omitempty" jsonschema:"Output kept per stream; default 1048576 (1 MiB), at most 16777216. The rest is counted, not kept."`
}

// RunValue is the last expression's value.
type RunValue struct {
	Repr          string `json:"repr" jsonschema:"repr() of the value (at most 64 KiB)."`
	Type          string `json:"type" jsonschema:"The value's Python type name."`
	ReprTruncated bool   `json:"repr_truncated,omitempty" jsonschema:"True when repr was cut."`
	JSON          any    `json:"json,omitempty" jsonschema:"The value itself when it is simple JSON (numbers, strings, booleans, lists and dicts of them, at most 64 KiB)."`
}

// RunException is an uncaught exception.
type RunException struct {
	Type      string `json:"type" jsonschema:"The exception's class name, e.g. ZeroDivisionError."`
	Message   string `json:"message" jsonschema:"str() of the exception."`
	Traceback string `json:"traceback" jsonschema:"The traceback, from the snippet's own frames (at most 64 KiB)."`
}

// RunArtifact is a file the code wrote under /workspace/out.
type RunArtifact struct {
	Path     string    `json:"path" jsonschema:"Absolute path in the sandbox."`
	Size     int64     `json:"size" jsonschema:"Size in bytes."`
	ModTime  time.Time `json:"mod_time" jsonschema:"Last modification (RFC 3339)."`
	MimeType string    `json:"mime_type,omitempty" jsonschema:"For images: image/png, image/jpeg, image/gif or image/svg+xml."`
	Inline   bool      `json:"inline,omitempty" jsonschema:"True when the file is returned in this result as an image content block."`
}

// RunCodeOut is run_python's and run_shell's reply. A program that raised or exited non-zero is
// a result, not an error.
type RunCodeOut struct {
	SandboxID          string        `json:"sandbox_id" jsonschema:"The sandbox the code ran in."`
	Kept               bool          `json:"kept" jsonschema:"True when the sandbox still exists (a given sandbox_id, or keep: true); false: it was destroyed."`
	ExitCode           int           `json:"exit_code" jsonschema:"The interpreter's exit status; 128+n when signal n killed it."`
	Stdout             string        `json:"stdout" jsonschema:"Standard output (as much as was kept)."`
	Stderr             string        `json:"stderr" jsonschema:"Standard error (as much as was kept)."`
	StdoutBytes        int64         `json:"stdout_bytes" jsonschema:"Total bytes written to stdout."`
	StderrBytes        int64         `json:"stderr_bytes" jsonschema:"Total bytes written to stderr."`
	Truncated          bool          `json:"truncated" jsonschema:"True when stdout or stderr was longer than max_output_bytes and was cut."`
	TimedOut           bool          `json:"timed_out" jsonschema:"True when timeout_seconds passed and the program was killed."`
	OOMKilled          bool          `json:"oom_killed,omitempty" jsonschema:"True when the sandbox ran out of memory."`
	DurationMs         int64         `json:"duration_ms" jsonschema:"Wall time of the program in milliseconds."`
	SetupMs            int64         `json:"setup_ms" jsonschema:"Milliseconds spent before it started (creating the sandbox, writing the code)."`
	Value              *RunValue     `json:"value,omitempty" jsonschema:"run_python: the value of the last statement when it is an expression (like a notebook cell) and not None."`
	Exception          *RunException `json:"exception,omitempty" jsonschema:"run_python: the uncaught exception, if one was raised."`
	Artifacts          []RunArtifact `json:"artifacts" jsonschema:"Files the code wrote under /workspace/out (at most 20); small images are also returned inline as image content."`
	ArtifactsTruncated bool          `json:"artifacts_truncated,omitempty" jsonschema:"True when there were more files than listed."`
	images             []mcp.Content // inline images, as content blocks after the text
}

func (o RunCodeOut) extraContent() []mcp.Content { return o.images }

const runCodeCommon = `Arguments: code (required), sandbox_id (run in that existing sandbox instead: it is never destroyed, and its files and installed packages are there), timeout_seconds (default 30, at most 600), network (fresh sandbox only; "none" by default, or {"allow": ["pypi.org", …]}), keep (keep the fresh sandbox afterwards, with the server's default TTL, to file_read its artifacts or run more code with its sandbox_id; otherwise it is destroyed when the call returns), max_output_bytes (default 1 MiB per stream).
A fresh sandbox is the server's default shape (1 CPU, 512 MiB, no network unless asked), with a TTL of timeout + 60 s unless kept. Files written under /workspace/out (created for you; the working directory is /workspace) come back as artifacts: {path, size, mime_type}; PNG, JPEG, GIF and SVG images up to 1 MiB are also returned inline as image content. At most 20 files are listed; with sandbox_id, only the files modified during this run.
`

func (s *Server) addSnippetTools() {
	tweak := func(in *jsonschema.Schema) {
		in.Properties["code"].MinLength = ptr(1)
		in.Properties["code"].MaxLength = ptr(snippet.MaxCodeBytes)
		in.Properties["network"] = networkSchema()
		in.Properties["timeout_seconds"].Minimum = ptr(0.0)
		in.Properties["timeout_seconds"].Maximum = ptr(snippet.MaxTimeout.Seconds())
		in.Properties["max_output_bytes"].Minimum = ptr(0.0)
		in.Properties["max_output_bytes"].Maximum = ptr(float64(snippet.MaxOutputBytes))
	}
	addTool(s, &mcp.Tool{
		Name:  "run_python",
		Title: "Run Python code",
		Description: `Run a Python snippet with python3 in a fresh, locked-down sandbox (or in a given sandbox_id) and get its result in one call, like a notebook cell: no need to create, write files, exec and destroy.
` + runCodeCommon + `Reply: {sandbox_id, kept, exit_code, stdout, stderr, truncated, timed_out, duration_ms, setup_ms, value: {repr, type, json} (the last statement's value when it is an expression, e.g. "df.describe()" or "1+1"), exception: {type, message, traceback} (an uncaught exception: a normal result, not a tool error), artifacts: [{path, size, mime_type, inline}]}.
Print or end with an expression to see results; write plots with matplotlib's savefig("/workspace/out/plot.png") to see them. The host image has the host's python3 and its installed modules; pip needs network: {"allow": ["pypi.org", "files.pythonhosted.org"]}.
` + errorsDoc(errNotFound, errNotRunning, errInvalid, "UNSUPPORTED_OPERATION (the sandbox has no python3: use run_shell or a Python image)",
			"CAPACITY_UNAVAILABLE (the server is full: destroy sandboxes you no longer need, or wait, then retry)"),
		Annotations: &mcp.ToolAnnotations{Title: "Run Python code", DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, tweak, func(ctx context.Context, req *mcp.CallToolRequest, in RunCodeIn) (RunCodeOut, string, error) {
		return s.runCode(ctx, req, snippet.Python, in)
	})
	addTool(s, &mcp.Tool{
		Name:  "run_shell",
		Title: "Run a shell script",
		Description: `Run a shell snippet (sh -c CODE, as the sandbox's unprivileged user) in a fresh, locked-down sandbox (or in a given sandbox_id) and get its output in one call. It runs inside the sandbox only, never on the user's machine.
` + runCodeCommon + `Reply: {sandbox_id, kept, exit_code, stdout, stderr, truncated, timed_out, duration_ms, setup_ms, artifacts: [{path, size, mime_type, inline}]}. A non-zero exit_code is a normal result (read stderr).
` + errorsDoc(errNotFound, errNotRunning, errInvalid, "CAPACITY_UNAVAILABLE (the server is full: destroy sandboxes you no longer need, or wait, then retry)"),
		Annotations: &mcp.ToolAnnotations{Title: "Run a shell script", DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, tweak, func(ctx context.Context, req *mcp.CallToolRequest, in RunCodeIn) (RunCodeOut, string, error) {
		return s.runCode(ctx, req, snippet.Shell, in)
	})
}

func (s *Server) runCode(ctx context.Context, call *mcp.CallToolRequest, lang snippet.Language, in RunCodeIn) (RunCodeOut, string, error) {
	nw, err := networkArg(in.Network)
	if err != nil {
		return RunCodeOut{}, "", err
	}
	req := snippet.Request{Code: in.Code, SandboxID: in.SandboxID, TimeoutSeconds: in.TimeoutSeconds, Network: nw, Keep: in.Keep, MaxOutputBytes: in.MaxOutputBytes}
	if err := snippet.Check(req); err != nil {
		return RunCodeOut{}, "", err
	}
	fresh := in.SandboxID == ""
	if fresh && in.Keep {
		s.pruneSessions()
		if s.held.full() {
			return RunCodeOut{}, "", errcode.New(errcode.CapacityUnavailable, "this MCP server already tracks %d sandboxes; destroy the ones you no longer need (sandbox_list shows them) and retry, or run without keep", maxHeld)
		}
	}
	owner, session := s.ownerOf(ctx, call.Session)
	res, err := s.snippets().RunSnippet(sandbox.WithOwner(ctx, owner), lang, req)
	if fresh && in.Keep && res.SandboxID != "" {
		s.held.add(owner, session, res.SandboxID) // sandbox_list shows it; sandbox_destroy ends it
	}
	if err != nil {
		return RunCodeOut{}, "", err
	}
	out := RunCodeOut{SandboxID: res.SandboxID, Kept: res.Kept, ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutBytes: res.StdoutBytes, StderrBytes: res.StderrBytes, Truncated: res.Truncated, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
		DurationMs: res.DurationMs, SetupMs: res.SetupMs, ArtifactsTruncated: res.ArtifactsTruncated, Artifacts: []RunArtifact{}}
	if v := res.Value; v != nil {
		out.Value = &RunValue{Repr: v.Repr, Type: v.Type, ReprTruncated: v.ReprTruncated, JSON: v.JSON}
	}
	if e := res.Exception; e != nil {
		out.Exception = &RunException{Type: e.Type, Message: e.Message, Traceback: e.Traceback}
	}
	for _, a := range res.Artifacts {
		ra := RunArtifact{Path: a.Path, Size: a.Size, ModTime: a.ModTime, MimeType: a.MimeType}
		if a.Inline {
			if b, err := base64.StdEncoding.DecodeString(a.Base64); err == nil {
				ra.Inline = true
				out.images = append(out.images, &mcp.ImageContent{Data: b, MIMEType: a.MimeType})
			}
		}
		out.Artifacts = append(out.Artifacts, ra)
	}
	return out, renderRunCode(lang, out), nil
}

// renderRunCode is the text of a run: what happened, the value or exception, then the output.
func renderRunCode(lang snippet.Language, o RunCodeOut) string {
	var b strings.Builder
	switch {
	case o.TimedOut:
		fmt.Fprintf(&b, "Timed out after %d ms (killed)", o.DurationMs)
	case o.Exception != nil:
		fmt.Fprintf(&b, "Raised %s: %s (%d ms)", o.Exception.Type, o.Exception.Message, o.DurationMs)
	default:
		fmt.Fprintf(&b, "Exit code %d (%d ms)", o.ExitCode, o.DurationMs)
	}
	if o.Kept {
		fmt.Fprintf(&b, " in sandbox %s (kept).\n", o.SandboxID)
	} else {
		fmt.Fprintf(&b, " in a fresh sandbox, destroyed.\n")
	}
	if o.Value != nil {
		fmt.Fprintf(&b, "Value (%s): %s\n", o.Value.Type, o.Value.Repr)
	}
	if o.Exception != nil && o.Exception.Traceback != "" {
		fmt.Fprintf(&b, "%s", o.Exception.Traceback)
		if !strings.HasSuffix(o.Exception.Traceback, "\n") {
			b.WriteByte('\n')
		}
	}
	if o.Stdout != "" {
		fmt.Fprintf(&b, "--- stdout (%d bytes) ---\n%s\n", o.StdoutBytes, strings.TrimRight(o.Stdout, "\n"))
	}
	if o.Stderr != "" {
		fmt.Fprintf(&b, "--- stderr (%d bytes) ---\n%s\n", o.StderrBytes, strings.TrimRight(o.Stderr, "\n"))
	}
	if o.Truncated {
		b.WriteString("[output truncated at max_output_bytes: write it to a file under /workspace/out, or filter it]\n")
	}
	for _, a := range o.Artifacts {
		fmt.Fprintf(&b, "Artifact %s (%d bytes", a.Path, a.Size)
		if a.Inline {
			b.WriteString(", shown inline")
		}
		b.WriteString(")\n")
	}
	if o.ArtifactsTruncated {
		b.WriteString("[more files under /workspace/out than listed]\n")
	}
	if len(o.Artifacts) > 0 && !o.Kept {
		b.WriteString("The sandbox is gone: to read other artifacts, run again with keep: true and use file_read.\n")
	}
	_ = lang
	return strings.TrimRight(b.String(), "\n")
}
