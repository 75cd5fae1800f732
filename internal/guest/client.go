package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
)

// Client talks to one guest agent. It is safe for concurrent use. It trusts nothing the agent
// sends: every reply is read within the protocol's bound for it (see reply.go), only the error
// codes the agent's endpoint may return are passed on, marked as the agent's (agenterr.go), and
// every read ends when the caller's context does.
type Client struct {
	hc *http.Client
	// dial opens a connection of its own for the upgraded endpoints that hand the caller the
	// raw connection (net_client.go).
	dial Dialer
	// parkedListeners: NetSession does not ask for the listeners with its reply, so the agent
	// hands them over parked connections, as it does for an older host (tests).
	parkedListeners bool
}

// Dialer opens a byte stream to the agent.
type Dialer func(ctx context.Context) (net.Conn, error)

// NewClient returns a client that reaches the agent through dial.
func NewClient(dial Dialer) *Client {
	tr := &http.Transport{
		DialContext:            func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConnsPerHost:    8,
		IdleConnTimeout:        30 * time.Second,
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxHeaderBytes,
	}
	return &Client{hc: &http.Client{Transport: tr}, dial: dial}
}

// PermanentError marks a Dialer's error that no retry clears (the sandbox cannot start: its
// pod cannot pull its image, or has stopped): WaitReady returns it at once instead of
// retrying until its deadline.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError (nil stays nil).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// NewUnixClient returns a client for an agent listening on a unix socket. It never follows a
// symlink in the socket's last path component (see dialSocket).
func NewUnixClient(socketPath string) *Client {
	var d net.Dialer
	return NewClient(func(ctx context.Context) (net.Conn, error) {
		return dialSocket(ctx, &d, socketPath)
	})
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

const base = "http://agent/" + Version

// call is one request to the agent: what the reply to it may hold.
type call struct {
	method, path string
	query        url.Values
	body         io.Reader
	ctype        string
	// codes are the error codes the endpoint may return.
	codes []errcode.Code
}

// do sends c and returns the reply of a successful call; the caller closes its body, and
// closing it before its end drops the connection. The request is tied to ctx: when ctx ends,
// the connection is closed and every read of the body fails.
func (c *Client) do(ctx context.Context, k call) (*http.Response, error) {
	u := base + k.path
	if len(k.query) > 0 {
		u += "?" + k.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, k.method, u, k.body)
	if err != nil {
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "bad request to the guest agent")
	}
	if k.ctype != "" {
		req.Header.Set("Content-Type", k.ctype)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent is not reachable")
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, ctxErr(ctx, agent.ReadError(resp, k.path, k.codes...))
	}
	return resp, nil
}

// ctxErr prefers the context's error once the caller has gone: what the agent sent after that
// was cut short by it.
func ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// doJSON sends in (if not nil) as JSON and decodes a reply of at most limit bytes into out
// (nil: the reply must be empty), checked with valid (if not nil).
func doJSON[T any](ctx context.Context, c *Client, k call, in any, out *T, limit int64, valid func(*T) error) error {
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return errcode.Wrap(errcode.InvalidArgument, err, "cannot encode request")
		}
		k.body, k.ctype = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, k)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, err := agent.Read(resp.Body, k.path, 0)
		return ctxErr(ctx, err)
	}
	return ctxErr(ctx, peerreply.Decode(agent, resp.Body, k.path, limit, out, valid))
}

// Health checks that the agent answers.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := doJSON(ctx, c, call{method: http.MethodGet, path: "/health", codes: baseCodes}, nil, &h, maxHealthReply, nil)
	return h, err
}

// OOMKill asks the agent to kill the command holding the most memory (the host's OOM guard).
func (c *Client) OOMKill(ctx context.Context) (OOMKillResult, error) {
	var res OOMKillResult
	err := doJSON(ctx, c, call{method: http.MethodPost, path: "/oom-kill", codes: baseCodes}, nil, &res, maxOOMKillReply, validOOMKill)
	return res, err
}

// Sync asks the agent to write back every file system's dirty data (sync(2)); it returns once
// the data is on the sandbox's disks.
func (c *Client) Sync(ctx context.Context) error {
	var res struct {
		OK bool `json:"ok"`
	}
	return doJSON(ctx, c, call{method: http.MethodPost, path: "/sync", codes: baseCodes}, nil, &res, maxHealthReply, nil)
}

// OutputFunc receives output as the command produces it.
type OutputFunc func(stream string, data []byte)

// Exec runs a command. With onOutput non-nil, output is streamed to it while the command runs
// (the result still holds the kept output); it is handed on frame by frame, never accumulated
// here, so a command may stream without end. Cancelling ctx kills the command.
func (c *Client) Exec(ctx context.Context, req ExecRequest, onOutput OutputFunc) (ExecResult, error) {
	req.Stream = onOutput != nil
	k := call{method: http.MethodPost, path: "/exec", codes: execCodes}
	var res ExecResult
	if !req.Stream {
		err := doJSON(ctx, c, k, req, &res, maxExecReply(req.MaxOutputBytes), validExecResult)
		return res, err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return res, errcode.Wrap(errcode.InvalidArgument, err, "cannot encode request")
	}
	k.body, k.ctype = bytes.NewReader(b), "application/json"
	resp, err := c.do(ctx, k)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	res, err = readFrames(newFrameReader(resp.Body, req.MaxOutputBytes), onOutput)
	return res, ctxErr(ctx, err)
}

