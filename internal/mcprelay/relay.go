// Package mcprelay relays one MCP client connection (stdio) to an MCP server's streamable HTTP
// endpoint, message for message. `agentbox mcp` uses it when a server is running, so that there
// is one MCP implementation, in the server's process: the HTTP session is the client's owner
// there, and every tool, notification and server-to-client request is the server's own.
//
// Both ends are the go-sdk's transports (the stdio side and StreamableClientTransport). The relay
// adds what the SDK's client session would do on top of the streamable client connection and a
// raw relay cannot ask it to: the MCP-Protocol-Version header once the version is negotiated, and
// the standalone event stream (an HTTP GET) that carries the server's messages unrelated to a
// request, such as resource updates, under the session-based protocol versions.
package mcprelay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The HTTP headers of the streamable transport the relay sets itself.
const (
	headerProtocolVersion = "Mcp-Protocol-Version"
	headerSessionID       = "Mcp-Session-Id"
)

// perRequestVersion is the first protocol version without sessions or a standalone stream: each
// request carries its version, and subscriptions are a request (subscriptions/listen).
const perRequestVersion = "2026-07-28"

// maxEvent bounds one event of the standalone stream (notifications: small).
const maxEvent = 8 << 20

// Options says where to relay to.
type Options struct {
	// Endpoint is the server's streamable HTTP endpoint (e.g. http://127.0.0.1:8765/mcp).
	Endpoint string
	// HTTPClient makes every request: authentication and TLS trust are its business (nil:
	// http.DefaultClient).
	HTTPClient *http.Client
	// Logger gets the relay's own diagnostics (nil: discarded).
	Logger *slog.Logger
	// OnSession, if set, is told the server's session id once the session is initialized.
	OnSession func(id string)
}

type relay struct {
	opts          Options
	hc            *http.Client
	log           *slog.Logger
	local, remote mcp.Connection

	mu      sync.Mutex
	version string                            // the negotiated protocol version, once known
	initID  jsonrpc.ID                        // the client's initialize request, while it is pending
	calls   map[jsonrpc.ID]context.CancelFunc // calls in flight to the server
	wg      sync.WaitGroup                    // the calls' writers and the standalone stream
}

// Run relays between local (e.g. &mcp.StdioTransport{}) and the server until either ends. The
// local side's end (stdin closed) closes the server session (an HTTP DELETE) and returns nil;
// the server's end (it stopped, or dropped the session) closes the local side and returns why.
// Cancelling ctx ends both.
func Run(ctx context.Context, local mcp.Transport, opts Options) error {
	r := &relay{opts: opts, log: opts.Logger, calls: map[jsonrpc.ID]context.CancelFunc{}}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	base := opts.HTTPClient
	if base == nil {
		base = http.DefaultClient
	}
	hc := *base
	rt := hc.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	hc.Transport = versionHeader{r: r, base: rt}
	r.hc = &hc

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lc, err := local.Connect(ctx)
	if err != nil {
		return err
	}
	rc, err := (&mcp.StreamableClientTransport{Endpoint: opts.Endpoint, HTTPClient: r.hc}).Connect(ctx)
	if err != nil {
		lc.Close()
		return err
	}
	r.local, r.remote = lc, rc

	downErr := make(chan error, 1)
	go func() {
		err := r.down(ctx)
		cancel() // ends the local read
		downErr <- err
	}()
	upErr := r.up(ctx) // nil: the local side ended; else ctx was cancelled (by down, or the caller)
	cancel()
	_ = rc.Close() // the session's DELETE (detached from ctx); ends down's read
	dErr := <-downErr
	r.wg.Wait()
	_ = lc.Close()
	switch {
	case upErr == nil: // whatever the server side says now follows our own close
		return nil
	case !errors.Is(upErr, context.Canceled):
		return upErr
	case dErr != nil && !errors.Is(dErr, io.EOF) && !errors.Is(dErr, context.Canceled):
		return dErr
	}
	return nil
}

// up forwards the local client's messages to the server until the local side ends (nil) or ctx
// is cancelled.
func (r *relay) up(ctx context.Context) error {
	for {
		msg, err := r.local.Read(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, mcp.ErrConnectionClosed) {
				return nil
			}
			return err
		}
		switch m := msg.(type) {
		case *jsonrpc.Request:
			switch {
			case m.IsCall() && m.Method == "initialize":
				// Before anything else: its reply names the session the others belong to.
				r.mu.Lock()
				r.initID = m.ID
				r.mu.Unlock()
				if err := r.remote.Write(ctx, m); err != nil {
					r.replyError(ctx, m.ID, err)
				}
			case m.IsCall():
				// A call's POST answers when the server first writes to its stream, which may be
				// its result: calls go concurrently, as an SDK client sends them.
				cctx, ccancel := context.WithCancel(ctx)
				r.mu.Lock()
				r.calls[m.ID] = ccancel
				r.mu.Unlock()
				r.wg.Add(1)
				go func() {
					defer r.wg.Done()
					if err := r.remote.Write(cctx, m); err != nil {
						r.endCall(m.ID)
						if cctx.Err() == nil {
							r.replyError(ctx, m.ID, err)
						}
					}
				}()
			default:
				if err := r.remote.Write(ctx, m); err != nil {
					r.log.Warn("mcp relay: a notification did not reach the server", "method", m.Method, "err", err)
				}
				switch m.Method {
				case "notifications/cancelled":
					// The server cancels the call; dropping its stream ends the request here too.
					var p struct {
						RequestID any `json:"requestId"`
					}
					if json.Unmarshal(m.Params, &p) == nil {
						if id, err := jsonrpc.MakeID(p.RequestID); err == nil {
							r.endCall(id)
						}
					}
				case "notifications/initialized":
					r.startListening(ctx)
				}
			}
		case *jsonrpc.Response: // the client's answer to a server's request (an elicitation)
			if err := r.remote.Write(ctx, m); err != nil {
				r.log.Warn("mcp relay: a reply did not reach the server", "id", m.ID, "err", err)
			}
		}
	}
}

