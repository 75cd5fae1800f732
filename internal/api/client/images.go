package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// MaxFrameBytes bounds one NDJSON frame of a streamed image operation.
const MaxFrameBytes = 4 << 20

// ListImages lists the server's cached images.
func (c *Client) ListImages(ctx context.Context) ([]wire.Image, error) {
	var out wire.ImageList
	err := c.doJSON(ctx, http.MethodGet, "/v1/images", nil, nil, &out)
	return out.Images, err
}

// ImageUsage returns the server's image cache size and budget.
func (c *Client) ImageUsage(ctx context.Context) (wire.ImageUsage, error) {
	var out wire.ImageList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/images", nil, nil, &out); err != nil {
		return wire.ImageUsage{}, err
	}
	if out.Usage == nil {
		return wire.ImageUsage{}, errcode.New(errcode.UnsupportedOp, "the server did not report its image cache's usage")
	}
	return *out.Usage, nil
}

// InspectImage returns one cached image by reference or digest.
func (c *Client) InspectImage(ctx context.Context, ref string) (wire.Image, error) {
	var out wire.Image
	err := c.doJSON(ctx, http.MethodGet, "/v1/images/inspect", url.Values{"ref": {ref}}, nil, &out)
	return out, err
}

// PullImage pulls ref on the server; progress (if non-nil) gets the server's reports.
func (c *Client) PullImage(ctx context.Context, ref string, progress func(wire.ImageProgress)) (wire.Image, error) {
	var out wire.Image
	err := c.imageOp(ctx, http.MethodPost, "/v1/images/pull", wire.PullRequest{Ref: ref}, nil, "", progress, &out)
	return out, err
}

// RemoveImage untags (and, when no name is left, deletes) ref; force removes a name of an
// image in use.
func (c *Client) RemoveImage(ctx context.Context, ref string, force bool) ([]string, error) {
	var out wire.RemoveResult
	err := c.doJSON(ctx, http.MethodDelete, "/v1/images", url.Values{"ref": {ref}, "force": {strconv.FormatBool(force)}}, nil, &out)
	return out.Removed, err
}

// PruneImages removes images no live sandbox uses (all: tagged ones too).
func (c *Client) PruneImages(ctx context.Context, all bool) (wire.PruneReport, error) {
	var out wire.PruneReport
	err := c.doJSON(ctx, http.MethodPost, "/v1/images/prune", nil, wire.PruneRequest{All: all}, &out)
	return out, err
}

// ImportImages sends a `docker save` or OCI-layout tarball to the server.
func (c *Client) ImportImages(ctx context.Context, r io.Reader, progress func(wire.ImageProgress)) ([]wire.Image, error) {
	var out wire.ImportResult
	err := c.imageOp(ctx, http.MethodPost, "/v1/images/import", nil, r, "application/x-tar", progress, &out)
	return out.Images, err
}

// PushImage pushes the server's cached image name to ref.
func (c *Client) PushImage(ctx context.Context, name, ref string, progress func(wire.ImageProgress)) error {
	return c.imageOp(ctx, http.MethodPost, "/v1/images/push", wire.PushRequest{Name: name, Ref: ref}, nil, "", progress, nil)
}

// Commit commits sandbox id's writable layer as the image name (NAME[:TAG]).
func (c *Client) Commit(ctx context.Context, id, name string) (wire.Image, error) {
	var out wire.Image
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/commit", nil, wire.CommitRequest{Name: name}, &out)
	return out, err
}

// imageOp sends in (JSON) or raw (with ctype) and decodes the reply into out: one JSON reply
// without progress, else the NDJSON frames, progress reports to progress.
func (c *Client) imageOp(ctx context.Context, method, path string, in any, raw io.Reader, ctype string, progress func(wire.ImageProgress), out any) error {
	body := raw
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	if progress == nil {
		resp, err := c.do(ctx, method, path, nil, body, ctype)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if out == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, MaxFrameBytes))
			return nil
		}
		return json.NewDecoder(io.LimitReader(resp.Body, MaxFrameBytes)).Decode(out)
	}
	resp, err := c.doAccept(ctx, method, path, nil, body, ctype, wire.NDJSON)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), MaxFrameBytes)
	for sc.Scan() {
		var f struct {
			Progress *wire.ImageProgress `json:"progress"`
			Result   json.RawMessage     `json:"result"`
			Error    *wire.ErrorDetail   `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return fmt.Errorf("bad frame from server: %w", err)
		}
		switch {
		case f.Error != nil:
			return &errcode.Error{Code: f.Error.Code, Message: f.Error.Message, Details: f.Error.Details}
		case f.Result != nil:
			if out == nil {
				return nil
			}
			return json.Unmarshal(f.Result, out)
		case f.Progress != nil:
			progress(*f.Progress)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading %s's stream (frames are at most %d bytes): %w", path, MaxFrameBytes, err)
	}
	return errcode.New(errcode.Internal, "the server closed the stream before %s finished", path)
}
