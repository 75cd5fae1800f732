package e2b

import (
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/version"
)

// envd's HTTP routes: /health, and /files (download: the raw bytes; upload: multipart, each part
// a file named by its filename or ?path=). Both map onto agentbox's files paths.

func (s *Server) envdHealth(w http.ResponseWriter, r *http.Request) {
	if _, err := s.live(r, r.PathValue("id")); err != nil {
		WriteError(w, r, err)
		return
	}
	w.Header().Set("X-Agentbox-Version", version.Version)
	w.WriteHeader(http.StatusNoContent)
}

// filePath is the path of a /files call for user: ?path= resolved (relative: under the home).
func filePath(r *http.Request, p string) (string, error) {
	if p == "" {
		return "", errcode.New(errcode.InvalidArgument, "path is required")
	}
	abs, err := absPath(p, basicUserOrQuery(r))
	if err != nil {
		return "", errcode.New(errcode.InvalidArgument, "path is required")
	}
	return abs, nil
}

// basicUserOrQuery is the user of a /files call: ?username=, else the Basic user.
func basicUserOrQuery(r *http.Request) string {
	if u := r.URL.Query().Get("username"); u != "" {
		if u == "root" {
			return "root"
		}
		return ""
	}
	return basicUser(r)
}

func (s *Server) downloadFile(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p, err := filePath(r, r.URL.Query().Get("path"))
	if err != nil {
		WriteError(w, r, err)
		return
	}
	fi, err := s.svc.Stat(r.Context(), id, p)
	if err == nil && fi.Type == "dir" {
		err = errcode.New(errcode.InvalidArgument, "path %s is a directory", p)
	}
	if err != nil {
		WriteError(w, r, err)
		return
	}
	rc, size, err := s.svc.ReadFile(r.Context(), id, p, 0, 0, 0)
	if err != nil {
		WriteError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, rc)
}

// entryReply is envd's EntryInfo of an upload's reply.
type entryReply struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

func (s *Server) uploadFile(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	q := r.URL.Query().Get("path")
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []entryReply
	write := func(p string, body io.Reader) error {
		abs, err := filePath(r, p)
		if err != nil {
			return err
		}
		if dir := path.Dir(abs); dir != "/" {
			if _, err := s.svc.Stat(r.Context(), id, dir); errcode.Of(err) == errcode.FileNotFound {
				if _, err := s.svc.Mkdir(r.Context(), id, mkdirParents(dir)); err != nil {
					return err
				}
			}
		}
		fi, err := s.svc.WriteFile(r.Context(), id, abs, 0o644, body)
		if err != nil {
			return err
		}
		out = append(out, entryReply{Name: fi.Name, Type: "file", Path: fi.Path})
		return nil
	}
	if ct != "multipart/form-data" {
		// An octet-stream body: the file at ?path=.
		if err := write(q, r.Body); err != nil {
			WriteError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	mr := multipart.NewReader(r.Body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			WriteError(w, r, errcode.New(errcode.InvalidArgument, "multipart body: %v", err))
			return
		}
		if part.FormName() != "file" {
			_ = part.Close()
			continue
		}
		p := q
		if p == "" {
			// The full path the SDK gives as the filename (Part.FileName keeps only its base).
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p = dp["filename"]
		}
		err = write(p, part)
		_ = part.Close()
		if err != nil {
			WriteError(w, r, err)
			return
		}
	}
	if len(out) == 0 {
		WriteError(w, r, errcode.New(errcode.InvalidArgument, "the multipart body has no part named file"))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func mkdirParents(dir string) sandbox.MkdirRequest {
	return sandbox.MkdirRequest{Path: dir, Parents: true}
}

func (s *Server) envdUnknown(w http.ResponseWriter, r *http.Request) {
	WriteError(w, r, errcode.New(errcode.UnsupportedOp, "envd route %s %s is not served by agentbox (docs/E2B.md lists what is)", r.Method, r.PathValue("rest")))
}
