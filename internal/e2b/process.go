package e2b

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/internal/e2b/envd/process"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Processes. envd's process.Process maps onto agentbox's exec (a command's stdout and stderr
// streamed as it runs; cancelling kills its whole tree) and its PTY (a terminal whose input,
// output and size the caller drives). A process lives on the server, not in the caller's
// stream: Start's caller may go away and Connect later, by pid or tag. The pids are this
// surface's own numbers, per sandbox (agentbox does not expose the guest's), and live until
// the process ends.

const (
	// maxProcessTimeout bounds a process without a deadline: exec's own longest.
	maxProcessTimeout = 24 * time.Hour
	// keepAliveEvery is how often a quiet stream gets a keepalive event (envd's interval).
	keepAliveEvery = 30 * time.Second
	// subscriberBuffer is how many events one stream may fall behind before the process's
	// output waits for it.
	subscriberBuffer = 256
	// firstPID is the first pid a sandbox's processes get.
	firstPID = 1000
)

// proc is one process started through Start.
type proc struct {
	pid     uint32
	sandbox string
	tag     *string
	config  *process.ProcessConfig
	pty     *sandbox.PTY // nil: a plain command
	// in is a plain command's session when its stdin is open (StartRequest.stdin); nil: its
	// stdin is /dev/null (exec).
	in     *sandbox.ExecSession
	cancel context.CancelFunc
	// inMu serialises writes to in and its closing; inClosed: CloseStdin was called.
	inMu     sync.Mutex
	inClosed bool

	mu       sync.Mutex
	subs     map[int]chan *process.ProcessEvent
	nextSub  int
	ended    bool
	signaled string // the signal Kill sent, for the end event
	done     chan struct{}
}

// subscribe returns a channel of the process's events from now on, and a function that ends
// the subscription; nil when the process has ended.
func (p *proc) subscribe() (<-chan *process.ProcessEvent, func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil, nil
	}
	ch := make(chan *process.ProcessEvent, subscriberBuffer)
	id := p.nextSub
	p.nextSub++
	p.subs[id] = ch
	return ch, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if _, ok := p.subs[id]; ok {
			delete(p.subs, id)
			close(ch)
		}
	}
}

// publish hands ev to every subscriber, waiting for one that is behind (the command's output
// then waits too) unless the process is cancelled.
func (p *proc) publish(ctx context.Context, ev *process.ProcessEvent) {
	p.mu.Lock()
	subs := slices.Collect(maps.Values(p.subs))
	p.mu.Unlock()
	for _, ch := range subs {
		func() {
			defer func() { _ = recover() }() // a subscriber that left meanwhile: its channel is closed
			select {
			case ch <- ev: // the usual case: room in the buffer, no timer
				return
			default:
			}
			t := time.NewTimer(10 * time.Second) // a stalled reader loses events rather than stall the command forever
			defer t.Stop()
			select {
			case ch <- ev:
			case <-ctx.Done():
			case <-t.C:
			}
		}()
	}
}

// finish publishes the end event and closes every subscription.
func (p *proc) finish(end *process.ProcessEvent_EndEvent) {
	ev := &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}
	p.publish(context.Background(), ev)
	p.mu.Lock()
	p.ended = true
	for id, ch := range p.subs {
		delete(p.subs, id)
		close(ch)
	}
	p.mu.Unlock()
	close(p.done)
}

// processes is the table of live processes, by sandbox and pid.
type processes struct {
	mu      sync.Mutex
	next    map[string]uint32
	bySB    map[string]map[uint32]*proc
	stopped bool
}

func newProcesses() *processes {
	return &processes{next: map[string]uint32{}, bySB: map[string]map[uint32]*proc{}}
}

func (t *processes) add(p *proc) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return errcode.New(errcode.SandboxNotRunning, "the server is shutting down")
	}
	if p.tag != nil {
		for _, q := range t.bySB[p.sandbox] {
			if q.tag != nil && *q.tag == *p.tag {
				return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("a process tagged %q already runs in sandbox %s", *p.tag, p.sandbox))
			}
		}
	}
	n := t.next[p.sandbox]
	if n == 0 {
		n = firstPID
	}
	t.next[p.sandbox] = n + 1
	p.pid = n
	if t.bySB[p.sandbox] == nil {
		t.bySB[p.sandbox] = map[uint32]*proc{}
	}
	t.bySB[p.sandbox][p.pid] = p
	return nil
}

