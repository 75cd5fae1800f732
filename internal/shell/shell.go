// Package shell knows the shell dialects a joined machine runs remote_exec scripts in (sh and
// bash on POSIX, cmd and powershell on Windows): which exist on a platform, which is its default,
// the process each dialect becomes, and how PowerShell's CLIXML error framing on stderr is turned
// back into plain text.
package shell

import (
	"encoding/base64"
	"slices"
	"strings"
	"unicode/utf16"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Dialect names a shell a script is run in. Names are public API (remote_exec's `shell`).
type Dialect string

const (
	Sh         Dialect = "sh"
	Bash       Dialect = "bash"
	Cmd        Dialect = "cmd"
	PowerShell Dialect = "powershell"
)

// Available lists the dialects of platform goos (runtime.GOOS values), its default first.
func Available(goos string) []Dialect {
	if goos == "windows" {
		return []Dialect{PowerShell, Cmd}
	}
	return []Dialect{Sh, Bash}
}

// Default is platform goos's dialect when a request names none: powershell on Windows, sh
// elsewhere.
func Default(goos string) Dialect { return Available(goos)[0] }

// Resolve returns the dialect name stands for on platform goos: the default for "", the named
// one when the platform has it, and INVALID_ARGUMENT saying which it has otherwise.
func Resolve(goos, name string) (Dialect, error) {
	if name == "" {
		return Default(goos), nil
	}
	avail := Available(goos)
	if d := Dialect(name); slices.Contains(avail, d) {
		return d, nil
	}
	names := make([]string, len(avail))
	for i, d := range avail {
		names[i] = string(d)
	}
	return "", errcode.New(errcode.InvalidArgument, "shell %q does not exist on this %s machine; use one of: %s (or omit shell for %s)",
		clip(name, 64), goos, strings.Join(names, ", "), avail[0]).
		With("shell", clip(name, 64)).With("platform", goos).With("available", strings.Join(names, ","))
}

// Spec is the process a script becomes.
type Spec struct {
	// Path is the program (looked up in PATH); Args its argv, Args[0] being Path.
	Path string
	Args []string
	// CmdLine, when set (cmd on Windows), is the exact command line the process must get
	// (syscall.SysProcAttr.CmdLine): Go's quoting of Args follows the C runtime's rules, which
	// cmd.exe does not use, so the script is handed over verbatim instead.
	CmdLine string
}

// Command returns the process that runs script in dialect d:
//
//	sh         sh -c SCRIPT
//	bash       bash -c SCRIPT
//	cmd        cmd.exe /d /s /c "SCRIPT"   (the command line set verbatim; /s makes cmd strip
//	                                      exactly the outer quotes and keep the rest as written)
//	powershell powershell.exe -NoProfile -NonInteractive -EncodedCommand BASE64(UTF-16LE SCRIPT)
func Command(d Dialect, script string) Spec {
	switch d {
	case Bash:
		return Spec{Path: "bash", Args: []string{"bash", "-c", script}}
	case Cmd:
		// /d: no AutoRun commands from the registry; /s /c "…": the text between the first and
		// the last quote is the command, whatever quotes, carets or ampersands it holds.
		line := `cmd.exe /d /s /c "` + script + `"`
		return Spec{Path: "cmd.exe", Args: []string{"cmd.exe", "/d", "/s", "/c", `"` + script + `"`}, CmdLine: line}
	case PowerShell:
		return Spec{Path: "powershell.exe", Args: []string{"powershell.exe", "-NoProfile", "-NonInteractive", "-EncodedCommand", EncodeCommand(script)}}
	default:
		return Spec{Path: "sh", Args: []string{"sh", "-c", script}}
	}
}

// EncodeCommand is PowerShell's -EncodedCommand form of script: base64 of its UTF-16LE bytes.
func EncodeCommand(script string) string {
	u := utf16.Encode([]rune(script))
	b := make([]byte, 2*len(u))
	for i, c := range u {
		b[2*i], b[2*i+1] = byte(c), byte(c>>8)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
