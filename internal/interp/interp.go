// Package interp is agentbox's stateful code interpreter: one long-lived Python process per
// sandbox (kernel.py, agentbox's own small kernel, started on first use) that keeps each
// context's variables between calls and streams what a cell prints, its results as MIME
// bundles and its errors with their tracebacks — the event shapes E2B's code interpreter
// streams, so that the E2B surface (internal/e2b) relays them as they are and the MCP tools
// run_code and code_context_create return them. The kernel runs as the sandbox's default user
// on a terminal agentbox holds (the PTY path: no network, no port), and ends with the sandbox,
// with Drop, or when a call waiting on it is cancelled (a cell that never ends would otherwise
// hold it forever).
package interp

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

//go:embed kernel.py
var kernelSource string

// Bounds.
const (
	// MaxCode bounds one cell's source.
	MaxCode = 1 << 20
	// startTimeout bounds a kernel's start (python's own start, on a loaded host).
	startTimeout = 30 * time.Second
	// maxLine bounds one line the kernel writes (an event: a result's PNG, a long print).
	maxLine = 32 << 20
)

// Languages the interpreter runs.
var Languages = []string{"python"}

// Context is a code context: a namespace of its own in the sandbox's kernel.
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// ExecuteRequest is one cell.
type ExecuteRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
}

// Execution is a cell's outcome, gathered from its events (what run_code returns).
type Execution struct {
	Results        []map[string]any `json:"results"`
	Logs           Logs             `json:"logs"`
	Error          *Error           `json:"exception,omitempty"`
	ExecutionCount int              `json:"execution_count"`
}

// Logs are a cell's printed text, chunk by chunk.
type Logs struct {
	Stdout []string `json:"stdout"`
	Stderr []string `json:"stderr"`
}

// Error is the exception a cell raised.
type Error struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Add folds one event into e.
func (e *Execution) Add(ev json.RawMessage) {
	var m map[string]any
	if json.Unmarshal(ev, &m) != nil {
		return
	}
	switch m["type"] {
	case "stdout":
		s, _ := m["text"].(string)
		e.Logs.Stdout = append(e.Logs.Stdout, s)
	case "stderr":
		s, _ := m["text"].(string)
		e.Logs.Stderr = append(e.Logs.Stderr, s)
	case "result":
		delete(m, "type")
		e.Results = append(e.Results, m)
	case "error":
		var er Error
		_ = json.Unmarshal(ev, &er)
		e.Error = &er
	case "number_of_executions":
		n, _ := m["execution_count"].(float64)
		e.ExecutionCount = int(n)
	}
}

// Manager keeps one kernel per sandbox.
type Manager struct {
	svc     *sandbox.Service
	mu      sync.Mutex
	kernels map[string]*kernel
	closed  bool
}

// New returns a manager over svc.
func New(svc *sandbox.Service) *Manager {
	return &Manager{svc: svc, kernels: map[string]*kernel{}}
}

// kernel is a sandbox's interpreter process.
type kernel struct {
	pty    *sandbox.PTY
	cancel context.CancelFunc
	calls  sync.Mutex // one request at a time
	lines  chan []byte
	dead   chan struct{}
	quit   chan struct{} // closed by stop
	once   sync.Once
	err    error // why it ended, once dead is closed
	next   int
}

// reply is one line the kernel writes.
type reply struct {
	ID       *int            `json:"id"`
	Ev       json.RawMessage `json:"ev"`
	Done     bool            `json:"done"`
	Ready    bool            `json:"ready"`
	Error    string          `json:"error"`
	Status   int             `json:"status"`
	Context  *Context        `json:"context"`
	Contexts []Context       `json:"contexts"`
}

// kernelFor returns sandbox id's kernel, starting it if there is none.
func (m *Manager) kernelFor(ctx context.Context, id string) (*kernel, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errcode.New(errcode.SandboxNotRunning, "the server is shutting down")
	}
	k := m.kernels[id]
	if k != nil {
		select {
		case <-k.dead:
			delete(m.kernels, id)
			k = nil
		default:
		}
	}
	if k != nil {
		m.mu.Unlock()
		return k, nil
	}
	k = &kernel{lines: make(chan []byte, 64), dead: make(chan struct{}), quit: make(chan struct{})}
	m.kernels[id] = k
	k.calls.Lock() // held until it is ready
	m.mu.Unlock()
	err := m.start(ctx, id, k)
	k.calls.Unlock()
	if err != nil {
		m.mu.Lock()
		if m.kernels[id] == k {
			delete(m.kernels, id)
		}
		m.mu.Unlock()
		return nil, err
	}
	return k, nil
}

