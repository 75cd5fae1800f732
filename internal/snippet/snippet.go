// Package snippet runs a Python or shell snippet in a sandbox and returns what an assistant
// needs from it: output, the value of the last expression, an exception as data, the files it
// wrote under /workspace/out (small images inline) and timing. It works over the sandbox
// service's methods (Sandboxes), so the REST API and the MCP server share it; in a fresh
// sandbox (locked down, short TTL, destroyed afterwards unless kept) or in a given one.
package snippet

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Sandboxes is what a Runner needs of the control plane: *sandbox.Service, or the REST client's
// Backend.
type Sandboxes interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	Exec(ctx context.Context, id string, req sandbox.ExecRequest, onOutput sandbox.OutputFunc) (sandbox.ExecResult, error)
	WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) (sandbox.FileInfo, error)
	ReadFile(ctx context.Context, id, path string, offset, length, limit int64) (io.ReadCloser, int64, error)
	ListDir(ctx context.Context, id, path string) (sandbox.DirList, error)
	Destroy(ctx context.Context, id string) (sandbox.Sandbox, error)
}

// Language is what a snippet is written in.
type Language string

const (
	Python Language = "python"
	Shell  Language = "shell"
)

// Bounds.
const (
	// DefaultTimeout and MaxTimeout bound the snippet's run (not the sandbox's creation).
	DefaultTimeout = 30 * time.Second
	MaxTimeout     = 600 * time.Second
	// MaxCodeBytes bounds the code.
	MaxCodeBytes = 1 << 20
	// DefaultMaxOutputBytes and MaxOutputBytes bound the output kept per stream.
	DefaultMaxOutputBytes = 1 << 20
	MaxOutputBytes        = 16 << 20
	// OutDir is where the code writes files to return.
	OutDir = "/workspace/out"
	// MaxArtifacts bounds the files listed; MaxInlineImageBytes one inline image;
	// MaxInlineTotalBytes all inline images of one run.
	MaxArtifacts        = 20
	MaxInlineImageBytes = 1 << 20
	MaxInlineTotalBytes = 4 << 20
	// TTLMargin is added to the timeout for a fresh sandbox's TTL (unless kept).
	TTLMargin = 60 * time.Second
	// maxResultBytes bounds the driver's JSON result; maxDirs the directories walked.
	maxResultBytes = 1 << 20
	maxDirs        = 50
	// cleanupTimeout bounds destroying a fresh sandbox after the call ended.
	cleanupTimeout = 30 * time.Second
)

//go:embed driver.py
var driver []byte

// Request is one snippet run (REST body of POST /v1/run_python and /v1/run_shell).
type Request struct {
	Code string `json:"code"`
	// SandboxID runs it in an existing sandbox (never destroyed); empty: a fresh one.
	SandboxID      string           `json:"sandbox_id,omitempty"`
	TimeoutSeconds float64          `json:"timeout_seconds,omitempty"`
	Network        *sandbox.Network `json:"network,omitempty"`
	Keep           bool             `json:"keep,omitempty"`
	MaxOutputBytes int64            `json:"max_output_bytes,omitempty"`
}

// Value is the last expression's value.
type Value struct {
	Repr          string `json:"repr"`
	Type          string `json:"type"`
	ReprTruncated bool   `json:"repr_truncated,omitempty"`
	// JSON is the value itself when it is simple JSON (numbers, strings, bools, lists and
	// dicts of them, at most 64 KiB encoded).
	JSON any `json:"json,omitempty"`
}

// Exception is an uncaught exception.
type Exception struct {
	Type      string `json:"type"`
	Message   string `json:"message"`
	Traceback string `json:"traceback"`
}

// Artifact is a file the snippet wrote under OutDir.
type Artifact struct {
	Path     string    `json:"path"`
	Size     int64     `json:"size"`
	ModTime  time.Time `json:"mod_time"`
	MimeType string    `json:"mime_type,omitempty"`
	// Inline: the file is a small image returned with the result (Base64 on REST; an image
	// content block on MCP).
	Inline bool   `json:"inline,omitempty"`
	Base64 string `json:"base64,omitempty"`
}

// Result is a run's outcome. A snippet that raised or exited non-zero is a result, not an error.
type Result struct {
	SandboxID string `json:"sandbox_id"`
	// Kept: the sandbox still exists (a given sandbox, or keep: true); else it was destroyed.
	Kept        bool       `json:"kept"`
	ExitCode    int        `json:"exit_code"`
	Stdout      string     `json:"stdout"`
	Stderr      string     `json:"stderr"`
	StdoutBytes int64      `json:"stdout_bytes"`
	StderrBytes int64      `json:"stderr_bytes"`
	Truncated   bool       `json:"truncated"`
	TimedOut    bool       `json:"timed_out"`
	OOMKilled   bool       `json:"oom_killed,omitempty"`
	DurationMs  int64      `json:"duration_ms"`
	SetupMs     int64      `json:"setup_ms"`
	Value       *Value     `json:"value,omitempty"`
	Exception   *Exception `json:"exception,omitempty"`
	Artifacts   []Artifact `json:"artifacts"`
	// ArtifactsTruncated: more files than MaxArtifacts (or directories than walked) were there.
	ArtifactsTruncated bool `json:"artifacts_truncated,omitempty"`
}

