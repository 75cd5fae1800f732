package netlab

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// maxBytes bounds /bytes?n=N.
const maxBytes = 1 << 30

// handleBytes streams n bytes (n ≤ 1 GiB) of a repeating pattern.
func (l *Lab) handleBytes(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err != nil || n < 0 || n > maxBytes {
		http.Error(w, "n must be 0..1073741824", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	buf := bytes.Repeat([]byte("netlab-bytes-0123456789abcdef\n"), 1<<11)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

// handleEchoHeaders answers the request's headers as JSON (Host included as "Host"). With
// ?tag=T it also records them under T (Recorded); with ?quiet=1 it answers only "recorded\n",
// so that what it saw (a secret's real value) never goes back to the client.
func (l *Lab) handleEchoHeaders(w http.ResponseWriter, r *http.Request) {
	h := r.Header.Clone()
	h.Set("Host", r.Host)
	if tag := r.URL.Query().Get("tag"); tag != "" {
		l.mu.Lock()
		if len(l.recorded[tag]) < 1000 {
			l.recorded[tag] = append(l.recorded[tag], h)
		}
		l.mu.Unlock()
	}
	if r.URL.Query().Get("quiet") == "1" {
		fmt.Fprint(w, "recorded\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(h)
}

// handleWS echoes WebSocket messages (at most 1 MiB each) until the client closes.
func handleWS(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
	defer cancel()
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			return
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			return
		}
	}
}

// makeRepo creates a bare repository with one commit (RepoFile holding RepoContent).
func (l *Lab) makeRepo() error {
	root := filepath.Join(l.dir, "git")
	work := filepath.Join(l.dir, "work")
	l.repoDir = root
	bare := filepath.Join(root, strings.TrimPrefix(RepoPath, "/git/"))
	git := func(dir string, args ...string) error {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=netlab", "GIT_AUTHOR_EMAIL=netlab@lab",
			"GIT_COMMITTER_NAME=netlab", "GIT_COMMITTER_EMAIL=netlab@lab", "GIT_CONFIG_NOSYSTEM=1", "HOME="+l.dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	if err := git(root, "init", "-q", "--bare", "-b", "main", bare); err != nil {
		return err
	}
	if err := git(work, "init", "-q", "-b", "main"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, RepoFile), []byte(RepoContent), 0o644); err != nil {
		return err
	}
	for _, args := range [][]string{{"add", RepoFile}, {"commit", "-q", "-m", "netlab"}, {"push", "-q", bare, "main"}} {
		if err := git(work, args...); err != nil {
			return err
		}
	}
	return nil
}

// gitHandler serves the repositories over smart HTTP through git http-backend.
func (l *Lab) gitHandler() http.Handler { return l.backend("/git", l.repoDir) }

// wheelName is the file name of the index's one wheel.
var wheelName = PkgName + "-" + PkgVersion + "-py3-none-any.whl"

// makeWheel builds a minimal pure-Python wheel of PkgName.
func makeWheel() ([]byte, error) {
	files := []struct{ name, body string }{
		{PkgName + "/__init__.py", "VALUE = 'netlab'\n"},
		{PkgName + "-" + PkgVersion + ".dist-info/METADATA", "Metadata-Version: 2.1\nName: " + PkgName + "\nVersion: " + PkgVersion + "\nSummary: netlab test package\n"},
		{PkgName + "-" + PkgVersion + ".dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: netlab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			return nil, err
		}
		io.WriteString(w, f.body)
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	recName := PkgName + "-" + PkgVersion + ".dist-info/RECORD"
	record.WriteString(recName + ",,\n")
	w, err := zw.Create(recName)
	if err != nil {
		return nil, err
	}
	io.WriteString(w, record.String())
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// indexHandlers serve a PEP 503 simple index with PkgName's wheel.
func (l *Lab) indexHandlers(mux *http.ServeMux, wheel []byte) {
	sum := sha256.Sum256(wheel)
	mux.HandleFunc("/simple/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		switch strings.Trim(r.URL.Path, "/") {
		case "simple":
			fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/simple/%s/\">%s</a></body></html>\n", PkgName, PkgName)
		case "simple/" + PkgName:
			fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/packages/%s#sha256=%s\">%s</a></body></html>\n", wheelName, hex.EncodeToString(sum[:]), wheelName)
		default:
			http.NotFound(w, r)
		}
	})
	mux.HandleFunc("/packages/"+wheelName, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(wheel)
	})
}