func (m *Manager) start(ctx context.Context, id string, k *kernel) error {
	kctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	pty, err := m.svc.PTY(kctx, id, sandbox.PTYRequest{Argv: []string{"python3", "-u", "-c", kernelSource}, Env: map[string]string{"PYTHONDONTWRITEBYTECODE": "1"}})
	if err != nil {
		cancel()
		close(k.dead)
		switch errcode.Of(err) {
		case errcode.SandboxNotFound, errcode.SandboxNotRunning, errcode.PermissionDenied, errcode.AuthFailed, errcode.CapacityUnavailable:
			return err
		}
		if m := strings.ToLower(errcode.Message(err)); strings.Contains(m, "python3") && (strings.Contains(m, "not found") || strings.Contains(m, "no such file")) {
			return errcode.New(errcode.UnsupportedOp, "sandbox %s has no python3 (its image has none): the code interpreter needs an image with Python, such as python:3.12-slim", id)
		}
		return err
	}
	k.pty = pty
	go k.read()
	t := time.NewTimer(startTimeout)
	defer t.Stop()
	for {
		select {
		case line := <-k.lines:
			var r reply
			if json.Unmarshal(line, &r) == nil && r.Ready {
				return nil
			}
			// Before it is ready a terminal shows what the shell and python print: an image
			// without python3 says so here.
			if bytes.Contains(line, []byte("python3")) && bytes.Contains(line, []byte("not found")) ||
				bytes.Contains(line, []byte("No such file")) {
				k.stop()
				return errcode.New(errcode.UnsupportedOp, "sandbox %s has no python3 (its image has none): the code interpreter needs an image with Python, such as python:3.12-slim", id)
			}
		case <-k.dead:
			if errcode.Of(k.err) == errcode.InvalidArgument || strings.Contains(errcode.Message(k.err), "executable file not found") || strings.Contains(errcode.Message(k.err), "no such file") {
				return errcode.New(errcode.UnsupportedOp, "sandbox %s has no python3 (its image has none): the code interpreter needs an image with Python, such as python:3.12-slim", id)
			}
			return fmt.Errorf("the code interpreter of sandbox %s ended as it started: %w", id, k.err)
		case <-t.C:
			k.stop()
			return errcode.New(errcode.CommandTimeout, "the code interpreter of sandbox %s did not start within %s", id, startTimeout)
		case <-ctx.Done():
			k.stop()
			return ctx.Err()
		}
	}
}

// read splits the terminal's output into lines until the kernel ends.
func (k *kernel) read() {
	var buf []byte
	defer close(k.dead)
	for {
		b, exit, err := k.pty.Next()
		if exit != nil {
			k.err = fmt.Errorf("the interpreter exited (code %d%s)", exit.ExitCode, map[bool]string{true: ", " + exit.Signal}[exit.Signal != ""])
			return
		}
		if err != nil {
			k.err = err
			return
		}
		buf = append(buf, b...)
		for {
			i := bytes.IndexByte(buf, '\n')
			if i < 0 {
				break
			}
			line := bytes.TrimRight(buf[:i], "\r")
			buf = buf[i+1:]
			if len(bytes.TrimSpace(line)) > 0 {
				select {
				case k.lines <- bytes.Clone(line):
				case <-k.quit:
					return
				}
			}
		}
		if len(buf) > maxLine {
			k.err = errors.New("the interpreter wrote a line over the bound")
			_ = k.pty.Close()
			return
		}
	}
}

func (k *kernel) stop() {
	k.once.Do(func() { close(k.quit) })
	if k.cancel != nil {
		k.cancel()
	}
	if k.pty != nil {
		_ = k.pty.Close()
	}
}

// call sends one request and hands each event to onEvent until the kernel says done; the
// final line is returned.
func (m *Manager) call(ctx context.Context, id string, req map[string]any, onEvent func(json.RawMessage) error) (reply, error) {
	k, err := m.kernelFor(ctx, id)
	if err != nil {
		return reply{}, err
	}
	k.calls.Lock()
	defer k.calls.Unlock()
	select {
	case <-k.dead:
		return reply{}, errcode.New(errcode.SandboxNotRunning, "the code interpreter of sandbox %s ended: %v; call again to start a new one (its variables are gone)", id, k.err)
	default:
	}
	k.next++
	n := k.next
	req["id"] = n
	b, _ := json.Marshal(req)
	line := base64.StdEncoding.AppendEncode(nil, b)
	if _, err := k.pty.Write(append(line, '\n')); err != nil {
		m.drop(id, k)
		return reply{}, errcode.New(errcode.SandboxNotRunning, "the code interpreter of sandbox %s: %v", id, err)
	}
	for {
		select {
		case line := <-k.lines:
			var r reply
			if json.Unmarshal(line, &r) != nil || r.ID == nil || *r.ID != n {
				continue
			}
			if r.Done {
				if r.Error != "" {
					code := errcode.InvalidArgument
					if r.Status == 404 {
						code = errcode.FileNotFound
					}
					return r, errcode.New(code, "%s", r.Error)
				}
				return r, nil
			}
			if onEvent != nil {
				if err := onEvent(r.Ev); err != nil {
					m.drop(id, k)
					return r, err
				}
			}
		case <-k.dead:
			return reply{}, errcode.New(errcode.SandboxNotRunning, "the code interpreter of sandbox %s ended during the call: %v (its variables are gone)", id, k.err)
		case <-ctx.Done():
			// The cell may never end; the kernel cannot take another call until it does.
			m.drop(id, k)
			return reply{}, ctx.Err()
		}
	}
}