// Runner runs snippets over a control plane.
type Runner struct {
	sb Sandboxes
}

// New returns a Runner over sb.
func New(sb Sandboxes) *Runner { return &Runner{sb: sb} }

// Check validates a request's arguments (before anything is created).
func Check(req Request) error {
	if req.Code == "" {
		return errcode.New(errcode.InvalidArgument, "code is required: the program to run")
	}
	if len(req.Code) > MaxCodeBytes {
		return errcode.New(errcode.InvalidArgument, "code is %d bytes; at most %d (1 MiB): write larger programs with file_write and run them", len(req.Code), MaxCodeBytes)
	}
	t := req.TimeoutSeconds
	if math.IsNaN(t) || t < 0 || t > MaxTimeout.Seconds() {
		return errcode.New(errcode.InvalidArgument, "timeout_seconds must be between 0.001 and %d (default %d); got %g", int(MaxTimeout.Seconds()), int(DefaultTimeout.Seconds()), t)
	}
	if req.MaxOutputBytes < 0 || req.MaxOutputBytes > MaxOutputBytes {
		return errcode.New(errcode.InvalidArgument, "max_output_bytes must be between 1 and %d (default %d); got %d", MaxOutputBytes, DefaultMaxOutputBytes, req.MaxOutputBytes)
	}
	if req.SandboxID != "" && req.Network != nil && req.Network.Policy != nil {
		return errcode.New(errcode.InvalidArgument, "network applies to a fresh sandbox only: with sandbox_id the code runs under that sandbox's own network (sandbox_network_update changes it); drop one of the two")
	}
	return nil
}

func (r Request) timeout() time.Duration {
	if r.TimeoutSeconds == 0 {
		return DefaultTimeout
	}
	return max(time.Duration(r.TimeoutSeconds*float64(time.Second)), time.Millisecond)
}

// Run runs req's code as lang.
func (r *Runner) Run(ctx context.Context, lang Language, req Request) (res Result, err error) {
	if lang != Python && lang != Shell {
		return Result{}, errcode.New(errcode.InvalidArgument, "language must be python or shell; got %q", lang)
	}
	if err := Check(req); err != nil {
		return Result{}, err
	}
	setup := time.Now()
	id := req.SandboxID
	kept := true
	if id == "" {
		cr := sandbox.CreateRequest{Network: req.Network, Labels: map[string]string{"agentbox.tool": "run_" + string(lang)}}
		if !req.Keep {
			cr.TTLSeconds = int64((req.timeout() + TTLMargin + time.Second - 1) / time.Second)
		}
		sb, err := r.sb.Create(ctx, cr)
		if err != nil {
			return Result{}, err
		}
		id = sb.ID
		if !req.Keep {
			kept = false
			defer func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
				defer cancel()
				if _, derr := r.sb.Destroy(dctx, id); derr != nil && err == nil {
					err = errcode.Wrap(errcode.Of(derr), derr, "the snippet ran, but destroying its sandbox %s failed (it expires by its TTL): %v", id, derr)
				}
			}()
		}
	}
	res = Result{SandboxID: id, Kept: kept, Artifacts: []Artifact{}}
	// The driver's files, flat in /tmp (WriteFile creates no directories).
	base := "/tmp/.agentbox-snippet-" + nonce()
	driverPath, codePath, resultPath := base+"-driver.py", base+"-code.py", base+"-result.json"
	if kept && lang == Python {
		defer func() { // leave a kept sandbox as the code left it, without our files
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			_, _ = r.sb.Exec(cctx, id, sandbox.ExecRequest{Argv: []string{"rm", "-f", driverPath, codePath, resultPath, resultPath + ".tmp"}, Timeout: 10 * time.Second}, nil)
		}()
	}
	var argv []string
	switch lang {
	case Python:
		if _, err := r.sb.WriteFile(ctx, id, driverPath, 0o644, bytes.NewReader(driver)); err != nil {
			return res, err
		}
		if _, err := r.sb.WriteFile(ctx, id, codePath, 0o644, strings.NewReader(req.Code)); err != nil {
			return res, err
		}
		argv = []string{"python3", driverPath, codePath, resultPath}
	case Shell:
		// The code is the caller's own shell program: that is this tool's purpose, and it runs
		// inside the sandbox only.
		argv = []string{"sh", "-c", "mkdir -p " + OutDir + " 2>/dev/null; " + req.Code}
	}
	maxOut := req.MaxOutputBytes
	if maxOut == 0 {
		maxOut = DefaultMaxOutputBytes
	}
	res.SetupMs = time.Since(setup).Milliseconds()
	started := time.Now()
	er, err := r.sb.Exec(ctx, id, sandbox.ExecRequest{Argv: argv, Cwd: "/workspace", Timeout: req.timeout(), MaxOutputBytes: maxOut}, nil)
	if err != nil {
		return res, err
	}
	res.ExitCode, res.Stdout, res.Stderr, res.StdoutBytes, res.StderrBytes = er.ExitCode, er.Stdout, er.Stderr, er.StdoutBytes, er.StderrBytes
	res.Truncated, res.TimedOut, res.OOMKilled, res.DurationMs = er.Truncated, er.TimedOut, er.OOMKilled, er.DurationMs
	if lang == Python {
		found, err := r.readResult(ctx, id, resultPath, &res)
		if err != nil {
			return res, err
		}
		if !found && er.ExitCode == 127 && strings.Contains(er.Stderr, "not found") {
			return res, errcode.New(errcode.UnsupportedOp, "sandbox %s has no python3 (its image has none): use run_shell, or an image with Python such as python:3.12-slim (sandbox_create, then run_python with its sandbox_id)", id)
		}
	}
	if err := r.collect(ctx, id, started, req.SandboxID != "", &res); err != nil {
		return res, err
	}
	return res, nil
}