// down forwards the server's messages to the local client until the server side ends.
func (r *relay) down(ctx context.Context) error {
	for {
		msg, err := r.remote.Read(ctx)
		if err != nil {
			return err
		}
		if resp, ok := msg.(*jsonrpc.Response); ok {
			r.mu.Lock()
			if r.initID.IsValid() && resp.ID == r.initID {
				r.initID = jsonrpc.ID{}
				var res struct {
					ProtocolVersion string `json:"protocolVersion"`
				}
				if resp.Error == nil && json.Unmarshal(resp.Result, &res) == nil {
					r.version = res.ProtocolVersion
				}
			}
			r.mu.Unlock()
			r.endCall(resp.ID)
		}
		if err := r.local.Write(ctx, msg); err != nil {
			return err
		}
	}
}

// endCall forgets a call in flight, ending its request to the server.
func (r *relay) endCall(id jsonrpc.ID) {
	r.mu.Lock()
	cancel := r.calls[id]
	delete(r.calls, id)
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// replyError answers a call the server could not be asked.
func (r *relay) replyError(ctx context.Context, id jsonrpc.ID, err error) {
	werr := &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("the agentbox server at %s did not take the request: %v", r.opts.Endpoint, err)}
	var rpcErr *jsonrpc.Error
	if errors.As(err, &rpcErr) {
		werr = rpcErr
	}
	if err := r.local.Write(ctx, &jsonrpc.Response{ID: id, Error: werr}); err != nil {
		r.log.Debug("mcp relay: cannot reply to the client", "err", err)
	}
}

func (r *relay) protocolVersion() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// startListening opens the standalone event stream of a session-based protocol version: the
// SDK's client session opens it on the streamable connection once initialized, which a relay
// cannot ask of the connection.
func (r *relay) startListening(ctx context.Context) {
	sid := r.remote.SessionID()
	if r.opts.OnSession != nil && sid != "" {
		r.opts.OnSession(sid)
	}
	if v := r.protocolVersion(); sid == "" || v == "" || v >= perRequestVersion {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.listen(ctx, sid)
	}()
}

// listen reads the standalone stream, reconnecting when the server ends it, until ctx ends or the
// server says it has none.
func (r *relay) listen(ctx context.Context, sid string) {
	failures := 0
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.opts.Endpoint, nil)
		if err != nil {
			r.log.Warn("mcp relay: standalone stream", "err", err)
			return
		}
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set(headerSessionID, sid)
		resp, err := r.hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if failures++; failures > 5 {
				r.log.Warn("mcp relay: the standalone stream cannot be opened; the server's unsolicited notifications will not arrive", "err", err)
				return
			}
			sleep(ctx, time.Duration(failures)*time.Second)
			continue
		}
		if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
			// 405: the server offers no standalone stream; 404: the session is gone, which the
			// requests' side reports.
			resp.Body.Close()
			r.log.Debug("mcp relay: no standalone stream", "status", resp.Status)
			return
		}
		failures = 0
		err = readEvents(resp.Body, func(data []byte) error {
			msg, err := jsonrpc.DecodeMessage(data)
			if err != nil {
				return err
			}
			return r.local.Write(ctx, msg)
		})
		resp.Body.Close()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.log.Warn("mcp relay: standalone stream", "err", err)
		}
		sleep(ctx, time.Second) // the server ended the stream: open it again
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// readEvents calls fn with the data of each "message" event of a text/event-stream body until it
// ends or fn fails. (The SDK's own event reader is not exported.)
func readEvents(body io.Reader, fn func(data []byte) error) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), maxEvent)
	var data bytes.Buffer
	name := ""
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 { // the end of an event
			if data.Len() > 0 && (name == "" || name == "message") {
				if err := fn(bytes.Clone(data.Bytes())); err != nil {
					return err
				}
			}
			data.Reset()
			name = ""
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.Write(value)
		case "event":
			name = string(value)
		}
	}
	return sc.Err()
}

// versionHeader puts the negotiated protocol version on requests that lack it, as the SDK's
// client session does once initialized.
type versionHeader struct {
	r    *relay
	base http.RoundTripper
}

func (v versionHeader) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get(headerProtocolVersion) == "" {
		if pv := v.r.protocolVersion(); pv != "" {
			req = req.Clone(req.Context())
			req.Header.Set(headerProtocolVersion, pv)
		}
	}
	return v.base.RoundTrip(req)
}