func (t *processes) remove(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.bySB[p.sandbox]; m != nil && m[p.pid] == p {
		delete(m, p.pid)
		if len(m) == 0 {
			delete(t.bySB, p.sandbox)
		}
	}
}

// find returns the live process sel names in sandbox id.
func (t *processes) find(id string, sel *process.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if p := t.bySB[id][s.Pid]; p != nil {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", s.Pid))
	case *process.ProcessSelector_Tag:
		for _, p := range t.bySB[id] {
			if p.tag != nil && *p.tag == s.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", s.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector must give a pid or a tag"))
}

func (t *processes) list(id string) []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := slices.Collect(maps.Values(t.bySB[id]))
	slices.SortFunc(out, func(a, b *proc) int { return int(a.pid) - int(b.pid) })
	return out
}

// dropSandbox kills every process of sandbox id (it is being killed or paused).
func (t *processes) dropSandbox(id string) {
	for _, p := range t.list(id) {
		p.cancel()
	}
}

// closeAll kills every process and refuses new ones; it waits for them to end.
func (t *processes) closeAll() {
	t.mu.Lock()
	t.stopped = true
	var all []*proc
	for _, m := range t.bySB {
		for _, p := range m {
			all = append(all, p)
		}
	}
	t.mu.Unlock()
	for _, p := range all {
		p.cancel()
	}
	for _, p := range all {
		<-p.done
	}
}

// processService implements process.Process over the sandbox service.
type processService struct{ s *Server }

// start runs req in sandbox id and returns its process, already registered and subscribed to
// (so that no event is missed).
func (s *Server) start(ctx context.Context, id string, req *process.StartRequest) (*proc, <-chan *process.ProcessEvent, func(), error) {
	cfg := req.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return nil, nil, nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	argv := append([]string{cfg.GetCmd()}, cfg.GetArgs()...)
	// The process outlives this call (a background command), but not its deadline: the
	// caller's timeout (Connect-Timeout-Ms; the SDK's timeoutMs) is the command's.
	timeout := maxProcessTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(time.Until(d), maxProcessTimeout)
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	p := &proc{sandbox: id, tag: req.Tag, config: cfg, cancel: cancel, subs: map[int]chan *process.ProcessEvent{}, done: make(chan struct{})}
	u := userFrom(ctx)
	// envd runs a command in the user's home unless told otherwise: a relative path a command
	// names is then the same file the filesystem calls resolve under the home.
	cwd := cfg.GetCwd()
	if cwd == "" {
		cwd = homeOf(u)
	}
	if req.GetPty() != nil {
		size := req.GetPty().GetSize()
		pty, err := s.svc.PTY(pctx, id, sandbox.PTYRequest{Argv: argv, Env: cfg.GetEnvs(), Cwd: cwd, User: u,
			Rows: int(size.GetRows()), Cols: int(size.GetCols()), Term: cfg.GetEnvs()["TERM"]})
		if err != nil {
			cancel()
			return nil, nil, nil, err
		}
		p.pty = pty
	} else if req.Stdin == nil || req.GetStdin() {
		// envd keeps a command's stdin open unless the request says stdin: false (the SDK
		// sends false unless asked): agentbox's exec with open stdin.
		in, err := s.svc.ExecStdin(pctx, id, sandbox.ExecRequest{Argv: argv, Env: cfg.GetEnvs(), Cwd: cwd, User: u,
			Timeout: max(timeout.Round(time.Second), time.Second)})
		switch {
		case err == nil:
			p.in = in
		case req.Stdin == nil && errcode.Of(err) == errcode.UnsupportedOp:
			// A sandbox whose agent predates open stdin, and a caller that did not ask for
			// it: the command runs without, as before.
		default:
			cancel()
			return nil, nil, nil, err
		}
	}
	if err := s.procs.add(p); err != nil {
		if p.pty != nil {
			_ = p.pty.Close()
		}
		if p.in != nil {
			_ = p.in.Close()
		}
		cancel()
		return nil, nil, nil, err
	}
	events, unsub := p.subscribe()
	switch {
	case p.pty != nil:
		go s.runPTY(pctx, p)
	case p.in != nil:
		go s.runStdin(pctx, p)
	default:
		go s.runCommand(pctx, p, argv, u, cwd, timeout)
	}
	return p, events, unsub, nil
}