// readResult reads the driver's JSON result; found is false when the driver wrote none (a
// timeout, a kill, os._exit).
func (r *Runner) readResult(ctx context.Context, id, p string, res *Result) (bool, error) {
	rc, _, err := r.sb.ReadFile(ctx, id, p, 0, 0, maxResultBytes)
	if err != nil {
		if c := errcode.Of(err); c == errcode.FileNotFound {
			return false, nil
		}
		if errcode.Of(err) == errcode.FileTooLarge {
			return false, errcode.New(errcode.Internal, "the snippet's result file is over %d bytes (something else wrote it)", maxResultBytes)
		}
		return false, err
	}
	defer rc.Close()
	var out struct {
		Value     *Value     `json:"value"`
		Exception *Exception `json:"exception"`
	}
	if err := json.NewDecoder(io.LimitReader(rc, maxResultBytes)).Decode(&out); err != nil {
		return false, nil // the code replaced or damaged it: report no value rather than fail
	}
	res.Value, res.Exception = out.Value, out.Exception
	return true, nil
}

// imageTypes are the inline image types by extension.
var imageTypes = map[string]string{".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".svg": "image/svg+xml"}

// collect lists the files under OutDir (in a given sandbox: those modified since the run
// started) and reads small images inline.
func (r *Runner) collect(ctx context.Context, id string, since time.Time, onlyNew bool, res *Result) error {
	queue := []string{OutDir}
	inline := int64(0)
	for dirs := 0; len(queue) > 0; dirs++ {
		if dirs >= maxDirs {
			res.ArtifactsTruncated = true
			break
		}
		d := queue[0]
		queue = queue[1:]
		l, err := r.sb.ListDir(ctx, id, d)
		if err != nil {
			if c := errcode.Of(err); c == errcode.FileNotFound || c == errcode.InvalidArgument {
				continue // no out dir, or one the code made unreadable
			}
			return err
		}
		res.ArtifactsTruncated = res.ArtifactsTruncated || l.Truncated
		for _, e := range l.Entries {
			p := path.Join(d, e.Name)
			switch e.Type {
			case "dir":
				queue = append(queue, p)
				continue
			case "file":
			default:
				continue
			}
			if onlyNew && e.ModTime.Before(since.Add(-time.Second)) {
				continue
			}
			if len(res.Artifacts) >= MaxArtifacts {
				res.ArtifactsTruncated = true
				continue
			}
			a := Artifact{Path: p, Size: e.Size, ModTime: e.ModTime, MimeType: imageTypes[strings.ToLower(path.Ext(p))]}
			if a.MimeType != "" && e.Size > 0 && e.Size <= MaxInlineImageBytes && inline+e.Size <= MaxInlineTotalBytes {
				b, err := r.readSmall(ctx, id, p)
				if err != nil {
					return err
				}
				if b != nil && imageMatches(a.MimeType, b) {
					a.Inline, a.Base64 = true, base64.StdEncoding.EncodeToString(b)
					inline += int64(len(b))
				}
			}
			res.Artifacts = append(res.Artifacts, a)
		}
	}
	return nil
}

// readSmall reads a whole small file (nil when it vanished or grew past the bound).
func (r *Runner) readSmall(ctx context.Context, id, p string) ([]byte, error) {
	rc, _, err := r.sb.ReadFile(ctx, id, p, 0, 0, MaxInlineImageBytes)
	if err != nil {
		if c := errcode.Of(err); c == errcode.FileNotFound || c == errcode.FileTooLarge || c == errcode.InvalidArgument {
			return nil, nil
		}
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxInlineImageBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxInlineImageBytes {
		return nil, nil
	}
	return b, nil
}

// imageMatches checks the bytes are the image type the extension claims.
func imageMatches(mime string, b []byte) bool {
	if mime == "image/svg+xml" {
		head := strings.ToLower(string(b[:min(len(b), 1024)]))
		return strings.Contains(head, "<svg")
	}
	return http.DetectContentType(b) == mime
}

func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
