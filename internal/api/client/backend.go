package client

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxid"
	"github.com/agentbox/agentbox/internal/snippet"
)

// Backend presents a remote server with the method set of *sandbox.Service, so that an adapter
// written against the service (the MCP server) can drive a running `agentbox serve` instead of
// an in-process control plane. Errors are the server's typed errors; a server that cannot be
// reached gives an error that says so.
type Backend struct {
	c *Client

	mu       sync.Mutex
	runtimes []runtime.Capabilities // last answer, served when the server does not answer
}

// NewBackend returns a Backend over c.
func NewBackend(c *Client) *Backend { return &Backend{c: c} }

// unreachable types transport failures, keeping their cause for the log.
func (b *Backend) unreachable(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errcode.As(err); ok || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return errcode.Wrap(errcode.Internal, err, "the agentbox server at %s did not answer (is `agentbox serve` still running?): %v", b.c.base, err)
}

// Create creates a sandbox.
func (b *Backend) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	sb, err := b.c.Create(ctx, req)
	return sb, b.unreachable(err)
}

// checkID refuses a malformed id before it is put in a URL path, with the service's message.
func checkID(id string) error { return sandboxid.Check(id) }

// Get returns a sandbox's record.
func (b *Backend) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if err := checkID(id); err != nil {
		return sandbox.Sandbox{}, err
	}
	sb, err := b.c.Get(ctx, id)
	return sb, b.unreachable(err)
}

// List lists sandboxes matching f.
func (b *Backend) List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Sandbox, error) {
	q := url.Values{}
	var states []string
	for _, s := range f.States {
		states = append(states, string(s))
	}
	if len(states) > 0 {
		q.Set("state", strings.Join(states, ","))
	}
	for k, v := range f.Labels {
		q.Add("label", k+"="+v)
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var l api.SandboxList
	err := b.c.doJSON(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &l)
	return l.Sandboxes, b.unreachable(err)
}

// Destroy destroys a sandbox.
func (b *Backend) Destroy(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if err := checkID(id); err != nil {
		return sandbox.Sandbox{}, err
	}
	sb, err := b.c.Destroy(ctx, id)
	return sb, b.unreachable(err)
}

// Extend extends a sandbox's TTL.
func (b *Backend) Extend(ctx context.Context, id string, ttlSeconds int64) (sandbox.Sandbox, error) {
	if err := checkID(id); err != nil {
		return sandbox.Sandbox{}, err
	}
	sb, err := b.c.Extend(ctx, id, ttlSeconds)
	return sb, b.unreachable(err)
}

// Exec runs a command; with onOutput non-nil the output is streamed to it as it happens.
// Cancelling ctx ends the request, which kills the command on the server.
func (b *Backend) Exec(ctx context.Context, id string, req sandbox.ExecRequest, onOutput sandbox.OutputFunc) (sandbox.ExecResult, error) {
	if err := checkID(id); err != nil {
		return sandbox.ExecResult{}, err
	}
	wire := api.ExecRequest{Command: req.Argv, Env: req.Env, Cwd: req.Cwd, MaxOutputBytes: req.MaxOutputBytes,
		User: req.User, TimeoutSeconds: req.Timeout.Seconds(), Changes: req.Changes, Checkpoint: req.Checkpoint}
	if len(req.Stdin) > 0 {
		wire.StdinBase64 = base64.StdEncoding.EncodeToString(req.Stdin)
	}
	res, err := b.c.Exec(ctx, id, wire, onOutput)
	return res, b.unreachable(err)
}

// WriteFile writes r to path in the sandbox.
func (b *Backend) WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) (sandbox.FileInfo, error) {
	if err := checkID(id); err != nil {
		return sandbox.FileInfo{}, err
	}
	fi, err := b.c.WriteFile(ctx, id, path, mode, r)
	return fi, b.unreachable(err)
}

// ReadFile opens a byte range (length 0 = to the end), refusing with FILE_TOO_LARGE when the
// range exceeds limit (0 = the server's own bound). It never transfers more than limit+1 bytes.
func (b *Backend) ReadFile(ctx context.Context, id, path string, offset, length, limit int64) (io.ReadCloser, int64, error) {
	if err := checkID(id); err != nil {
		return nil, 0, err
	}
	ask := length
	if limit > 0 && (ask == 0 || ask > limit) {
		ask = limit + 1
	}
	rc, size, err := b.c.ReadFile(ctx, id, path, offset, ask)
	if err != nil {
		return nil, 0, b.unreachable(err)
	}
	n := max(0, size-offset)
	if length > 0 && length < n {
		n = length
	}
	if limit > 0 && n > limit {
		rc.Close()
		return nil, size, errcode.New(errcode.FileTooLarge, "%s is %d bytes and the requested range is %d bytes, more than the limit of %d; pass offset and length to read it in parts", path, size, n, limit).
			With("size", size).With("limit", limit)
	}
	return rc, size, nil
}