func checkLanguage(lang string) error {
	if lang == "" || lang == "python" || lang == "python3" {
		return nil
	}
	return errcode.New(errcode.InvalidArgument, "language %q is not supported: agentbox's code interpreter runs python", lang)
}

// Execute runs one cell in sandbox id, handing each event (E2B's shapes) to onEvent as it comes.
func (m *Manager) Execute(ctx context.Context, id string, req ExecuteRequest, onEvent func(json.RawMessage) error) error {
	if len(req.Code) > MaxCode {
		return errcode.New(errcode.InvalidArgument, "code is %d bytes; at most %d are accepted", len(req.Code), MaxCode)
	}
	if req.ContextID != "" && req.Language != "" {
		return errcode.New(errcode.InvalidArgument, "give a context_id or a language, not both")
	}
	if err := checkLanguage(req.Language); err != nil {
		return err
	}
	if err := sandbox.ValidateEnv("env_vars", req.EnvVars); err != nil {
		return err
	}
	_, err := m.call(ctx, id, map[string]any{"op": "execute", "code": req.Code, "context_id": req.ContextID, "env_vars": req.EnvVars}, onEvent)
	if errcode.Of(err) == errcode.FileNotFound {
		return errcode.New(errcode.FileNotFound, "code context %q not found in sandbox %s (create one with code_context_create)", req.ContextID, id)
	}
	return err
}

// Run is Execute gathering the events into an Execution.
func (m *Manager) Run(ctx context.Context, id string, req ExecuteRequest) (Execution, error) {
	ex := Execution{Results: []map[string]any{}, Logs: Logs{Stdout: []string{}, Stderr: []string{}}}
	err := m.Execute(ctx, id, req, func(ev json.RawMessage) error { ex.Add(ev); return nil })
	return ex, err
}

// CreateContext makes a new context in sandbox id's kernel.
func (m *Manager) CreateContext(ctx context.Context, id, language, cwd string) (Context, error) {
	if err := checkLanguage(language); err != nil {
		return Context{}, err
	}
	if language == "" {
		language = "python"
	}
	if strings.ContainsRune(cwd, 0) || (cwd != "" && !strings.HasPrefix(cwd, "/")) {
		return Context{}, errcode.New(errcode.InvalidArgument, "cwd must be an absolute path; got %q", cwd)
	}
	r, err := m.call(ctx, id, map[string]any{"op": "create_context", "language": language, "cwd": cwd}, nil)
	if err != nil {
		return Context{}, err
	}
	if r.Context == nil {
		return Context{}, errcode.New(errcode.Internal, "the code interpreter answered no context")
	}
	return *r.Context, nil
}

// ListContexts lists sandbox id's contexts.
func (m *Manager) ListContexts(ctx context.Context, id string) ([]Context, error) {
	r, err := m.call(ctx, id, map[string]any{"op": "list_contexts"}, nil)
	if r.Contexts == nil {
		r.Contexts = []Context{}
	}
	return r.Contexts, err
}

// RemoveContext forgets a context; RestartContext empties its namespace.
func (m *Manager) RemoveContext(ctx context.Context, id, ctxID string) error {
	_, err := m.call(ctx, id, map[string]any{"op": "remove_context", "context_id": ctxID}, nil)
	return notFound(err, ctxID, id)
}

// RestartContext empties a context's namespace.
func (m *Manager) RestartContext(ctx context.Context, id, ctxID string) error {
	_, err := m.call(ctx, id, map[string]any{"op": "restart_context", "context_id": ctxID}, nil)
	return notFound(err, ctxID, id)
}

func notFound(err error, ctxID, id string) error {
	if errcode.Of(err) == errcode.FileNotFound {
		return errcode.New(errcode.FileNotFound, "code context %q not found in sandbox %s", ctxID, id)
	}
	return err
}

func (m *Manager) drop(id string, k *kernel) {
	m.mu.Lock()
	if m.kernels[id] == k {
		delete(m.kernels, id)
	}
	m.mu.Unlock()
	k.stop()
}

// Drop ends sandbox id's kernel (the sandbox is going away or to sleep).
func (m *Manager) Drop(id string) {
	m.mu.Lock()
	k := m.kernels[id]
	delete(m.kernels, id)
	m.mu.Unlock()
	if k != nil {
		k.stop()
	}
}

// Close ends every kernel and refuses new ones.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	ks := m.kernels
	m.kernels = map[string]*kernel{}
	m.mu.Unlock()
	for _, k := range ks {
		k.stop()
		<-k.dead
	}
}
