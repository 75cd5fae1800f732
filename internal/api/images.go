package api

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
	"github.com/agentbox/agentbox/internal/wire"
)

// The image routes (/v1/images…) and commit. They call the service, which fronts the cache.

// DefaultMaxImportBytes bounds an import's body (a `docker save` or OCI-layout tarball) when
// Options.MaxImportBytes is 0: 8 GiB.
const DefaultMaxImportBytes = 8 << 30

// NDJSON is the media type of a streamed reply: ask for it with Accept to get progress frames.
const NDJSON = wire.NDJSON

// ImageList is the reply of GET /v1/images.
type ImageList struct {
	Images []image.Image `json:"images"`
	Count  int           `json:"count"`
	// Usage is the cache's size and budget (absent if the cache could not say).
	Usage *image.Usage `json:"usage,omitempty"`
}

// PullRequest is the body of POST /v1/images/pull.
type PullRequest = wire.PullRequest

// PruneRequest is the body of POST /v1/images/prune.
type PruneRequest = wire.PruneRequest

// PushRequest is the body of POST /v1/images/push: push the cached image Name (a reference or
// digest) to Ref.
type PushRequest = wire.PushRequest

// PushResult is the reply of a push.
type PushResult struct {
	Name string `json:"name"`
	Ref  string `json:"ref"`
}

// RemoveResult is the reply of DELETE /v1/images.
type RemoveResult = wire.RemoveResult

// ImportResult is the reply of POST /v1/images/import.
type ImportResult struct {
	Images []image.Image `json:"images"`
}

// CommitRequest is the body of POST /v1/sandboxes/{id}/commit.
type CommitRequest = wire.CommitRequest

// ImageFrame is one line of a streamed image operation (Accept: application/x-ndjson): progress
// reports as they happen (the newest of each layer; a slow reader gets fewer), then exactly one
// Result (the operation's JSON reply) or Error.
type ImageFrame struct {
	Progress *image.Progress `json:"progress,omitempty"`
	Result   any             `json:"result,omitempty"`
	Error    *ErrorDetail    `json:"error,omitempty"`
}

func wantsNDJSON(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			if mt, _, _ := strings.Cut(strings.TrimSpace(part), ";"); strings.EqualFold(strings.TrimSpace(mt), NDJSON) {
				return true
			}
		}
	}
	return false
}

// withProgress runs op: with Accept application/x-ndjson as a stream of ImageFrames, else as
// one JSON reply with status ok. op's progress callback never blocks.
func (s *Server) withProgress(w http.ResponseWriter, r *http.Request, ok int, op func(image.ProgressFunc) (any, error)) {
	if !wantsNDJSON(r) {
		v, err := op(nil)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, ok, v)
		return
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", NDJSON)
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	var mu sync.Mutex
	send := func(f ImageFrame) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(f)
		if flusher != nil {
			flusher.Flush()
		}
	}
	q := sandbox.NewProgressQueue()
	stop, pumped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pumped)
		q.Pump(stop, func(p image.Progress) { send(ImageFrame{Progress: &p}) })
	}()
	v, err := op(q.Put)
	close(stop)
	<-pumped
	if err != nil {
		if errcode.Of(err) == errcode.Internal {
			s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		send(ImageFrame{Error: errorDetail(err)})
		return
	}
	send(ImageFrame{Result: v})
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) {
	imgs, err := s.opts.Images.ListImages(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if imgs == nil {
		imgs = []image.Image{}
	}
	out := ImageList{Images: imgs, Count: len(imgs)}
	if u, err := s.opts.Images.ImageUsage(r.Context()); err == nil {
		out.Usage = &u
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) inspectImage(w http.ResponseWriter, r *http.Request) {
	img, err := s.opts.Images.InspectImage(r.Context(), r.URL.Query().Get("ref"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, img)
}

func (s *Server) pullImage(w http.ResponseWriter, r *http.Request) {
	var req PullRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	// Refuse a bad reference before committing to a 200 stream.
	if err := sandbox.CheckImageRef("ref", req.Ref); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.opts.Images.CheckImages(); err != nil {
		s.fail(w, r, err)
		return
	}
	s.withProgress(w, r, http.StatusOK, func(p image.ProgressFunc) (any, error) {
		img, err := s.opts.Images.PullImage(r.Context(), req.Ref, p)
		return img, err
	})
}

func (s *Server) removeImage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	force := false
	switch v := q.Get("force"); v {
	case "", "false", "0":
	case "true", "1":
		force = true
	default:
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "force must be true or false; got %q", text.Truncate(v, 32)))
		return
	}
	removed, err := s.opts.Images.RemoveImage(r.Context(), q.Get("ref"), force)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if removed == nil {
		removed = []string{}
	}
	writeJSON(w, http.StatusOK, RemoveResult{Removed: removed})
}

