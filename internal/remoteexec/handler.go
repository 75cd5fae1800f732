package remoteexec

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
	"github.com/agentbox/agentbox/internal/shell"
)

// Options configures the machine-side handler.
type Options struct {
	Logger *slog.Logger
}

// NewHandler returns the machine-side handler of POST /exec.
func NewHandler(opts Options) http.Handler {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &handler{log: opts.Logger}
}

type handler struct{ log *slog.Logger }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/exec" {
		peerreply.WriteError(w, errcode.New(errcode.InvalidArgument, "no such endpoint: %s", r.URL.Path))
		return
	}
	if r.Method != http.MethodPost {
		peerreply.WriteError(w, errcode.New(errcode.InvalidArgument, "/exec takes POST"))
		return
	}
	var req Request
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		peerreply.WriteError(w, errcode.Wrap(errcode.InvalidArgument, err, "the exec request is not valid JSON of the expected fields (or is larger than %d bytes)", maxRequestBody))
		return
	}
	if err := req.Validate(runtime.GOOS); err != nil {
		peerreply.WriteError(w, err)
		return
	}
	d, _ := shell.Resolve(runtime.GOOS, req.Shell)
	spec := shell.Command(d, req.Command)
	if req.Elevated {
		var err error
		if spec, err = elevate(r.Context(), spec); err != nil {
			peerreply.WriteError(w, err)
			return
		}
	}
	if req.Cwd != "" {
		if fi, err := os.Stat(req.Cwd); err != nil || !fi.IsDir() {
			peerreply.WriteError(w, errcode.New(errcode.InvalidArgument, "cwd %q is not a directory on this machine", clip(req.Cwd)))
			return
		}
	}
	cmd := exec.Command(spec.Path, spec.Args[1:]...)
	cmd.Args = spec.Args
	cmd.Dir = req.Cwd
	if len(req.Env) > 0 {
		cmd.Env = os.Environ()
		for k, v := range req.Env {
			cmd.Env = append(cmd.Env, k+"="+v) // later entries win (os/exec dedups)
		}
	}
	setProcAttr(cmd, spec)
	// Output a grandchild keeps open after the tree is gone does not hold the reply.
	cmd.WaitDelay = 2 * time.Second
	out := &output{w: w, rc: http.NewResponseController(w)}
	cmd.Stdout = out.stream("stdout")
	cmd.Stderr = out.stream("stderr")
	began := time.Now()
	// The output writers wait for the header and the start frame (they run as soon as the
	// process does).
	out.mu.Lock()
	if err := cmd.Start(); err != nil {
		out.mu.Unlock()
		var ee *exec.Error
		if errors.As(err, &ee) {
			peerreply.WriteError(w, errcode.Wrap(errcode.InvalidArgument, err, "%s is not installed on this machine (not found on the agent's PATH); use one of the other shells", spec.Path))
			return
		}
		peerreply.WriteError(w, errcode.Wrap(errcode.Internal, err, "could not start %s: %v", spec.Path, err))
		return
	}
	tree := afterStart(cmd)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out.frameLocked(frame{Type: "start", Shell: string(d), PID: cmd.Process.Pid})
	out.mu.Unlock()

	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(time.Duration(req.Timeout()) * time.Millisecond)
	defer timer.Stop()
	var reason string
	select {
	case <-done:
	case <-timer.C:
		reason = ReasonTimeout
	case <-r.Context().Done(): // the server is gone: nobody will read the outcome
		reason = ReasonDisconnected
	}
	if reason != "" {
		tree.kill()
		<-done
	}
	tree.close()
	res := frame{Type: "result", DurationMS: time.Since(began).Milliseconds()}
	out.mu.Lock()
	res.Truncated, res.TotalBytes = out.truncated, out.total
	out.mu.Unlock()
	if reason != "" {
		res.Partial, res.Reason = true, reason
	} else if code, ok := exitCode(cmd); ok {
		res.ExitCode = &code
	}
	if reason == ReasonDisconnected {
		h.log.Info("remote exec: the server went away; the command's tree was killed", "pid", cmd.Process.Pid)
		return
	}
	out.frame(res)
}

// exitCode is the command's exit status: its code, or 128+N when signal N (not ours) ended it.
func exitCode(cmd *exec.Cmd) (int, bool) {
	ps := cmd.ProcessState
	if ps == nil {
		return 0, false
	}
	if ps.Exited() {
		return ps.ExitCode(), true
	}
	if sig, ok := signalOf(ps); ok {
		return 128 + sig, true
	}
	return 0, false
}

// output sends the command's stdout and stderr as out frames, keeping at most MaxOutputBytes of
// both together and counting all of it.
type output struct {
	mu        sync.Mutex
	w         io.Writer
	rc        *http.ResponseController
	sent      int64
	total     int64
	truncated bool
	broken    bool // the reply could not be written: keep counting, stop sending
}

func (o *output) stream(name string) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.total += int64(len(p))
		keep := min(int64(len(p)), MaxOutputBytes-o.sent)
		if keep < int64(len(p)) {
			o.truncated = true
		}
		for data := p[:keep]; len(data) > 0; {
			n := min(len(data), MaxFrameData)
			o.sent += int64(n)
			o.frameLocked(frame{Type: "out", Stream: name, Data: data[:n]})
			data = data[n:]
		}
		return len(p), nil // the command never sees a write fail because of the cap
	})
}

func (o *output) frame(f frame) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.frameLocked(f)
}

func (o *output) frameLocked(f frame) {
	if o.broken {
		return
	}
	b, _ := json.Marshal(f)
	if _, err := o.w.Write(append(b, '\n')); err != nil {
		o.broken = true
		return
	}
	if err := o.rc.Flush(); err != nil {
		o.broken = true
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
