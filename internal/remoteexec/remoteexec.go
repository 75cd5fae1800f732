// Package remoteexec is remote_exec on a joined machine: the handler the machine's agent serves
// at /exec (it runs one script in a shell dialect, streams its output back as NDJSON frames and
// ends with a result frame), the Client the server calls it with (which checks and bounds every
// frame and, when the stream breaks, returns what it received marked partial). The server's
// service over the machine registry is internal/remoteops.
//
// Wire (one HTTP/1.1 request per call, over a yamux stream of the machine's connection):
//
//	POST /exec  {"command","shell","env","cwd","timeout_ms","elevated"}
//	→ 4xx/5xx {"error":{code,message,details}}   refused before anything ran
//	→ 200 application/x-ndjson:
//	    {"type":"start","shell":"sh","pid":123}
//	    {"type":"out","stream":"stdout","data":"<base64, ≤ 32 KiB>"}   …
//	    {"type":"result","exit_code":0,"truncated":false,"total_bytes":6,"duration_ms":3,
//	     "partial":false,"reason":""}
package remoteexec

import (
	"strings"
	"unicode/utf16"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/shell"
)

// Bounds of a request. They are checked on the server and again on the machine; nothing is
// clamped: a value out of range is INVALID_ARGUMENT.
const (
	MinTimeoutMS     = 1_000
	MaxTimeoutMS     = 3_600_000
	DefaultTimeoutMS = 300_000
	// MaxCommandBytes is the most one argv string may hold on Linux (MAX_ARG_STRLEN less its
	// NUL): `sh -c SCRIPT` cannot carry more. Windows has its own, smaller bound (the
	// 32,767-character command line), checked on the machine.
	MaxCommandBytes = 128<<10 - 1
	MaxEnvVars      = 256
	MaxEnvKeyBytes  = 256
	MaxEnvValBytes  = 32 << 10
	MaxEnvBytes     = 256 << 10
	MaxCwdBytes     = 4096
	// MaxOutputBytes is what a call keeps of stdout and stderr together; total_bytes tells how
	// much the command wrote.
	MaxOutputBytes = 1 << 20
	// MaxFrameData is the most output one frame carries.
	MaxFrameData = 32 << 10
	// maxRequestBody bounds a request's JSON: the command and env escaped, and the rest.
	maxRequestBody = 6*(MaxCommandBytes+MaxEnvBytes+MaxCwdBytes) + 16<<10
	// windowsMaxCmdLine is CreateProcess's bound on a command line, in UTF-16 units.
	windowsMaxCmdLine = 32_767
)

// Request is one remote_exec call.
type Request struct {
	// Command is the script, in the dialect Shell names.
	Command string `json:"command"`
	// Shell: sh | bash on POSIX, cmd | powershell on Windows; "" for the machine's default
	// (sh; powershell on Windows).
	Shell string `json:"shell,omitempty"`
	// Env is added to (and overrides) the agent's environment. Refused with Elevated.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the absolute directory the command runs in; "": the agent's.
	Cwd string `json:"cwd,omitempty"`
	// TimeoutMS bounds the run: 1,000–3,600,000; nil for the default (300,000). 0 is not "no
	// timeout": it is INVALID_ARGUMENT.
	TimeoutMS *int64 `json:"timeout_ms,omitempty"`
	// Elevated runs the command as root (through `sudo -n` unless the agent is root) or, on
	// Windows, only when the agent already runs elevated.
	Elevated bool `json:"elevated,omitempty"`
}

// Timeout is the request's timeout in milliseconds, the default when unset.
func (r Request) Timeout() int64 {
	if r.TimeoutMS == nil {
		return DefaultTimeoutMS
	}
	return *r.TimeoutMS
}

// Result is what a call returns. A call cut short (timeout, the connection lost) has Partial
// set, ExitCode nil and whatever output arrived: an unknown outcome, not a failure.
type Result struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// ExitCode is nil when unknown (cut short). A command killed by signal N (not by the
	// timeout) reports 128+N, as shells do.
	ExitCode *int `json:"exit_code"`
	Partial  bool `json:"partial"`
	// Truncated: the command wrote more than MaxOutputBytes (stdout and stderr together);
	// TotalBytes is how much it wrote (as far as known when Partial).
	Truncated  bool  `json:"truncated"`
	TotalBytes int64 `json:"total_bytes"`
	DurationMS int64 `json:"duration_ms"`
	// Reason says why a partial result is partial: "timeout" or "disconnected".
	Reason string `json:"reason,omitempty"`
	// Shell is the dialect the script ran in.
	Shell string `json:"shell,omitempty"`
}

// Reasons a result is partial.
const (
	ReasonTimeout      = "timeout"
	ReasonDisconnected = "disconnected"
)