func (s *Server) runCommand(ctx context.Context, p *proc, argv []string, user, cwd string, timeout time.Duration) {
	defer s.procs.remove(p)
	defer p.cancel()
	cfg := p.config
	res, err := s.svc.Exec(ctx, p.sandbox, sandbox.ExecRequest{Argv: argv, Env: cfg.GetEnvs(), Cwd: cwd, User: user,
		Timeout: max(timeout.Round(time.Second), time.Second), MaxOutputBytes: 1 << 10},
		func(stream string, data []byte) {
			p.publish(ctx, &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: outputEvent(stream, data)}})
		})
	s.end(p, endEvent(p, res.ExitCode, res.Signal, err, ctx.Err()))
}

// end takes p out of the table, then publishes its end: a caller that saw the end no longer
// finds it listed.
func (s *Server) end(p *proc, ev *process.ProcessEvent_EndEvent) {
	s.procs.remove(p)
	p.finish(ev)
}

// runStdin relays the output of a command whose stdin is open until it ends.
func (s *Server) runStdin(ctx context.Context, p *proc) {
	defer s.procs.remove(p)
	defer p.cancel()
	defer p.in.Close()
	for {
		stream, b, res, err := p.in.Next()
		if res != nil {
			s.end(p, endEvent(p, res.ExitCode, res.Signal, nil, ctx.Err()))
			return
		}
		if err != nil {
			s.end(p, endEvent(p, -1, "", err, ctx.Err()))
			return
		}
		p.publish(ctx, &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: outputEvent(stream, b)}})
	}
}

// outputEvent is a command's output as envd's data event.
func outputEvent(stream string, data []byte) *process.ProcessEvent_DataEvent {
	b := slices.Clone(data)
	if stream == "stderr" {
		return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: b}}
	}
	return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: b}}
}

func (s *Server) runPTY(ctx context.Context, p *proc) {
	defer s.procs.remove(p)
	defer p.cancel()
	go func() { <-ctx.Done(); _ = p.pty.Close() }()
	for {
		b, exit, err := p.pty.Next()
		if exit != nil {
			s.end(p, endEvent(p, exit.ExitCode, exit.Signal, nil, nil))
			return
		}
		if err != nil {
			s.end(p, endEvent(p, -1, "", err, ctx.Err()))
			return
		}
		if len(b) > 0 {
			d := &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: slices.Clone(b)}}
			p.publish(ctx, &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}})
		}
	}
}

// endEvent is how envd reports a process's end: exit code and "exit status N", or -1, not
// exited, and "signal: killed" when a signal ended it (SendSignal, a timeout).
func endEvent(p *proc, code int, signal string, err, ctxErr error) *process.ProcessEvent_EndEvent {
	p.mu.Lock()
	sig := p.signaled
	p.mu.Unlock()
	switch {
	case sig != "" || ctxErr != nil:
		if sig == "" {
			sig = "killed"
		}
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: "signal: " + sig}
	case err != nil:
		msg := errcode.Message(err)
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: "error", Error: &msg}
	case signal != "":
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: "signal: " + signalWord(signal)}
	}
	return &process.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: true, Status: fmt.Sprintf("exit status %d", code)}
}

func signalWord(sig string) string {
	switch sig {
	case "SIGKILL":
		return "killed"
	case "SIGTERM":
		return "terminated"
	case "SIGHUP":
		return "hangup"
	case "SIGINT":
		return "interrupt"
	}
	return sig
}

