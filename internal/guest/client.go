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
)

// Client talks to one guest agent. It is safe for concurrent use.
type Client struct {
	hc *http.Client
}

// Dialer opens a byte stream to the agent.
type Dialer func(ctx context.Context) (net.Conn, error)

// NewClient returns a client that reaches the agent through dial.
func NewClient(dial Dialer) *Client {
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &Client{hc: &http.Client{Transport: tr}}
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

func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, ctype string) (*http.Response, error) {
	u := base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "bad request to the guest agent")
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
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
		return nil, decodeError(resp)
	}
	return resp, nil
}

func decodeError(resp *http.Response) error {
	var eb ErrorBody
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err := json.Unmarshal(data, &eb); err != nil || eb.Code == "" {
		return errcode.New(errcode.Internal, "guest agent answered %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	return &errcode.Error{Code: errcode.Code(eb.Code), Message: eb.Message, Details: eb.Details}
}

func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ctype := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return errcode.Wrap(errcode.InvalidArgument, err, "cannot encode request")
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, path, q, body, ctype)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return errcode.Wrap(errcode.Internal, err, "cannot decode the guest agent's reply")
	}
	return nil
}

// Health checks that the agent answers.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.doJSON(ctx, http.MethodGet, "/health", nil, nil, &h)
	return h, err
}

// OOMKill asks the agent to kill the command holding the most memory (the host's OOM guard).
func (c *Client) OOMKill(ctx context.Context) (OOMKillResult, error) {
	var res OOMKillResult
	err := c.doJSON(ctx, http.MethodPost, "/oom-kill", nil, nil, &res)
	return res, err
}

// OutputFunc receives output as the command produces it.
type OutputFunc func(stream string, data []byte)

// Exec runs a command. With onOutput non-nil, output is streamed to it while the command runs
// (the result still holds the kept output). Cancelling ctx kills the command.
func (c *Client) Exec(ctx context.Context, req ExecRequest, onOutput OutputFunc) (ExecResult, error) {
	req.Stream = onOutput != nil
	if !req.Stream {
		var res ExecResult
		err := c.doJSON(ctx, http.MethodPost, "/exec", nil, req, &res)
		return res, err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return ExecResult{}, errcode.Wrap(errcode.InvalidArgument, err, "cannot encode request")
	}
	resp, err := c.do(ctx, http.MethodPost, "/exec", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return ExecResult{}, err
	}
	defer resp.Body.Close()
	// A decoder, not a line scanner: the Result frame holds up to 2×MaxMaxOutputBytes of
	// output, which JSON escaping can grow up to sixfold, far beyond any fixed line limit.
	dec := json.NewDecoder(resp.Body)
	for {
		var f Frame
		if err := dec.Decode(&f); err != nil {
			var se *json.SyntaxError
			var te *json.UnmarshalTypeError
			if errors.As(err, &se) || errors.As(err, &te) {
				return ExecResult{}, errcode.Wrap(errcode.Internal, err, "bad frame from the guest agent")
			}
			break // end of stream or broken connection
		}
		switch {
		case f.Error != nil:
			return ExecResult{}, &errcode.Error{Code: errcode.Code(f.Error.Code), Message: f.Error.Message, Details: f.Error.Details}
		case f.Result != nil:
			return *f.Result, nil
		case len(f.Data) > 0:
			onOutput(f.Stream, f.Data)
		}
	}
	if ctx.Err() != nil {
		return ExecResult{}, ctx.Err()
	}
	return ExecResult{}, errcode.New(errcode.SandboxNotRunning, "the guest agent closed the stream before the command finished (the sandbox may have stopped)")
}

// WriteFile writes r to path atomically with the given permission bits.
func (c *Client) WriteFile(ctx context.Context, path string, mode uint32, r io.Reader) (FileInfo, error) {
	q := url.Values{"path": {path}, "mode": {fmt.Sprintf("%04o", mode&0o7777)}}
	resp, err := c.do(ctx, http.MethodPut, "/files", q, r, "application/octet-stream")
	if err != nil {
		return FileInfo{}, err
	}
	defer resp.Body.Close()
	var fi FileInfo
	if err := json.NewDecoder(resp.Body).Decode(&fi); err != nil {
		return FileInfo{}, errcode.Wrap(errcode.Internal, err, "cannot decode the guest agent's reply")
	}
	return fi, nil
}

// ReadFile opens a byte range of a regular file: from offset, length bytes (0 = to the end),
// refusing with FILE_TOO_LARGE when the range exceeds limit (0 = DefaultReadLimit). It returns
// the body and the file's total size; the caller closes the body.
func (c *Client) ReadFile(ctx context.Context, path string, offset, length, limit int64) (io.ReadCloser, int64, error) {
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
	resp, err := c.do(ctx, http.MethodGet, "/files", q, nil, "")
	if err != nil {
		return nil, 0, err
	}
	size, _ := strconv.ParseInt(resp.Header.Get(SizeHeader), 10, 64)
	return resp.Body, size, nil
}

// Stat describes path (symlinks are followed inside the sandbox).
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	err := c.doJSON(ctx, http.MethodGet, "/files/stat", url.Values{"path": {path}}, nil, &fi)
	return fi, err
}

// List lists a directory, bounded by MaxListEntries.
func (c *Client) List(ctx context.Context, path string) (DirList, error) {
	var dl DirList
	err := c.doJSON(ctx, http.MethodGet, "/files/list", url.Values{"path": {path}}, nil, &dl)
	return dl, err
}

// Mkdir creates a directory.
func (c *Client) Mkdir(ctx context.Context, req MkdirRequest) (FileInfo, error) {
	var fi FileInfo
	err := c.doJSON(ctx, http.MethodPost, "/files/mkdir", nil, req, &fi)
	return fi, err
}

// Remove deletes a file, or a directory tree with recursive.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.doJSON(ctx, http.MethodDelete, "/files", q, nil, nil)
}

// WaitReady polls Health until the agent answers or ctx ends. A failed dial of a socket that
// does not exist yet costs microseconds, so it polls every millisecond for the first second
// (an agent normally comes up in a few) and every 20 ms after that.
func (c *Client) WaitReady(ctx context.Context) error {
	start := time.Now()
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		h, err := c.Health(hctx)
		cancel()
		if err == nil && h.OK {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("the agent answered health with ok=false: %+v", h)
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
