package api

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// SizeHeader carries a file's total size on GET .../files.
const SizeHeader = wire.SizeHeader

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	mode := uint64(0o644)
	if m := q.Get("mode"); m != "" {
		var err error
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o7777 {
			s.fail(w, r, errcode.New(errcode.InvalidArgument, "mode must be octal permission bits such as 0644; got %q", m))
			return
		}
	}
	if r.ContentLength > s.opts.MaxFileBytes {
		s.fail(w, r, errcode.New(errcode.FileTooLarge, "upload is %d bytes; this server accepts files up to %d bytes", r.ContentLength, s.opts.MaxFileBytes).With("limit", s.opts.MaxFileBytes))
		return
	}
	body := &boundedBody{r: r.Body, left: s.opts.MaxFileBytes}
	fi, err := s.svc.WriteFile(r.Context(), r.PathValue("id"), q.Get("path"), uint32(mode), body)
	if body.exceeded {
		err = errcode.New(errcode.FileTooLarge, "upload exceeds %d bytes, this server's file size bound; nothing was written", s.opts.MaxFileBytes).With("limit", s.opts.MaxFileBytes)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

// boundedBody fails a read past its bound and remembers that it did.
type boundedBody struct {
	r        io.Reader
	left     int64
	exceeded bool
}

var errTooLarge = errors.New("upload exceeds the file size bound")

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// Probe for one more byte: a body of exactly the bound is fine.
		var one [1]byte
		if n, _ := b.r.Read(one[:]); n > 0 {
			b.exceeded = true
			return 0, errTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	off, err := intParam(q.Get("offset"), "offset")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	length, err := intParam(q.Get("length"), "length")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	rc, size, err := s.svc.ReadFile(r.Context(), r.PathValue("id"), q.Get("path"), off, length, s.opts.MaxFileBytes)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set(SizeHeader, strconv.FormatInt(size, 10))
	n := size - off
	if length > 0 && length < n {
		n = length
	}
	if n < 0 {
		n = 0
	}
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Warn("read file: copy interrupted", "err", err)
	}
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	fi, err := s.svc.Stat(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (s *Server) listDir(w http.ResponseWriter, r *http.Request) {
	dl, err := s.svc.ListDir(r.Context(), r.PathValue("id"), r.URL.Query().Get("path"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, dl)
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req sandbox.MkdirRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	fi, err := s.svc.Mkdir(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if err := s.svc.Remove(r.Context(), r.PathValue("id"), q.Get("path"), q.Get("recursive") == "true"); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
