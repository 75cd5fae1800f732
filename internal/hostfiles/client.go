package hostfiles

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
	"github.com/agentbox/agentbox/internal/text"
)

// maxReply bounds a JSON reply (a write's result, an error) read from a machine.
const maxReply = 64 << 10

// Client calls a machine's file handler. Nothing a machine sends is trusted: sizes are checked
// against the cap asked for, bodies against the size announced, replies are bounded.
type Client struct {
	hc   *http.Client
	base string
}

// NewClient returns a Client over hc, whose transport reaches one machine (the URL's host is
// ignored by it: requests go to "http://machine").
func NewClient(hc *http.Client) *Client { return &Client{hc: hc, base: "http://machine"} }

// WithBase returns a copy of c sending to base (an httptest server's URL, in tests).
func (c *Client) WithBase(base string) *Client { return &Client{hc: c.hc, base: base} }

// Read opens path on the machine, refusing a file over max bytes. The reader yields exactly
// size bytes or fails with io.ErrUnexpectedEOF; the caller closes it.
func (c *Client) Read(ctx context.Context, path string, max int64) (io.ReadCloser, int64, error) {
	u := c.base + ReadPath + "?" + url.Values{"path": {path}, "max": {strconv.FormatInt(max, 10)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, 0, errcode.Wrap(errcode.InvalidArgument, err, "path %q cannot be sent to the machine", path)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, 0, transportErr(ctx, "read", err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, 0, replyErr(resp, "file read")
	}
	size, err := strconv.ParseInt(resp.Header.Get(HeaderSize), 10, 64)
	if err != nil || size < 0 || size != resp.ContentLength {
		resp.Body.Close()
		return nil, 0, errcode.New(errcode.Internal, "the machine's read reply announced size %q with Content-Length %d; refused", text.TruncateNoting(resp.Header.Get(HeaderSize), 32), resp.ContentLength)
	}
	if size > max {
		resp.Body.Close()
		return nil, 0, errcode.New(errcode.FileTooLarge, "%s is %d bytes; the per-file limit is %d", path, size, max).With("size", size).With("max", max)
	}
	return &exactReader{rc: resp.Body, left: size}, size, nil
}

// exactReader yields exactly left bytes from rc: fewer is io.ErrUnexpectedEOF.
type exactReader struct {
	rc   io.ReadCloser
	left int64
}

func (r *exactReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := r.rc.Read(p)
	r.left -= int64(n)
	if err == io.EOF && r.left > 0 {
		return n, io.ErrUnexpectedEOF
	}
	if err == io.EOF {
		err = nil
	}
	if r.left == 0 && err == nil {
		return n, io.EOF
	}
	return n, err
}

func (r *exactReader) Close() error { return r.rc.Close() }

// Write sends size bytes of body to dest on the machine, refused there when over max or not
// fitting the free space.
func (c *Client) Write(ctx context.Context, dest string, size, max int64, body io.Reader) (WriteResult, error) {
	u := c.base + WritePath + "?" + url.Values{"path": {dest}, "size": {strconv.FormatInt(size, 10)}, "max": {strconv.FormatInt(max, 10)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, io.NopCloser(body))
	if err != nil {
		return WriteResult{}, errcode.Wrap(errcode.InvalidArgument, err, "dest_path %q cannot be sent to the machine", dest)
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.hc.Do(req)
	if err != nil {
		return WriteResult{}, transportErr(ctx, "write", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return WriteResult{}, replyErr(resp, "file write")
	}
	var res WriteResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxReply)).Decode(&res); err != nil {
		return WriteResult{}, errcode.Wrap(errcode.Internal, err, "the machine's write reply is not JSON; the file's state at %s is unknown", dest)
	}
	if res.Size != size || len(res.Path) > 4096 || len(res.Mode) > 8 || len(res.Owner) > 64 || !utf8.ValidString(res.Path) {
		return WriteResult{}, errcode.New(errcode.Internal, "the machine's write reply (size %d, path %q) does not match the %d bytes sent to %s", res.Size, text.TruncateNoting(res.Path, 256), size, dest)
	}
	return res, nil
}

func transportErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return errcode.Wrap(errcode.CommandTimeout, err, "the machine's file %s did not finish in time (%v)", op, context.Cause(ctx))
	}
	if e, ok := errcode.As(err); ok { // the machine transport's own (MACHINE_OFFLINE)
		return e
	}
	return errcode.Wrap(errcode.MachineOffline, err, "the machine's file %s failed on the connection: %v", op, err)
}

// errorCodes are the codes the file handler returns (any other is INTERNAL).
var errorCodes = []errcode.Code{errcode.InvalidArgument, errcode.FileNotFound, errcode.FileTooLarge, errcode.PermissionDenied, errcode.Internal}

// replyErr turns a machine's error reply to what into a typed error (peerreply.Machine: a code
// the handler returns, a bounded clean message and scalar details, marked as the machine's);
// the sizes a refusal names are integers.
func replyErr(resp *http.Response, what string) error {
	err := peerreply.Machine.ReadError(resp, what, errorCodes...)
	if e, ok := errcode.As(err); ok {
		for _, k := range []string{"size", "max", "free_bytes"} {
			if v, ok := e.Details[k].(float64); ok {
				e.Details[k] = int64(v)
			}
		}
	}
	return err
}
