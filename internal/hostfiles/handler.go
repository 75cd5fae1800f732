package hostfiles

import (
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Options configures the handler.
type Options struct {
	// Logger hears of failed writes' clean-up; nil: discarded.
	Logger *slog.Logger
	// FreeBytes reports the bytes free to the agent on the filesystem holding dir; nil: the
	// platform's (statfs, GetDiskFreeSpaceEx). Tests may replace it.
	FreeBytes func(dir string) (uint64, error)
}

type handler struct {
	log  *slog.Logger
	free func(string) (uint64, error)
}

// NewHandler returns the machine-side file handler; the agent mounts it at Prefix with the full
// path kept (GET ReadPath, PUT WritePath).
func NewHandler(opts Options) http.Handler {
	h := &handler{log: opts.Logger, free: opts.FreeBytes}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.free == nil {
		h.free = freeBytes
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ReadPath, h.read)
	mux.HandleFunc("PUT "+WritePath, h.write)
	mux.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, errcode.New(errcode.InvalidArgument, "no such file call: %s %s (GET %s, PUT %s)", r.Method, r.URL.Path, ReadPath, WritePath))
	})
	return mux
}

// absPath checks that p is an absolute path on this machine and returns it cleaned.
func absPath(p, name string) (string, error) {
	switch {
	case p == "":
		return "", errcode.New(errcode.InvalidArgument, "%s is required: an absolute path on the machine", name)
	case len(p) > 4096:
		return "", errcode.New(errcode.InvalidArgument, "%s is %d bytes long; at most 4096", name, len(p))
	case strings.ContainsRune(p, 0):
		return "", errcode.New(errcode.InvalidArgument, "%s contains a NUL byte", name)
	case !filepath.IsAbs(p):
		return "", errcode.New(errcode.InvalidArgument, "%s %q is not absolute on this machine: give the full path (e.g. /home/me/file, or C:\\Users\\me\\file on Windows)", name, p)
	}
	return filepath.Clean(p), nil
}

func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}

func (h *handler) read(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p, err := absPath(q.Get("path"), "path")
	if err != nil {
		writeErr(w, err)
		return
	}
	max, err := parseMax(q.Get("max"))
	if err != nil {
		writeErr(w, err)
		return
	}
	// Stat first (following symlinks) so a FIFO is refused before an open could block on it.
	fi, err := os.Stat(p)
	if err != nil {
		writeErr(w, fsErr("read", p, err))
		return
	}
	if !fi.Mode().IsRegular() {
		writeErr(w, errcode.New(errcode.InvalidArgument, "%s is %s; remote_pull reads regular files only", p, kind(fi.Mode())))
		return
	}
	f, err := openRead(p)
	if err != nil {
		writeErr(w, fsErr("read", p, err))
		return
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		writeErr(w, fsErr("read", p, err))
		return
	}
	if !fi.Mode().IsRegular() { // swapped after the first stat
		writeErr(w, errcode.New(errcode.InvalidArgument, "%s is %s; remote_pull reads regular files only", p, kind(fi.Mode())))
		return
	}
	size := fi.Size()
	if size > max {
		writeErr(w, errcode.New(errcode.FileTooLarge, "%s is %d bytes; the per-file limit is %d", p, size, max).With("size", size).With("max", max))
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "application/octet-stream")
	hd.Set("Content-Length", strconv.FormatInt(size, 10))
	hd.Set(HeaderSize, strconv.FormatInt(size, 10))
	hd.Set(HeaderMode, fmtMode(fi.Mode()))
	w.WriteHeader(http.StatusOK)
	if n, err := io.CopyN(w, f, size); err != nil {
		// Shrunk while read, or the connection went: cut the reply so the reader sees a short
		// body, never a silently truncated file.
		h.log.Warn("file read cut short", "path", p, "sent", n, "size", size, "err", err)
		panic(http.ErrAbortHandler)
	}
}

func (h *handler) write(w http.ResponseWriter, r *http.Request) {
	res, err := h.doWrite(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, res)
}

