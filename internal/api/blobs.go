package api

import (
	"io"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/blobs"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// The file relay (internal/blobs): POST /v1/machines/{ref}/pull and /push,
// POST /v1/blobs (upload), GET /v1/blobs/{id} (a signed link, or the token), DELETE
// /v1/blobs/{id}.

// RemotePullRequest is the body of POST /v1/machines/{ref}/pull (remote_pull).
type RemotePullRequest = wire.RemotePullRequest

// RemotePushRequest is the body of POST /v1/machines/{ref}/push (remote_push).
type RemotePushRequest = wire.RemotePushRequest

// blobPathRE is a blob download: /v1/blobs/{id}.
var blobPathRE = regexp.MustCompile(`^/v1/blobs/[^/]+$`)

// signedBlobRequest reports whether r may go without the bearer token: a GET of a blob with
// both expires and sig; the handler then must verify them.
func signedBlobRequest(r *http.Request) bool {
	if r.Method != http.MethodGet || !blobPathRE.MatchString(r.URL.Path) {
		return false
	}
	q := r.URL.Query()
	return q.Get("expires") != "" && q.Get("sig") != ""
}

func (s *Server) blobRoutes() {
	m := patternMux{s.mux, s}
	m.HandleFunc("POST /v1/machines/{ref}/pull", s.remotePull)
	m.HandleFunc("POST /v1/machines/{ref}/push", s.remotePush)
	m.HandleFunc("POST /v1/blobs", s.uploadBlob)
	m.HandleFunc("GET /v1/blobs/{id}", s.downloadBlob)
	m.HandleFunc("DELETE /v1/blobs/{id}", s.deleteBlob)
}

func (s *Server) blobsSvc(w http.ResponseWriter, r *http.Request) *blobs.Service {
	if s.opts.Blobs == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this agentbox server has no file relay (it is served by agentbox serve)"))
		return nil
	}
	return s.opts.Blobs
}

// relayDeadline lets a streamed body take at most the relay's call deadline to arrive.
func relayDeadline(w http.ResponseWriter, bs *blobs.Service) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(bs.Limits().CallTimeout))
}

func (s *Server) remotePull(w http.ResponseWriter, r *http.Request) {
	bs := s.blobsSvc(w, r)
	if bs == nil {
		return
	}
	var body RemotePullRequest
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := bs.Pull(r.Context(), sandbox.OwnerFrom(r.Context()), r.PathValue("ref"), body.Path)
	s.reply(w, r, wire.Blob(res), err)
}

func (s *Server) remotePush(w http.ResponseWriter, r *http.Request) {
	bs := s.blobsSvc(w, r)
	if bs == nil {
		return
	}
	var body RemotePushRequest
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := bs.Push(r.Context(), sandbox.OwnerFrom(r.Context()), body.BlobID, r.PathValue("ref"), body.DestPath)
	s.reply(w, r, wire.BlobPush(res), err)
}

// uploadBlob stores the body (its Content-Length, or chunked up to the per-file limit) as a
// blob; ?name= is the file name offered on download.
func (s *Server) uploadBlob(w http.ResponseWriter, r *http.Request) {
	bs := s.blobsSvc(w, r)
	if bs == nil {
		return
	}
	relayDeadline(w, bs)
	res, err := bs.Upload(r.Context(), sandbox.OwnerFrom(r.Context()), r.URL.Query().Get("name"), r.ContentLength, r.Body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wire.Blob(res))
}

// downloadBlob streams a blob: authorised by a valid signed link (expires + sig), or by the
// token or key of the blob's owner.
func (s *Server) downloadBlob(w http.ResponseWriter, r *http.Request) {
	bs := s.blobsSvc(w, r)
	if bs == nil {
		return
	}
	id := r.PathValue("id")
	var owner *string
	if !tokenAuthed(r.Context()) || r.URL.Query().Get("sig") != "" {
		q := r.URL.Query()
		if err := bs.VerifyLink(id, q.Get("expires"), q.Get("sig")); err != nil {
			s.fail(w, r, err)
			return
		}
	} else {
		o := sandbox.OwnerFrom(r.Context())
		owner = &o
	}
	rc, b, err := bs.Open(r.Context(), id, owner)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(b.Size, 10))
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": b.Name}))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Agentbox-SHA256", b.SHA256)
	h.Set("X-Agentbox-Expires-At", b.ExpiresAt.UTC().Format(time.RFC3339))
	w.WriteHeader(http.StatusOK)
	if _, err := io.CopyN(w, rc, b.Size); err != nil && r.Context().Err() == nil {
		s.log.Warn("blob download cut short", "blob_id", id, "err", err)
	}
}

func (s *Server) deleteBlob(w http.ResponseWriter, r *http.Request) {
	bs := s.blobsSvc(w, r)
	if bs == nil {
		return
	}
	id := r.PathValue("id")
	err := bs.Delete(r.Context(), sandbox.OwnerFrom(r.Context()), id)
	s.reply(w, r, BlobDeleted{BlobID: id, Deleted: true}, err)
}

// BlobDeleted is the reply of DELETE /v1/blobs/{id}.
type BlobDeleted struct {
	BlobID  string `json:"blob_id"`
	Deleted bool   `json:"deleted"`
}