// readFrames hands output frames to onOutput until the result or error frame.
func readFrames(fr *frameReader, onOutput OutputFunc) (ExecResult, error) {
	for {
		f, err := fr.next()
		switch {
		case errors.Is(err, errEndOfStream):
			return ExecResult{}, errcode.New(errcode.SandboxNotRunning, "the guest agent closed the stream before the command finished (the sandbox may have stopped)")
		case err != nil:
			return ExecResult{}, err
		case f.Error != nil:
			return ExecResult{}, agent.Error(*f.Error, "", execCodes)
		case f.Result != nil:
			return *f.Result, nil
		case len(f.Data) > 0:
			onOutput(f.Stream, f.Data)
		}
	}
}

// WriteFile writes r to path atomically with the given permission bits.
func (c *Client) WriteFile(ctx context.Context, path string, mode uint32, r io.Reader) (FileInfo, error) {
	q := url.Values{"path": {path}, "mode": {fmt.Sprintf("%04o", mode&0o7777)}}
	var fi FileInfo
	k := call{method: http.MethodPut, path: "/files", query: q, body: r, ctype: "application/octet-stream", codes: fileCodes}
	err := doJSON(ctx, c, k, nil, &fi, maxFileInfoReply, validFileInfo)
	return fi, err
}

// ReadFile opens a byte range of a regular file: from offset, length bytes (0 = to the end),
// refusing with FILE_TOO_LARGE when the range exceeds limit (0 = DefaultReadLimit). It returns
// the body and the file's total size; the caller closes the body. The body yields exactly the
// range the file's size allows, never more.
func (c *Client) ReadFile(ctx context.Context, path string, offset, length, limit int64) (io.ReadCloser, int64, error) {
	if offset < 0 || length < 0 || limit < 0 {
		return nil, 0, errcode.New(errcode.InvalidArgument, "offset, length and limit must not be negative")
	}
	q := url.Values{"path": {path}}
	if offset > 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	if length > 0 {
		q.Set("length", strconv.FormatInt(length, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.FormatInt(limit, 10))
	}
	resp, err := c.do(ctx, call{method: http.MethodGet, path: "/files", query: q, codes: fileCodes})
	if err != nil {
		return nil, 0, err
	}
	body, size, err := fileRange(resp, offset, length, limit)
	if err != nil {
		resp.Body.Close()
		return nil, 0, err
	}
	return body, size, nil
}

// Stat describes path (symlinks are followed inside the sandbox).
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	k := call{method: http.MethodGet, path: "/files/stat", query: url.Values{"path": {path}}, codes: fileCodes}
	err := doJSON(ctx, c, k, nil, &fi, maxFileInfoReply, validFileInfo)
	return fi, err
}

// List lists a directory, bounded by MaxListEntries.
func (c *Client) List(ctx context.Context, path string) (DirList, error) {
	resp, err := c.do(ctx, call{method: http.MethodGet, path: "/files/list", query: url.Values{"path": {path}}, codes: fileCodes})
	if err != nil {
		return DirList{}, err
	}
	defer resp.Body.Close()
	dl, err := decodeDirList(resp.Body)
	return dl, ctxErr(ctx, err)
}

// Mkdir creates a directory.
func (c *Client) Mkdir(ctx context.Context, req MkdirRequest) (FileInfo, error) {
	var fi FileInfo
	err := doJSON(ctx, c, call{method: http.MethodPost, path: "/files/mkdir", codes: fileCodes}, req, &fi, maxFileInfoReply, validFileInfo)
	return fi, err
}

// Remove deletes a file, or a directory tree with recursive.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return doJSON[struct{}](ctx, c, call{method: http.MethodDelete, path: "/files", query: q, codes: fileCodes}, nil, nil, 0, nil)
}

// WaitReady polls Health until the agent answers or ctx ends; a dial error marked Permanent
// ends it at once, and a timeout's error carries the last try's reason (the dialer's own, see
// ready). A failed dial of a socket that does not exist yet costs microseconds, so it polls
// every millisecond for the first second (an agent normally comes up in a few) and every 20 ms
// after that.
func (c *Client) WaitReady(ctx context.Context) error {
	start := time.Now()
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.ready(hctx)
		cancel()
		if err == nil {
			return nil
		}
		if pe := (*PermanentError)(nil); errors.As(err, &pe) {
			return fmt.Errorf("the agent cannot answer: %w", err)
		}
		delay := time.Millisecond
		if time.Since(start) > time.Second {
			delay = 20 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the agent did not answer (%w): %w", ctx.Err(), err)
		case <-time.After(delay):
		}
	}
}

// ready is one try of WaitReady: a dial of its own first, since net/http answers a dial that
// the request's context cut short with the context's error alone, and the dialer's reason (a
// pod still pulling its image, an init that has exited) is what a caller needs; then health.
// Dialing only after a health call timed out would not do: net/http (Go ≥ 1.26) lets such a
// dial run on after its request gives up, one more per try, until CloseIdleConnections.
func (c *Client) ready(ctx context.Context) error {
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	_ = conn.Close()
	h, err := c.Health(ctx)
	if err == nil && !h.OK {
		err = fmt.Errorf("the agent answered health with ok=false: %+v", h)
	}
	return err
}
