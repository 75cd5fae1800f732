package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/remoteexec"
	"github.com/agentbox/agentbox/internal/remoteops"
	"github.com/agentbox/agentbox/internal/screenshot"
)

// Joined machines: remote_exec and remote_screenshot over Options.Remote.

// RemoteBackend runs commands on and takes screenshots of joined machines: the services in
// process, the REST client over a running serve.
type RemoteBackend interface {
	RemoteExec(ctx context.Context, machine string, req remoteexec.Request) (*remoteexec.Result, error)
	RemoteScreenshot(ctx context.Context, machine string, display *int) (*screenshot.Shot, error)
}

// RemoteServices is the in-process RemoteBackend.
type RemoteServices struct {
	Exec        *remoteops.Exec
	Screenshots *remoteops.Screenshots
}

func (r RemoteServices) RemoteExec(ctx context.Context, machine string, req remoteexec.Request) (*remoteexec.Result, error) {
	return r.Exec.Exec(ctx, machine, req)
}

func (r RemoteServices) RemoteScreenshot(ctx context.Context, machine string, display *int) (*screenshot.Shot, error) {
	return r.Screenshots.Capture(ctx, machine, display)
}

// RemoteExecIn is remote_exec's input.
type RemoteExecIn struct {
	Machine   string            `json:"machine" jsonschema:"The machine's id, name or alias (machine_list)."`
	Command   string            `json:"command" jsonschema:"The script, as one string, in the dialect of shell."`
	Shell     string            `json:"shell,omitempty" jsonschema:"sh or bash on Linux and macOS; cmd or powershell on Windows. Default: sh, or powershell on Windows."`
	Env       map[string]string `json:"env,omitempty" jsonschema:"Variables added to the agent's environment for this command. Not with elevated."`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"Absolute working directory on the machine; default the agent's."`
	TimeoutMS *int64            `json:"timeout_ms,omitempty" jsonschema:"Kill the command's whole process tree after this many milliseconds: 1000–3600000, default 300000. 0 is refused, not 'no timeout'."`
	Elevated  bool              `json:"elevated,omitempty" jsonschema:"Run as root (sudo -n on Linux/macOS unless the agent is root; Windows only when the agent runs elevated). Refused with env."`
}

// RemoteExecOut is remote_exec's reply.
type RemoteExecOut struct {
	Stdout     string `json:"stdout" jsonschema:"Standard output as kept (stdout and stderr share 1 MiB), as UTF-8 text."`
	Stderr     string `json:"stderr" jsonschema:"Standard error as kept; PowerShell's CLIXML error framing is turned back into text."`
	ExitCode   *int   `json:"exit_code" jsonschema:"The exit status; null when unknown (partial). 128+n when signal n ended it."`
	Partial    bool   `json:"partial" jsonschema:"The call was cut short (timeout, or the connection to the machine lost): the output is what arrived and the outcome is unknown, not failed."`
	Truncated  bool   `json:"truncated" jsonschema:"More than 1 MiB of output was written; total_bytes says how much."`
	TotalBytes int64  `json:"total_bytes" jsonschema:"How many bytes the command wrote to stdout and stderr together."`
	DurationMS int64  `json:"duration_ms" jsonschema:"How long the command ran, in milliseconds."`
	Reason     string `json:"reason,omitempty" jsonschema:"Why partial: timeout or disconnected."`
	Shell      string `json:"shell,omitempty" jsonschema:"The dialect the script ran in."`
}

// RemoteScreenshotIn is remote_screenshot's input.
type RemoteScreenshotIn struct {
	Machine string `json:"machine" jsonschema:"The machine's id, name or alias (machine_list)."`
	Display *int   `json:"display,omitempty" jsonschema:"The display index: X11 display :N on Linux, the Nth screen on macOS and Windows (0 is the first). Default: the agent's DISPLAY, or the first."`
}

// RemoteScreenshotOut is remote_screenshot's reply; the image is an image content block.
type RemoteScreenshotOut struct {
	Caption  string    `json:"caption" jsonschema:"Which display, how many, the resolution and when it was taken."`
	Display  string    `json:"display"`
	Screen   int       `json:"screen"`
	Screens  int       `json:"screens"`
	Displays []string  `json:"displays,omitempty"`
	Width    int       `json:"width"`
	Height   int       `json:"height"`
	TakenAt  time.Time `json:"taken_at"`
	Platform string    `json:"platform"`
	png      []byte
}

func (o RemoteScreenshotOut) extraContent() []mcp.Content {
	return []mcp.Content{&mcp.ImageContent{Data: o.png, MIMEType: "image/png"}}
}

// remoteExecText is the exec reply's text rendering's bound per stream.
const remoteExecText = 64 << 10

const remoteExecDoc = `Run a script on one of the user's joined machines (not a sandbox: a real computer, so act with care) and get its output when it ends.
Arguments: machine (id, name or alias), command (the script as ONE string), shell, env, cwd (absolute), timeout_ms (1000–3600000, default 300000; 0 and out-of-range values are refused, never clamped), elevated.
Dialects — check the machine's platform first with machine_status (or machine_list):
- linux/darwin: shell "sh" (default) or "bash". Quote as in a POSIX shell; 'single quotes' are literal.
- windows: shell "powershell" (default; Windows PowerShell 5.1) or "cmd". In PowerShell 5.1, && and || do NOT exist: chain with ';' and test with if ($?) { … } or $LASTEXITCODE after native programs. && works in cmd and bash. PowerShell's exit code does not tell success: a failing cmdlet can still exit 0, so READ STDERR (errors come back as plain text). In cmd, quote paths with spaces in "double quotes" and escape & | < > ^ with ^ outside quotes; a cmd script is one line (join commands with &).
Short vs long: remote_exec is for commands that finish within a couple of minutes; start anything longer (training, builds, downloads) with remote_job_start and poll it, rather than raising timeout_ms.
Reply: {stdout, stderr, exit_code, partial, truncated, total_bytes, duration_ms, reason, shell}. stdout and stderr together keep at most 1 MiB (truncated: true, total_bytes the true count). partial: true means the call was cut short (reason "timeout": the whole process tree was killed; "disconnected": the connection to the machine was lost, the tree is killed on the machine) — exit_code is null, the output is what arrived, and the outcome is UNKNOWN: check the machine's state before repeating a command that changes things.
`

func (s *Server) addRemoteTools() {
	addTool(s, &mcp.Tool{
		Name:        "remote_exec",
		Title:       "Run a script on a joined machine",
		Description: remoteExecDoc + errorsDoc("INVALID_ARGUMENT (a bound, a shell the machine's platform lacks, env with elevated, a relative or missing cwd: the message says what to change)", "MACHINE_NOT_FOUND", "MACHINE_OFFLINE (the machine is not connected now)", "UNSUPPORTED_OPERATION (elevated where the agent cannot become root: the message says why; or no machines on this server)"),
		Annotations: &mcp.ToolAnnotations{Title: "Run on a joined machine", DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
	}, func(in *jsonschema.Schema) {
		in.Properties["command"].MinLength = ptr(1)
		in.Properties["command"].MaxLength = ptr(remoteexec.MaxCommandBytes)
		in.Properties["shell"].Enum = []any{"sh", "bash", "cmd", "powershell"}
		in.Properties["machine"].MinLength = ptr(1)
	}, s.remoteExec)
	addTool(s, &mcp.Tool{
		Name:  "remote_screenshot",
		Title: "Take a screenshot of a joined machine's display",
		Description: `Capture a joined machine's screen: the image (PNG) plus a caption saying which display, how many there are, the resolution and when it was taken.
Arguments: machine (id, name or alias), display (index, default the machine's: X11 display :N on Linux; the Nth screen on macOS and Windows).
Linux machines need an X11 display the agent may open (DISPLAY and XAUTHORITY in the agent's environment, or xhost); macOS needs the Screen Recording permission for the agent; Windows needs the agent in an interactive desktop session (not a service). A machine without a display, or without permission, answers UNSUPPORTED_OPERATION with details.missing "display" or "permission" and a message saying what to set up.
Reply: image content, then {caption, display, screen, screens, displays, width, height, taken_at, platform}.
` + errorsDoc("UNSUPPORTED_OPERATION (details.missing: display | permission)", "INVALID_ARGUMENT (display out of 0–999)", "MACHINE_NOT_FOUND", "MACHINE_OFFLINE"),
		Annotations: &mcp.ToolAnnotations{Title: "Screenshot a joined machine", ReadOnlyHint: true, OpenWorldHint: ptr(true)},
	}, func(in *jsonschema.Schema) {
		in.Properties["machine"].MinLength = ptr(1)
	}, s.remoteScreenshot)
}

func (s *Server) remoteExec(ctx context.Context, _ *mcp.CallToolRequest, in RemoteExecIn) (RemoteExecOut, string, error) {
	if s.opts.Remote == nil {
		return RemoteExecOut{}, "", errcode.New(errcode.UnsupportedOp, "this agentbox server has no joined machines (remote_exec is served by agentbox serve)")
	}
	res, err := s.opts.Remote.RemoteExec(ctx, in.Machine, remoteexec.Request{Command: in.Command, Shell: in.Shell, Env: in.Env,
		Cwd: in.Cwd, TimeoutMS: in.TimeoutMS, Elevated: in.Elevated})
	if err != nil {
		return RemoteExecOut{}, "", err
	}
	out := RemoteExecOut{Stdout: res.Stdout, Stderr: res.Stderr, ExitCode: res.ExitCode, Partial: res.Partial, Truncated: res.Truncated,
		TotalBytes: res.TotalBytes, DurationMS: res.DurationMS, Reason: res.Reason, Shell: res.Shell}
	return out, renderRemoteExec(out), nil
}

// renderRemoteExec is the reply as text: a status line, then each stream (cut for the text; the
// structured content has all that was kept).
func renderRemoteExec(o RemoteExecOut) string {
	var b strings.Builder
	switch {
	case o.Partial:
		fmt.Fprintf(&b, "PARTIAL (%s): the outcome is unknown; %d ms", o.Reason, o.DurationMS)
	case o.ExitCode != nil:
		fmt.Fprintf(&b, "exit_code %d in %d ms", *o.ExitCode, o.DurationMS)
	}
	if o.Truncated {
		fmt.Fprintf(&b, "; output truncated to 1 MiB of %d bytes", o.TotalBytes)
	}
	b.WriteString("\n")
	for _, st := range []struct{ name, text string }{{"stdout", o.Stdout}, {"stderr", o.Stderr}} {
		if st.text == "" {
			continue
		}
		t := st.text
		if len(t) > remoteExecText {
			t = t[:remoteExecText] + fmt.Sprintf("\n… %d more bytes in the structured result", len(st.text)-remoteExecText)
		}
		fmt.Fprintf(&b, "--- %s ---\n%s\n", st.name, strings.TrimRight(t, "\n"))
	}
	return b.String()
}

func (s *Server) remoteScreenshot(ctx context.Context, _ *mcp.CallToolRequest, in RemoteScreenshotIn) (RemoteScreenshotOut, string, error) {
	if s.opts.Remote == nil {
		return RemoteScreenshotOut{}, "", errcode.New(errcode.UnsupportedOp, "this agentbox server has no joined machines (remote_screenshot is served by agentbox serve)")
	}
	shot, err := s.opts.Remote.RemoteScreenshot(ctx, in.Machine, in.Display)
	if err != nil {
		return RemoteScreenshotOut{}, "", err
	}
	out := RemoteScreenshotOut{Caption: shot.Caption(), Display: shot.Display, Screen: shot.Screen, Screens: shot.Screens, Displays: shot.Displays,
		Width: shot.Width, Height: shot.Height, TakenAt: shot.TakenAt, Platform: shot.Platform, png: shot.PNG}
	return out, out.Caption, nil
}

// rawOutput keeps exit_code's null in the output schema (null: the outcome is unknown).
func (RemoteExecOut) rawOutput() {}
