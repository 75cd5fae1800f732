package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// parseVersion takes "1.1.5+ds1" from "runc version 1.1.5+ds1\ncommit: …".
func parseVersion(out string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	f := strings.Fields(line)
	for i, w := range f {
		if w == "version" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return strings.TrimSpace(line)
}

// commandError is a failed OCI runtime command with the runtime's own message.
type commandError struct {
	args []string
	msg  string
	err  error
}

func (e *commandError) Error() string {
	return fmt.Sprintf("%s: %s", strings.Join(e.args, " "), e.msg)
}

func (e *commandError) Unwrap() error { return e.err }

// command runs the OCI runtime with its global flags and returns its stdout. These commands leave no
// process behind, so pipes are safe here (unlike create).
func (r *Runtime) command(ctx context.Context, args ...string) ([]byte, error) {
	return r.commandFor(ctx, commandTimeout, args...)
}

// commandFor is command with its own timeout (a checkpoint writes memory_mb of pages).
func (r *Runtime) commandFor(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := r.newCmd(ctx, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	start := time.Now()
	err := r.startCmd(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	r.log.Debug("command", "args", args, "took", time.Since(start), "err", err)
	if err != nil {
		msg := runtimeMessage(stderr.String())
		if ctx.Err() != nil {
			msg = fmt.Sprintf("timed out: %v; %s", ctx.Err(), msg)
		}
		return nil, &commandError{args: append([]string{r.name}, args...), msg: msg, err: err}
	}
	return stdout.Bytes(), nil
}

func isNotExist(err error) bool {
	var ce *commandError
	if !errors.As(err, &ce) {
		return false
	}
	m := strings.ToLower(ce.msg)
	return strings.Contains(m, "does not exist") || strings.Contains(m, "not exist") || strings.Contains(m, "no such file")
}

// classify turns a failed command into a typed error.
func (r *Runtime) classify(err error, op, id string) error {
	if isNotExist(err) {
		return errcode.Wrap(errcode.SandboxNotFound, err, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	var ce *commandError
	if errors.As(err, &ce) {
		switch {
		case strings.Contains(ce.msg, "stopped"), strings.Contains(ce.msg, "not running"):
			return errcode.Wrap(errcode.SandboxNotRunning, err, "sandbox %s is not running", id)
		case strings.Contains(ce.msg, "already running"):
			return errcode.Wrap(errcode.Conflict, err, "sandbox %s is already running", id)
		}
		r.log.Warn("runtime command failed", "op", op, "sandbox_id", id, "err", err)
	}
	what := "sandbox " + id
	if id == "" {
		what = "its sandboxes"
	}
	// The runtime's own message (host paths, internals) stays in the cause and the log.
	return errcode.Wrap(errcode.RuntimeUnavailable, err, "%s could not %s %s; the server log has the runtime's error (run `agentbox doctor` if it persists)", r.name, op, what)
}

// runtimeMessage extracts the error message from an OCI runtime's stderr: the msg="…" of
// its last error line (runc logs with logrus), or the last non-empty line.
func runtimeMessage(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		line := strings.TrimSpace(lines[i])
		if line == "" {
			continue
		}
		if j := strings.Index(line, `msg="`); j >= 0 {
			if q, err := strconv.QuotedPrefix(line[j+4:]); err == nil {
				if s, err := strconv.Unquote(q); err == nil {
					line = s
				}
			}
		} else if strings.HasPrefix(line, "{") {
			var j struct {
				Msg string `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &j) == nil && j.Msg != "" {
				line = j.Msg
			}
		}
		if len(line) > 1024 {
			line = line[:1024] + "…"
		}
		return line
	}
	return "no error message"
}

// readTail returns at most n bytes from the end of a file.
func readTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}