// Validate checks what does not depend on the machine: the command, env, cwd's length, the
// timeout, and env with elevated. goos, when known ("" otherwise), also checks the shell and
// cwd's form for that platform.
func (r Request) Validate(goos string) error {
	if strings.TrimSpace(r.Command) == "" {
		return errcode.New(errcode.InvalidArgument, "command is empty: give the script to run")
	}
	if len(r.Command) > MaxCommandBytes {
		return errcode.New(errcode.InvalidArgument, "command is %d bytes; at most %d fit one call: copy a longer script to the machine (remote_push) and run it by path", len(r.Command), MaxCommandBytes).
			With("max_bytes", MaxCommandBytes)
	}
	if strings.ContainsRune(r.Command, 0) {
		return errcode.New(errcode.InvalidArgument, "command contains a NUL byte, which no shell can receive")
	}
	if r.TimeoutMS != nil && (*r.TimeoutMS < MinTimeoutMS || *r.TimeoutMS > MaxTimeoutMS) {
		return errcode.New(errcode.InvalidArgument, "timeout_ms %d is out of range: give %d–%d (omit it for %d); 0 does not mean no timeout, and longer work belongs in remote_job_start",
			*r.TimeoutMS, MinTimeoutMS, MaxTimeoutMS, DefaultTimeoutMS).With("min", MinTimeoutMS).With("max", MaxTimeoutMS)
	}
	if r.Elevated && len(r.Env) > 0 {
		return errcode.New(errcode.InvalidArgument, "env together with elevated is refused (sudo would drop or pass it unpredictably): set the variables inside the command instead")
	}
	if len(r.Env) > MaxEnvVars {
		return errcode.New(errcode.InvalidArgument, "env has %d variables; at most %d", len(r.Env), MaxEnvVars)
	}
	total := 0
	for k, v := range r.Env {
		total += len(k) + len(v)
		switch {
		case k == "" || len(k) > MaxEnvKeyBytes:
			return errcode.New(errcode.InvalidArgument, "env: a variable name must be 1–%d bytes", MaxEnvKeyBytes)
		case strings.ContainsAny(k, "=\x00"):
			return errcode.New(errcode.InvalidArgument, "env: variable name %q contains '=' or NUL", clip(k))
		case len(v) > MaxEnvValBytes:
			return errcode.New(errcode.InvalidArgument, "env: %s's value is %d bytes; at most %d", clip(k), len(v), MaxEnvValBytes)
		case strings.ContainsRune(v, 0):
			return errcode.New(errcode.InvalidArgument, "env: %s's value contains a NUL byte", clip(k))
		}
	}
	if total > MaxEnvBytes {
		return errcode.New(errcode.InvalidArgument, "env totals %d bytes; at most %d", total, MaxEnvBytes)
	}
	if len(r.Cwd) > MaxCwdBytes || strings.ContainsRune(r.Cwd, 0) {
		return errcode.New(errcode.InvalidArgument, "cwd must be at most %d bytes without NUL", MaxCwdBytes)
	}
	if goos == "" {
		return nil
	}
	d, err := shell.Resolve(goos, r.Shell)
	if err != nil {
		return err
	}
	if r.Cwd != "" && !isAbs(goos, r.Cwd) {
		return errcode.New(errcode.InvalidArgument, "cwd %q is not an absolute path on this %s machine", clip(r.Cwd), goos)
	}
	if goos == "windows" {
		spec := shell.Command(d, r.Command)
		line := spec.CmdLine
		if line == "" {
			line = strings.Join(spec.Args, " ")
		}
		if n := len(utf16.Encode([]rune(line))); n > windowsMaxCmdLine {
			return errcode.New(errcode.InvalidArgument, "command is too long for Windows: as a %s command line it is %d characters, more than %d; copy the script to the machine (remote_push) and run it by path",
				d, n, windowsMaxCmdLine)
		}
	}
	return nil
}

// isAbs reports whether p is absolute on platform goos.
func isAbs(goos, p string) bool {
	if goos != "windows" {
		return strings.HasPrefix(p, "/")
	}
	if strings.HasPrefix(p, `\\`) { // UNC
		return true
	}
	return len(p) >= 3 && (p[0]|0x20 >= 'a' && p[0]|0x20 <= 'z') && p[1] == ':' && (p[2] == '\\' || p[2] == '/')
}

func clip(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64] + "…"
}

// frame is one NDJSON line of the /exec reply.
type frame struct {
	Type   string `json:"type"` // start | out | result
	Shell  string `json:"shell,omitempty"`
	PID    int    `json:"pid,omitempty"`
	Stream string `json:"stream,omitempty"` // stdout | stderr
	Data   []byte `json:"data,omitempty"`
	// result
	ExitCode   *int   `json:"exit_code,omitempty"`
	Partial    bool   `json:"partial,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"`
	TotalBytes int64  `json:"total_bytes,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
}

// maxFrameLine bounds one NDJSON line: a full data frame in base64, or a result frame.
const maxFrameLine = (MaxFrameData+2)/3*4 + 512