// stream sends p's events to send, starting with its start event, until it ends or ctx does.
func stream(ctx context.Context, p *proc, events <-chan *process.ProcessEvent, unsub func(), send func(*process.ProcessEvent) error) error {
	defer unsub()
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	tick := time.NewTicker(keepAliveEvery)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			_, end := ev.Event.(*process.ProcessEvent_End)
			if end {
				holdFlush(ctx) // the end-of-stream message follows: both leave in one write
			}
			if err := send(ev); err != nil {
				return err
			}
			if end {
				return nil
			}
		case <-tick.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func (ps processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], out *connect.ServerStream[process.StartResponse]) error {
	id := sandboxFrom(ctx)
	p, events, unsub, err := ps.s.start(ctx, id, req.Msg)
	if err != nil {
		return toConnect(err)
	}
	return stream(ctx, p, events, unsub, func(ev *process.ProcessEvent) error {
		return out.Send(&process.StartResponse{Event: ev})
	})
}

func (ps processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], out *connect.ServerStream[process.ConnectResponse]) error {
	p, err := ps.s.procs.find(sandboxFrom(ctx), req.Msg.GetProcess())
	if err != nil {
		return err
	}
	events, unsub := p.subscribe()
	if events == nil {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d has ended", p.pid))
	}
	return stream(ctx, p, events, unsub, func(ev *process.ProcessEvent) error {
		return out.Send(&process.ConnectResponse{Event: ev})
	})
}

func (ps processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	var out []*process.ProcessInfo
	for _, p := range ps.s.procs.list(sandboxFrom(ctx)) {
		out = append(out, &process.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag})
	}
	return connect.NewResponse(&process.ListResponse{Processes: out}), nil
}

func (ps processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	p, err := ps.s.procs.find(sandboxFrom(ctx), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	word := "killed"
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
	case process.Signal_SIGNAL_SIGTERM:
		word = "terminated"
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal must be SIGKILL or SIGTERM; got %v", req.Msg.GetSignal()))
	}
	p.mu.Lock()
	if p.signaled == "" {
		p.signaled = word
	}
	p.mu.Unlock()
	p.cancel() // agentbox ends a command's whole tree (SIGKILL); docs/E2B.md
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (ps processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, err := ps.s.procs.find(sandboxFrom(ctx), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var b []byte
	switch in := req.Msg.GetInput().GetInput().(type) {
	case *process.ProcessInput_Pty:
		b = in.Pty
	case *process.ProcessInput_Stdin:
		b = in.Stdin
	}
	if len(b) > guest.MaxPTYData*16 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("input is %d bytes; send at most %d at a time", len(b), guest.MaxPTYData*16))
	}
	if p.pty != nil {
		if _, ok := req.Msg.GetInput().GetInput().(*process.ProcessInput_Pty); !ok {
			return nil, connect.NewError(connect.CodeInternal, errors.New("error writing to stdin: tty assigned to process — input should be written to the pty, not the stdin"))
		}
		if _, err := p.pty.Write(b); err != nil {
			return nil, toConnect(errcode.New(errcode.SandboxNotRunning, "process %d: %v", p.pid, err))
		}
		return connect.NewResponse(&process.SendInputResponse{}), nil
	}
	if _, ok := req.Msg.GetInput().GetInput().(*process.ProcessInput_Stdin); !ok {
		return nil, connect.NewError(connect.CodeInternal, errors.New("error writing to tty: tty not assigned to process — input should be written to the stdin, not the tty"))
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.in == nil || p.inClosed {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("error writing to stdin: stdin not enabled or closed (process %d was started with stdin: false, or its stdin was closed)", p.pid))
	}
	if _, err := p.in.Write(b); err != nil {
		return nil, toConnect(errcode.New(errcode.SandboxNotRunning, "process %d: %v", p.pid, err))
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (ps processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, err := ps.s.procs.find(sandboxFrom(ctx), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if p.pty == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no PTY to resize", p.pid))
		}
		if err := p.pty.Resize(int(size.GetRows()), int(size.GetCols())); err != nil {
			return nil, toConnect(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

func (ps processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, err := ps.s.procs.find(sandboxFrom(ctx), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.pty != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("a PTY process has no stdin to close: send Ctrl+D (0x04)"))
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.in != nil && !p.inClosed { // without open stdin there is nothing to close, as envd
		if err := p.in.CloseStdin(); err != nil {
			return nil, toConnect(errcode.New(errcode.SandboxNotRunning, "process %d: %v", p.pid, err))
		}
		p.inClosed = true
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (ps processService) StreamInput(context.Context, *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("StreamInput (a client stream) is not served: use SendInput"))
}