func (s *Server) pruneImages(w http.ResponseWriter, r *http.Request) {
	var req PruneRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	rep, err := s.opts.Images.PruneImages(r.Context(), req.All)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if rep.Removed == nil {
		rep.Removed = []string{}
	}
	writeJSON(w, http.StatusOK, rep)
}

// fullDuplex lets w's reply start before r's body is read to its end (HTTP/1.1 full duplex)
// and returns what the handler defers: closing the body while the handler still runs. net/http
// drains what a full-duplex handler left of the body (up to 256 KiB; past that it closes the
// connection) only after the handler returned, and the drain's end then starts its background
// read of the connection too late: the next request on a kept-alive connection panics with
// "invalid concurrent Body.Read call" (golang/go#68560). An import cut at its bound leaves body.
// Drained here, as a handler without full duplex has it drained before its reply, the
// connection's next request is read as usual.
func fullDuplex(w http.ResponseWriter, r *http.Request) (closeBody func()) {
	_ = http.NewResponseController(w).EnableFullDuplex()
	body := r.Body
	return func() {
		if body != nil {
			_ = body.Close()
		}
	}
}

// importBody reads at most max bytes of r's body and fails the read past it with
// FILE_TOO_LARGE naming the bound.
type importBody struct {
	r    io.Reader
	left int64
	max  int64
	over bool // the body went past max
}

func (b *importBody) tooLarge() error {
	return errcode.New(errcode.FileTooLarge, "the import body is over %d bytes, the server's bound for an import", b.max).With("limit", b.max)
}

func (b *importBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly max from a longer one.
		var one [1]byte
		if n, _ := b.r.Read(one[:]); n > 0 {
			b.over = true
			return 0, b.tooLarge()
		}
		return b.r.Read(p[:0])
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

func (s *Server) importImages(w http.ResponseWriter, r *http.Request) {
	limit := s.opts.MaxImportBytes
	if limit <= 0 {
		limit = DefaultMaxImportBytes
	}
	if r.ContentLength > limit {
		s.fail(w, r, errcode.New(errcode.FileTooLarge, "the import body is %d bytes; the server takes at most %d", r.ContentLength, limit).With("limit", limit))
		return
	}
	if err := s.opts.Images.CheckImages(); err != nil {
		s.fail(w, r, err)
		return
	}
	body := &importBody{r: r.Body, left: limit, max: limit}
	// A streamed reply starts before the body is read: HTTP/1.1 needs full duplex for that.
	defer fullDuplex(w, r)()
	s.withProgress(w, r, http.StatusCreated, func(p image.ProgressFunc) (any, error) {
		imgs, err := s.opts.Images.ImportImages(r.Context(), body, p)
		if body.over {
			return nil, body.tooLarge() // whatever the cache made of the cut body
		}
		if err != nil {
			return nil, err
		}
		if imgs == nil {
			imgs = []image.Image{}
		}
		return ImportResult{Images: imgs}, nil
	})
}

func (s *Server) pushImage(w http.ResponseWriter, r *http.Request) {
	var req PushRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := sandbox.CheckImageRef("ref", req.Ref); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Name == "" {
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "name is required: the cached image to push (a reference or digest)"))
		return
	}
	if err := s.opts.Images.CheckImages(); err != nil {
		s.fail(w, r, err)
		return
	}
	s.withProgress(w, r, http.StatusOK, func(p image.ProgressFunc) (any, error) {
		if err := s.opts.Images.PushImage(r.Context(), req.Name, req.Ref, p); err != nil {
			return nil, err
		}
		return PushResult{Name: req.Name, Ref: req.Ref}, nil
	})
}

func (s *Server) commitSandbox(w http.ResponseWriter, r *http.Request) {
	var req CommitRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	img, err := s.opts.Images.Commit(r.Context(), r.PathValue("id"), req.Name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, img)
}
