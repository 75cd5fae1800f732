//go:build unix

package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
)

const (
	defaultShutdownGrace = 5 * time.Second
	// maxMkdirBody bounds small JSON request bodies (mkdir).
	maxSmallBody = 1 << 20
)

// server is the state shared by the handlers of one Run.
type server struct {
	workdir string
	log     *slog.Logger
	reaper  *reaper
	// root is whether the agent runs as root: it can then run commands as other users, and
	// tags each command's processes (execTags, kept by the process-wide reaper).
	root bool
	// user runs commands that name no user and owns what the files API creates; nil: the agent.
	user *User
	// env is the base environment of commands over the agent's own (ServerConfig.Env).
	env map[string]string
	// oomKilled holds the exec tags (and, for untagged commands, process ids) of commands the
	// OOM guard killed, until their exec reports it.
	oomKilled sync.Map
	// jobs are the detached jobs (jobs_server.go).
	jobs *jobManager
	// net holds the egress listeners and session (net_server.go).
	net *netAgent
	// cgroupFD is ServerConfig.CommandCgroup opened (-1: none): commands start in it.
	cgroupFD int
	// commandCgroup is ServerConfig.CommandCgroup ("": none).
	commandCgroup string
}

// Run serves the guest protocol on cfg.Socket until ctx is done, then shuts down gracefully:
// in-flight requests get cfg.ShutdownGrace to finish, after which their commands are killed and
// every connection is closed. It also starts the process-wide child reaper (the agent is PID 1
// in the sandbox; elsewhere it makes itself a child subreaper so orphans are reaped the same way).
func Run(ctx context.Context, cfg ServerConfig) error {
	if cfg.Socket == "" {
		return errors.New("guest: no socket path configured")
	}
	wd := cfg.Workdir
	if wd == "" {
		wd = DefaultWorkdir
	}
	wd, err := filepath.Abs(wd)
	if err != nil {
		return fmt.Errorf("guest: workdir: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	grace := cfg.ShutdownGrace
	if grace <= 0 {
		grace = defaultShutdownGrace
	}
	root := os.Geteuid() == 0 && !cfg.Embedded
	if cfg.DefaultUser != nil && cfg.Embedded {
		return errors.New("guest: an embedded agent runs commands as its own process's user; DefaultUser must be nil")
	}
	if cfg.DefaultUser != nil && !root {
		return fmt.Errorf("guest: running commands as %s (uid %d) needs the agent to run as root; it runs as uid %d", cfg.DefaultUser.Name, cfg.DefaultUser.UID, os.Geteuid())
	}
	if fi, err := os.Stat(wd); err != nil || !fi.IsDir() {
		log.Warn("guest: the working directory is missing; commands without cwd will be refused", "workdir", wd)
	}
	var rp *reaper
	if cfg.Embedded {
		rp = ownChildrenReaper(log)
	} else {
		rp = startReaper(log)
	}
	uln, err := listenUnix(cfg.Socket)
	if err != nil {
		return err
	}
	// Quiesce and listen again around a checkpoint of the sandbox (quiesce_unix.go).
	ln := newRelistener(uln, cfg.Socket, log)
	sigDone := make(chan struct{})
	defer close(sigDone)
	if !cfg.Embedded {
		ln.handleSignals(sigDone)
	}
	s := &server{workdir: wd, log: log, reaper: rp, root: root, user: cfg.DefaultUser, env: cfg.Env, net: newNetAgent(log), cgroupFD: -1}
	if cfg.CommandCgroup != "" {
		fd, err := openCgroup(cfg.CommandCgroup)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("guest: the commands' cgroup: %w", err)
		}
		defer closeFD(fd)
		s.cgroupFD, s.commandCgroup = fd, cfg.CommandCgroup
	}
	if err := s.initJobs(cfg); err != nil {
		_ = ln.Close()
		return err
	}
	defer s.stopJobs()
	defer s.net.close()

	// baseCtx is the parent of every request context: cancelling it kills the commands still
	// running when the shutdown grace period is over.
	baseCtx, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	srv := &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ConnState:         ln.connState,
	}
	srv.RegisterOnShutdown(s.jobs.drain) // log reads waiting for output answer now
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("guest: agent listening", "socket", cfg.Socket, "workdir", wd, "pid", os.Getpid())

	select {
	case err := <-served:
		_ = os.Remove(cfg.Socket)
		return fmt.Errorf("guest: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("guest: requests still running at shutdown; killing them", "err", err)
	}
	cancelBase()
	_ = srv.Close()
	<-served
	s.net.close()
	_ = os.Remove(cfg.Socket)
	return nil
}

// listenUnix listens on path, first removing a stale socket left by a previous agent. The
// socket is made accessible to its owner only.
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("guest: %s exists and is not a socket; refusing to replace it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("guest: remove stale socket: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("guest: socket directory: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("guest: listen: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("guest: chmod socket: %w", err)
	}
	return ln, nil
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	p := "/" + Version
	mux.HandleFunc("GET "+p+"/health", s.handleHealth)
	mux.HandleFunc("POST "+p+"/exec", s.handleExec)
	mux.HandleFunc("POST "+p+"/exec/stdin", s.handleExecStdin)
	mux.HandleFunc("PUT "+p+"/files", s.handleWriteFile)
	mux.HandleFunc("GET "+p+"/files", s.handleReadFile)
	mux.HandleFunc("DELETE "+p+"/files", s.handleRemove)
	mux.HandleFunc("GET "+p+"/files/stat", s.handleStat)
	mux.HandleFunc("GET "+p+"/files/list", s.handleList)
	mux.HandleFunc("POST "+p+"/files/mkdir", s.handleMkdir)
	mux.HandleFunc("POST "+p+"/oom-kill", s.handleOOMKill)
	mux.HandleFunc("POST "+p+"/sync", s.handleSync)
	s.jobRoutes(mux, p)
	// Interactive terminals (pty*.go): the connection switches to PTY frames.
	mux.HandleFunc("POST "+p+"/pty", s.handlePTY)
	// Egress session and inbound connections (net_server.go): the connection switches to
	// its control channel, to a parked connection, or to the raw bytes of a connection to the
	// sandbox's loopback.
	mux.HandleFunc("POST "+p+"/net/session", s.handleNetSession)
	mux.HandleFunc("POST "+p+"/net/accept", s.handleNetAccept)
	mux.HandleFunc("POST "+p+"/tcp", s.handleDialPort)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, errcode.New(errcode.UnsupportedOp, "the agent has no endpoint %s %s", r.Method, r.URL.Path))
	})
	return s.recoverPanics(mux)
}

