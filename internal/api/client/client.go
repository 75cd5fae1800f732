// Package client is the Go client of agentbox's REST API, used by the CLI. It finds the server's
// address and token itself (AGENTBOX_URL / AGENTBOX_TOKEN override) and returns the server's
// typed errors as *errcode.Error.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// Client calls one agentbox server.
type Client struct {
	base  string
	token string
	hc    *http.Client
}

// New returns a client for baseURL (e.g. http://127.0.0.1:8765) with a bearer token.
func New(baseURL, token string) *Client {
	return &Client{base: strings.TrimRight(baseURL, "/"), token: token, hc: &http.Client{}}
}

// BaseURL returns the server address.
func (c *Client) BaseURL() string { return c.base }

func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, ctype string) (*http.Response, error) {
	return c.doAccept(ctx, method, path, q, body, ctype, "")
}

// doAccept is do with an Accept header ("" for none).
func (c *Client) doAccept(ctx context.Context, method, path string, q url.Values, body io.Reader, ctype, accept string) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the agentbox server at %s (is `agentbox serve` running? set AGENTBOX_URL to point elsewhere): %w", c.base, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func decodeError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var b struct {
		Error struct {
			Code    string         `json:"code"`
			Message string         `json:"message"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &b); err != nil || b.Error.Code == "" {
		return errcode.New(errcode.Internal, "server answered %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	return &errcode.Error{Code: errcode.Code(b.Error.Code), Message: b.Error.Message, Details: b.Error.Details}
}

func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ctype := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
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
	return json.NewDecoder(resp.Body).Decode(out)
}

// Health calls GET /health (no token needed).
func (c *Client) Health(ctx context.Context) error {
	return c.doJSON(ctx, http.MethodGet, "/health", nil, nil, nil)
}

// Create creates a sandbox.
func (c *Client) Create(ctx context.Context, req wire.CreateRequest) (wire.Sandbox, error) {
	return c.CreateWithProgress(ctx, req, nil)
}

// CreateWithProgress creates a sandbox; when the create pulls its image, progress (if non-nil)
// gets the pull's reports as the server streams them.
func (c *Client) CreateWithProgress(ctx context.Context, req wire.CreateRequest, progress func(wire.ImageProgress)) (wire.Sandbox, error) {
	var sb wire.Sandbox
	if progress != nil && req.Image != "" && req.Image != "host" {
		err := c.imageOp(ctx, http.MethodPost, "/v1/sandboxes", req, nil, "", progress, &sb)
		return sb, err
	}
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &sb)
	return sb, err
}

// Get returns a sandbox.
func (c *Client) Get(ctx context.Context, id string) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb)
	return sb, err
}

// List lists sandboxes; states and labels filter.
func (c *Client) List(ctx context.Context, states []string, labels map[string]string) ([]wire.Sandbox, error) {
	q := url.Values{}
	if len(states) > 0 {
		q.Set("state", strings.Join(states, ","))
	}
	for k, v := range labels {
		q.Add("label", k+"="+v)
	}
	var l wire.SandboxList
	err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &l)
	return l.Sandboxes, err
}

// Destroy destroys a sandbox.
func (c *Client) Destroy(ctx context.Context, id string) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.doJSON(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb)
	return sb, err
}

// Extend extends a sandbox's TTL.
func (c *Client) Extend(ctx context.Context, id string, ttlSeconds int64) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/extend", nil, wire.ExtendRequest{TTLSeconds: ttlSeconds}, &sb)
	return sb, err
}

// Exec runs a command; with onOutput non-nil the output is streamed to it as it happens.
func (c *Client) Exec(ctx context.Context, id string, req wire.ExecRequest, onOutput func(stream string, data []byte)) (wire.ExecResult, error) {
	path := "/v1/sandboxes/" + url.PathEscape(id) + "/exec"
	var res wire.ExecResult
	if onOutput == nil {
		err := c.doJSON(ctx, http.MethodPost, path, nil, req, &res)
		return res, err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return res, err
	}
	resp, err := c.do(ctx, http.MethodPost, path, url.Values{"stream": {"true"}}, bytes.NewReader(b), "application/json")
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var f wire.ExecFrame
		if err := dec.Decode(&f); err != nil {
			if err == io.EOF {
				break
			}
			return res, fmt.Errorf("bad frame from server: %w", err)
		}
		switch {
		case f.Error != nil:
			return res, &errcode.Error{Code: f.Error.Code, Message: f.Error.Message, Details: f.Error.Details}
		case f.Result != nil:
			return *f.Result, nil
		default:
			onOutput(f.Stream, f.Data)
		}
	}
	return res, errcode.New(errcode.Internal, "the server closed the stream before the command finished")
}

// WriteFile uploads r to path in the sandbox.
func (c *Client) WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) (wire.FileInfo, error) {
	q := url.Values{"path": {path}, "mode": {fmt.Sprintf("%04o", mode)}}
	resp, err := c.do(ctx, http.MethodPut, "/v1/sandboxes/"+url.PathEscape(id)+"/files", q, r, "application/octet-stream")
	if err != nil {
		return wire.FileInfo{}, err
	}
	defer resp.Body.Close()
	var fi wire.FileInfo
	err = json.NewDecoder(resp.Body).Decode(&fi)
	return fi, err
}

// ReadFile downloads a byte range (length 0 = to the end) and returns the body and total size.
func (c *Client) ReadFile(ctx context.Context, id, path string, offset, length int64) (io.ReadCloser, int64, error) {
	q := url.Values{"path": {path}}
	if offset > 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	if length > 0 {
		q.Set("length", strconv.FormatInt(length, 10))
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/files", q, nil, "")
	if err != nil {
		return nil, 0, err
	}
	size, _ := strconv.ParseInt(resp.Header.Get(wire.SizeHeader), 10, 64)
	return resp.Body, size, nil
}

// Stat describes a file in the sandbox.
func (c *Client) Stat(ctx context.Context, id, path string) (wire.FileInfo, error) {
	var fi wire.FileInfo
	err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/files/stat", url.Values{"path": {path}}, nil, &fi)
	return fi, err
}

// ListDir lists a directory in the sandbox.
func (c *Client) ListDir(ctx context.Context, id, path string) (wire.DirList, error) {
	var dl wire.DirList
	err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/files/list", url.Values{"path": {path}}, nil, &dl)
	return dl, err
}

// Events lists a sandbox's events ("" = all sandboxes).
func (c *Client) Events(ctx context.Context, id string) ([]wire.Event, error) {
	var l wire.EventList
	q := url.Values{}
	if id != "" {
		q.Set("sandbox_id", id)
	}
	err := c.doJSON(ctx, http.MethodGet, "/v1/events", q, nil, &l)
	return l.Events, err
}

// Capacity returns the server's capacity.
func (c *Client) Capacity(ctx context.Context) (wire.Capacity, error) {
	var cp wire.Capacity
	err := c.doJSON(ctx, http.MethodGet, "/v1/capacity", nil, nil, &cp)
	return cp, err
}

// Runtimes returns the server's runtimes.
func (c *Client) Runtimes(ctx context.Context) ([]wire.Capabilities, error) {
	var r struct {
		Runtimes []wire.Capabilities `json:"runtimes"`
	}
	err := c.doJSON(ctx, http.MethodGet, "/v1/runtimes", nil, nil, &r)
	return r.Runtimes, err
}

// Metrics samples a running sandbox's resource use.
func (c *Client) Metrics(ctx context.Context, id string) (wire.SandboxMetrics, error) {
	var m wire.SandboxMetrics
	err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/metrics", nil, nil, &m)
	return m, err
}

// FleetMetrics samples every running sandbox.
func (c *Client) FleetMetrics(ctx context.Context) (wire.FleetMetrics, error) {
	var m wire.FleetMetrics
	err := c.doJSON(ctx, http.MethodGet, "/v1/fleet/metrics", nil, nil, &m)
	return m, err
}

// HTTP returns an http.Client for the server's other endpoints (its MCP endpoint, /mcp): the
// client's TLS trust, with its bearer token on every request.
func (c *Client) HTTP() *http.Client {
	base := c.hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	return &http.Client{Transport: bearer{token: c.token, base: base}}
}

// bearer adds a token to every request.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.token == "" {
		return b.base.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}