func (h *handler) doWrite(r *http.Request) (WriteResult, error) {
	q := r.URL.Query()
	dest, err := absPath(q.Get("path"), "dest_path")
	if err != nil {
		return WriteResult{}, err
	}
	max, err := parseMax(q.Get("max"))
	if err != nil {
		return WriteResult{}, err
	}
	size, err := strconv.ParseInt(q.Get("size"), 10, 64)
	if err != nil || size < 0 {
		return WriteResult{}, errcode.New(errcode.InvalidArgument, "size must be the body's length in bytes (0 or more), not %q", q.Get("size"))
	}
	if size > max {
		return WriteResult{}, errcode.New(errcode.FileTooLarge, "the file is %d bytes; the per-file limit is %d", size, max).With("size", size).With("max", max)
	}
	if r.ContentLength >= 0 && r.ContentLength != size {
		return WriteResult{}, errcode.New(errcode.InvalidArgument, "the body is %d bytes but size says %d; nothing was written", r.ContentLength, size)
	}
	dir := filepath.Dir(dest)
	if dir == dest {
		return WriteResult{}, errcode.New(errcode.InvalidArgument, "dest_path %s names a root, not a file", dest)
	}
	di, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return WriteResult{}, errcode.New(errcode.FileNotFound, "the parent directory %s does not exist on the machine; create it first (remote_exec mkdir) or choose another dest_path", dir)
	}
	if err != nil {
		return WriteResult{}, fsErr("write", dir, err)
	}
	if !di.IsDir() {
		return WriteResult{}, errcode.New(errcode.InvalidArgument, "the parent of dest_path, %s, is %s, not a directory", dir, kind(di.Mode()))
	}
	res := WriteResult{Path: dest, Size: size}
	mode := fs.FileMode(0o600)
	var own owner
	old, err := os.Lstat(dest)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return WriteResult{}, fsErr("write", dest, err)
	case old.Mode()&fs.ModeSymlink != 0:
		res.Replaced = true // the link itself is replaced; its target is never touched
	case old.Mode().IsRegular():
		res.Replaced = true
		mode = old.Mode().Perm() // Perm drops setuid, setgid and sticky
		own = ownerOf(old)
	default:
		return WriteResult{}, errcode.New(errcode.InvalidArgument, "dest_path %s is %s; remote_push replaces only a regular file or a symlink", dest, kind(old.Mode()))
	}
	free, err := h.free(dir)
	if err != nil {
		return WriteResult{}, fsErr("free space of", dir, err)
	}
	if uint64(size) > free {
		return WriteResult{}, errcode.New(errcode.FileTooLarge, "the file is %d bytes but the filesystem holding %s has %d bytes free for the agent; free space or choose another dest_path", size, dir, free).
			With("size", size).With("free_bytes", free)
	}

	tmp, err := os.CreateTemp(dir, ".agentbox-push-*")
	if err != nil {
		return WriteResult{}, fsErr("write", dir, err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tmp.Close()
			if err := os.Remove(tmp.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
				h.log.Warn("remove temporary file", "path", tmp.Name(), "err", err)
			}
		}
	}()
	n, err := io.CopyN(tmp, r.Body, size)
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return WriteResult{}, errcode.Wrap(errcode.FileTooLarge, err, "the filesystem holding %s filled up after %d of %d bytes; nothing was replaced", dir, n, size)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return WriteResult{}, errcode.New(errcode.InvalidArgument, "the body ended after %d of the %d bytes declared; nothing was replaced", n, size)
		}
		return WriteResult{}, errcode.Wrap(errcode.Internal, err, "writing %s: %v after %d of %d bytes; nothing was replaced", dest, err, n, size)
	}
	if bodyTooLong(r.Body) {
		return WriteResult{}, errcode.New(errcode.InvalidArgument, "the body is longer than the %d bytes declared; nothing was replaced", size)
	}
	if err := tmp.Sync(); err != nil {
		return WriteResult{}, fsErr("sync", tmp.Name(), err)
	}
	res.Owner = setOwner(tmp, own)
	if err := tmp.Chmod(mode); err != nil {
		return WriteResult{}, fsErr("chmod", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return WriteResult{}, fsErr("write", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return WriteResult{}, fsErr("rename into", dest, err)
	}
	committed = true
	syncDir(dir)
	res.Mode = fmtMode(mode)
	return res, nil
}
