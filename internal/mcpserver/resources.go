package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Resource URIs.
const (
	URISandboxes       = "agentbox://sandboxes"
	URISandboxTemplate = "agentbox://sandboxes/{id}"
	URICapacity        = "agentbox://capacity"
	sandboxURIPrefix   = "agentbox://sandboxes/"
)

// SandboxURI is the resource URI of one sandbox.
func SandboxURI(id string) string { return sandboxURIPrefix + id }

func (s *Server) addResources() {
	s.mcp.AddResource(&mcp.Resource{
		URI: URISandboxes, Name: "sandboxes", Title: "My sandboxes", MIMEType: "application/json",
		Description: `The sandboxes this server created and still holds, as {"sandboxes": [...], "count": n} — the same list as the sandbox_list tool (a finished sandbox appears once more, then drops out). Subscribe to be notified when any of them changes state.`,
	}, s.readSandboxes)
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: URISandboxTemplate, Name: "sandbox", Title: "One sandbox", MIMEType: "application/json",
		Description: `One sandbox's record as JSON (the same shape as sandbox_get's reply). Subscribe to be notified (notifications/resources/updated) when its state changes, e.g. when it expires or is destroyed.`,
	}, s.readSandbox)
	s.mcp.AddResource(&mcp.Resource{
		URI: URICapacity, Name: "capacity", Title: "Server capacity", MIMEType: "application/json",
		Description: `How much of the server's bounds live sandboxes use: {max_sandboxes, live, free, cpu_budget, cpu_used, cpu_free, memory_budget_mb, memory_used_mb, memory_free_mb, disk_budget_mb, disk_used_mb, disk_free_mb}.`,
	}, s.readCapacity)
}

func jsonContents(uri string, v any) (*mcp.ReadResourceResult, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(b)}}}, nil
}

// resourceError translates a typed error for resources/read.
func resourceError(uri string, err error) error {
	switch errcode.Of(err) {
	case errcode.SandboxNotFound:
		return mcp.ResourceNotFoundError(uri)
	case errcode.InvalidArgument:
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: errcode.Message(err)}
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("%s: %s", errcode.Of(err), errcode.Message(err))}
}

func (s *Server) readSandboxes(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	l, err := s.heldList(ctx)
	if err != nil {
		return nil, resourceError(req.Params.URI, err)
	}
	return jsonContents(req.Params.URI, l)
}

func (s *Server) readSandbox(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	id := strings.TrimPrefix(req.Params.URI, sandboxURIPrefix)
	sb, err := s.b.Get(ctx, id)
	if err != nil {
		return nil, resourceError(req.Params.URI, err)
	}
	out := s.withReason(ctx, s.info(sb))
	s.held.seen(sb)
	return jsonContents(req.Params.URI, out)
}

func (s *Server) readCapacity(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	c, err := s.b.Capacity(ctx)
	if err != nil {
		return nil, resourceError(req.Params.URI, err)
	}
	return jsonContents(req.Params.URI, capacityInfo(c))
}

// watcher implements resource subscriptions by polling the backend's event log with a cursor,
// so it works the same in-process and over REST. It polls only while someone is subscribed.
type watcher struct {
	s *Server

	mu      sync.Mutex
	subs    map[string]map[*mcp.ServerSession]bool // uri → sessions
	cursor  int64
	known   bool // cursor is at the end of the log
	running bool
	closed  bool
	stop    chan struct{}
	touched map[string]bool // ids changed by this server's own calls, notified at the next poll
}

func newWatcher(s *Server) *watcher {
	return &watcher{s: s, subs: map[string]map[*mcp.ServerSession]bool{}, stop: make(chan struct{}), touched: map[string]bool{}}
}