// ListDir lists a directory in the sandbox.
func (b *Backend) ListDir(ctx context.Context, id, path string) (sandbox.DirList, error) {
	if err := checkID(id); err != nil {
		return sandbox.DirList{}, err
	}
	dl, err := b.c.ListDir(ctx, id, path)
	return dl, b.unreachable(err)
}

// Events lists recorded state transitions.
func (b *Backend) Events(ctx context.Context, f sandbox.EventFilter) ([]sandbox.Event, error) {
	q := url.Values{}
	if f.SandboxID != "" {
		q.Set("sandbox_id", f.SandboxID)
	}
	if f.AfterSeq > 0 {
		q.Set("after", strconv.FormatInt(f.AfterSeq, 10))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var l api.EventList
	err := b.c.doJSON(ctx, http.MethodGet, "/v1/events", q, nil, &l)
	return l.Events, b.unreachable(err)
}

// subscribeWait is how long one long poll of GET /v1/events waits for an event.
const subscribeWait = 25 * time.Second

// Subscribe delivers every event with a sequence number above after, in order, until ctx ends
// (then the channel closes), by long-polling GET /v1/events?after=N&wait=25s. A failed poll is
// retried (after 1 s, doubling to 15 s) from the last event delivered, so none is lost or
// repeated while the server is away.
func (b *Backend) Subscribe(ctx context.Context, after int64) (<-chan sandbox.Event, error) {
	if after < 0 {
		return nil, errcode.New(errcode.InvalidArgument, "after must not be negative; got %d", after)
	}
	out := make(chan sandbox.Event, 64)
	go func() {
		defer close(out)
		cursor, backoff := after, time.Second
		for ctx.Err() == nil {
			q := url.Values{"after": {strconv.FormatInt(cursor, 10)}, "wait": {subscribeWait.String()}}
			var l api.EventList
			if err := b.c.doJSON(ctx, http.MethodGet, "/v1/events", q, nil, &l); err != nil {
				if ctx.Err() != nil {
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 15*time.Second)
				continue
			}
			backoff = time.Second
			for _, ev := range l.Events {
				select {
				case out <- ev:
					cursor = ev.Seq
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// Capacity reports the server's bounds in use.
func (b *Backend) Capacity(ctx context.Context) (sandbox.Capacity, error) {
	c, err := b.c.Capacity(ctx)
	return c, b.unreachable(err)
}

// Metrics samples a running sandbox's resource use.
func (b *Backend) Metrics(ctx context.Context, id string) (sandbox.SandboxMetrics, error) {
	if err := checkID(id); err != nil {
		return sandbox.SandboxMetrics{}, err
	}
	m, err := b.c.Metrics(ctx, id)
	return m, b.unreachable(err)
}

// Runtimes returns the server's runtimes (the last known answer if it does not answer now).
func (b *Backend) Runtimes() []runtime.Capabilities {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rts, err := b.c.Runtimes(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		b.runtimes = rts
	}
	return b.runtimes
}

// String describes the server, for logs and health.
func (b *Backend) String() string { return fmt.Sprintf("agentbox serve at %s", b.c.base) }

// ListImages lists the server's cached images.
func (b *Backend) ListImages(ctx context.Context) ([]image.Image, error) {
	imgs, err := b.c.ListImages(ctx)
	return imgs, b.unreachable(err)
}

// PullImage pulls ref on the server, reporting progress (if non-nil).
func (b *Backend) PullImage(ctx context.Context, ref string, progress image.ProgressFunc) (image.Image, error) {
	img, err := b.c.PullImage(ctx, ref, progress)
	return img, b.unreachable(err)
}

// Commit commits sandbox id as the image name.
func (b *Backend) Commit(ctx context.Context, id, name string) (image.Image, error) {
	if err := checkID(id); err != nil {
		return image.Image{}, err
	}
	img, err := b.c.Commit(ctx, id, name)
	return img, b.unreachable(err)
}

// RunSnippet runs run_python or run_shell on the server (POST /v1/run_python, /v1/run_shell).
func (b *Backend) RunSnippet(ctx context.Context, lang snippet.Language, req snippet.Request) (snippet.Result, error) {
	res, err := b.c.RunSnippet(ctx, lang, req)
	return res, b.unreachable(err)
}

// GatherMetrics scrapes the server's GET /metrics (for fetch_metrics over a running server:
// current values only).
func (b *Backend) GatherMetrics(ctx context.Context) ([]*dto.MetricFamily, error) {
	mfs, err := b.c.GatherMetrics(ctx)
	return mfs, b.unreachable(err)
}