func (s *server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, Health{OK: true, Version: Version, PID: os.Getpid()})
}

// trackingWriter remembers whether the response has started, so a panic can still be answered.
type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (t *trackingWriter) WriteHeader(code int) { t.wrote = true; t.ResponseWriter.WriteHeader(code) }
func (t *trackingWriter) Write(p []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(p)
}
func (t *trackingWriter) ReadFrom(r io.Reader) (int64, error) {
	t.wrote = true
	return io.Copy(t.ResponseWriter, r) // keeps the underlying writer's sendfile path
}

// Unwrap lets http.ResponseController reach Flush and the deadlines.
func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// recoverPanics turns a panicking handler into an INTERNAL reply (or, once the reply has
// started, an Error frame for a stream, or an aborted connection) instead of a dead agent.
func (s *server) recoverPanics(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &trackingWriter{ResponseWriter: w}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler { //nolint:errorlint // sentinel compared as documented
				panic(v)
			}
			s.log.Error("guest: handler panic", "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
			e := errcode.New(errcode.Internal, "the agent hit an internal error (%v); see its log", v)
			switch {
			case !tw.wrote:
				s.writeError(tw, e)
			case strings.HasPrefix(w.Header().Get("Content-Type"), ndjson):
				eb := errorBody(e)
				_ = json.NewEncoder(w).Encode(Frame{Error: &eb})
			default:
				panic(http.ErrAbortHandler) // a half-written reply must not look complete
			}
		}()
		h.ServeHTTP(tw, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// errorBody is err's wire form (an untyped error is INTERNAL, its text kept here).
func errorBody(err error) ErrorBody { return peerreply.Body(err) }

// writeError replies with err's code, HTTP status and message; untyped errors are logged and
// reported as INTERNAL.
func (s *server) writeError(w http.ResponseWriter, err error) {
	if _, ok := errcode.As(err); !ok || errcode.Of(err) == errcode.Internal {
		s.log.Warn("guest: request failed", "err", err)
	}
	eb := errorBody(err)
	writeJSON(w, errcode.HTTPStatus(errcode.Code(eb.Code)), eb)
}

// decodeJSON decodes exactly one JSON value with no unknown fields from a body of at most limit
// bytes, and reads the body to its end (which also lets net/http notice a client that goes away).
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body := http.MaxBytesReader(w, r.Body, limit)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, limit)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil {
			return jsonError(err, limit)
		}
		return errcode.New(errcode.InvalidArgument, "malformed JSON request: unexpected data after the JSON object")
	}
	return nil
}

func jsonError(err error, limit int64) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errcode.Wrap(errcode.InvalidArgument, err, "request body is larger than %d bytes", limit)
	}
	if errors.Is(err, io.EOF) {
		return errcode.Wrap(errcode.InvalidArgument, err, "malformed JSON request: empty body")
	}
	return errcode.Wrap(errcode.InvalidArgument, err, "malformed JSON request: %v", err)
}