// subscribe accepts any URI (only agentbox:// ones ever change) and starts the poller.
func (w *watcher) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	uri := req.Params.URI
	if strings.HasPrefix(uri, sandboxURIPrefix) {
		if id := strings.TrimPrefix(uri, sandboxURIPrefix); !sandbox.ValidID(id) {
			return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("%q is not a sandbox resource: use agentbox://sandboxes/sb-0123456789ab with an id from sandbox_create or sandbox_list", uri)}
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.known {
		// Start at the end of the log, so only changes after this subscription are reported.
		cur, err := w.s.lastSeq(ctx)
		if err != nil {
			return resourceError(uri, err)
		}
		w.cursor, w.known = cur, true
	}
	if w.subs[uri] == nil {
		w.subs[uri] = map[*mcp.ServerSession]bool{}
	}
	w.subs[uri][req.Session] = true
	if !w.running && !w.closed {
		w.running = true
		go w.loop()
	}
	return nil
}

func (w *watcher) unsubscribe(_ context.Context, req *mcp.UnsubscribeRequest) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m := w.subs[req.Params.URI]; m != nil {
		delete(m, req.Session)
		if len(m) == 0 {
			delete(w.subs, req.Params.URI)
		}
	}
	return nil
}

// touch asks for a notification about id at the next poll (for changes that record no event,
// such as an extended expiry).
func (w *watcher) touch(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running {
		w.touched[id] = true
	}
}

func (w *watcher) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.stop)
	}
}

func (w *watcher) loop() {
	defer func() {
		if v := recover(); v != nil {
			w.s.log.Error("panic in the subscription poller; recovered", "panic", fmt.Sprint(v))
			w.mu.Lock()
			w.running = false
			w.mu.Unlock()
		}
	}()
	t := time.NewTicker(w.s.opts.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		if !w.poll() {
			return
		}
	}
}

// poll reads new events and notifies subscribers; it returns false (and stops the poller) when
// nobody is subscribed any more.
func (w *watcher) poll() bool {
	live := map[*mcp.ServerSession]bool{}
	for ss := range w.s.mcp.Sessions() {
		live[ss] = true
	}
	w.mu.Lock()
	for uri, m := range w.subs {
		for ss := range m {
			if !live[ss] {
				delete(m, ss)
			}
		}
		if len(m) == 0 {
			delete(w.subs, uri)
		}
	}
	if len(w.subs) == 0 {
		w.running, w.known = false, false
		w.mu.Unlock()
		return false
	}
	cursor := w.cursor
	changed := w.touched
	w.touched = map[string]bool{}
	w.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		evs, err := w.s.b.Events(ctx, sandbox.EventFilter{AfterSeq: cursor, Limit: sandbox.MaxList})
		if err != nil {
			w.s.log.Warn("subscription poll failed; retrying", "err", err)
			break
		}
		for _, ev := range evs {
			cursor = ev.Seq
			changed[ev.SandboxID] = true
		}
		if len(evs) < sandbox.MaxList {
			break
		}
	}
	w.mu.Lock()
	w.cursor = cursor
	var uris []string
	for id := range changed {
		if w.subs[SandboxURI(id)] != nil {
			uris = append(uris, SandboxURI(id))
		}
	}
	if len(changed) > 0 {
		for _, u := range []string{URISandboxes, URICapacity} {
			if w.subs[u] != nil {
				uris = append(uris, u)
			}
		}
	}
	w.mu.Unlock()
	for _, u := range uris {
		if err := w.s.mcp.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: u}); err != nil {
			w.s.log.Warn("resource update notification failed", "uri", u, "err", err)
		}
	}
	return true
}

// lastSeq returns the sequence number of the newest event.
func (s *Server) lastSeq(ctx context.Context) (int64, error) {
	var cur int64
	for {
		evs, err := s.b.Events(ctx, sandbox.EventFilter{AfterSeq: cur, Limit: sandbox.MaxList})
		if err != nil {
			return 0, err
		}
		if len(evs) > 0 {
			cur = evs[len(evs)-1].Seq
		}
		if len(evs) < sandbox.MaxList {
			return cur, nil
		}
	}
}
