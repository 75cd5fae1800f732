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
		Description: `How much of the server's bounds live sandboxes use: {max_sandboxes, live, free, cpu_budget, cpu_used, cpu_free, memory_budget_mb, memory_used_mb, memory_free_mb, disk_budget_mb, disk_used_mb, disk_free_mb, overcommit, host_memory_available_mb, host_memory_reserve_mb, host_disk_free_mb, host_disk_reserve_mb}.`,
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
	l, err := s.heldList(ctx, req.Session)
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
	owner, _ := s.ownerOf(ctx, req.Session)
	s.held.seen(owner, sb)
	return jsonContents(req.Params.URI, out)
}

func (s *Server) readCapacity(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	c, err := s.b.Capacity(ctx)
	if err != nil {
		return nil, resourceError(req.Params.URI, err)
	}
	return jsonContents(req.Params.URI, capacityInfo(c))
}

// watcher implements resource subscriptions on the backend's event stream (Backend.Subscribe:
// the service's event bus), so it sees
// changes made by anyone, as they are recorded. It follows the stream only while someone is
// subscribed.
type watcher struct {
	s *Server

	mu      sync.Mutex
	subs    map[string]map[*mcp.ServerSession]bool // uri → sessions
	cancel  context.CancelFunc                     // ends the stream being followed; nil when none
	closed  bool
	stopped chan struct{} // closed when the current follower returns
}

func newWatcher(s *Server) *watcher {
	return &watcher{s: s, subs: map[string]map[*mcp.ServerSession]bool{}}
}

// subscribe accepts any URI (only agentbox:// ones ever change) and starts following events.
func (w *watcher) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	uri := req.Params.URI
	if strings.HasPrefix(uri, sandboxURIPrefix) {
		if id := strings.TrimPrefix(uri, sandboxURIPrefix); !sandbox.ValidID(id) {
			return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("%q is not a sandbox resource: use agentbox://sandboxes/sb-0123456789ab with an id from sandbox_create or sandbox_list", uri)}
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel == nil && !w.closed {
		// Start at the end of the log, so only changes after this subscription are reported.
		cur, err := w.s.lastSeq(ctx)
		if err != nil {
			return resourceError(uri, err)
		}
		fctx, cancel := context.WithCancel(context.Background())
		ch, err := w.s.b.Subscribe(fctx, cur)
		if err != nil {
			cancel()
			return resourceError(uri, err)
		}
		w.cancel, w.stopped = cancel, make(chan struct{})
		go w.follow(ch, w.stopped)
	}
	if w.subs[uri] == nil {
		w.subs[uri] = map[*mcp.ServerSession]bool{}
	}
	w.subs[uri][req.Session] = true
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
	w.stopIfIdle()
	return nil
}

// stopIfIdle ends the stream when nobody is subscribed. Callers hold mu.
func (w *watcher) stopIfIdle() {
	if len(w.subs) == 0 && w.cancel != nil {
		w.cancel()
		w.cancel = nil
	}
}

func (w *watcher) close() {
	w.mu.Lock()
	w.closed = true
	if w.cancel != nil {
		w.cancel()
		w.cancel = nil
	}
	stopped := w.stopped
	w.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
}

// follow notifies subscribers of each event until the stream ends.
func (w *watcher) follow(ch <-chan sandbox.Event, stopped chan struct{}) {
	defer close(stopped)
	defer func() {
		if v := recover(); v != nil {
			w.s.log.Error("panic in the subscription follower; recovered", "panic", fmt.Sprint(v))
			w.mu.Lock()
			if w.cancel != nil {
				w.cancel()
				w.cancel = nil
			}
			w.mu.Unlock()
			for range ch { // let the stream end
			}
		}
	}()
	for ev := range ch {
		for _, u := range w.targets(ev) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := w.s.mcp.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: u}); err != nil {
				w.s.log.Warn("resource update notification failed", "uri", u, "err", err)
			}
			cancel()
		}
	}
}

// targets returns the subscribed URIs ev changes, after forgetting the subscriptions of
// sessions that have ended (and ending the stream if none is left). A sandbox's resource
// changes with every event (an extend moves its expiry); the list and capacity with state
// changes.
func (w *watcher) targets(ev sandbox.Event) []string {
	live := map[*mcp.ServerSession]bool{}
	for ss := range w.s.mcp.Sessions() {
		live[ss] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
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
	w.stopIfIdle()
	var uris []string
	if w.subs[SandboxURI(ev.SandboxID)] != nil {
		uris = append(uris, SandboxURI(ev.SandboxID))
	}
	if ev.Type == "extend" {
		if w.subs[URISandboxes] != nil {
			uris = append(uris, URISandboxes) // expires_in_seconds moved
		}
		return uris
	}
	for _, u := range []string{URISandboxes, URICapacity} {
		if w.subs[u] != nil {
			uris = append(uris, u)
		}
	}
	return uris
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
