//go:build unix

package guest

import (
	"container/heap"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
)

// All file operations run in the agent, inside the sandbox's mount namespace, so paths and
// symlinks resolve inside the sandbox.

// resolve validates a caller's path and makes it absolute (relative to the workdir) and clean.
func (s *server) resolve(p, field string) (string, error) {
	if p == "" {
		return "", errcode.New(errcode.InvalidArgument, "%s is required", field)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errcode.New(errcode.InvalidArgument, "%s contains a NUL byte", field)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.workdir, p)
	}
	return filepath.Clean(p), nil
}

func (s *server) queryPath(q url.Values) (string, error) { return s.resolve(q.Get("path"), "path") }

// fsError turns a file system error on path into a typed error with an actionable message.
func fsError(err error, path string) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return errcode.Wrap(errcode.Internal, err, "%s: %v", path, err)
	}
	switch errno {
	case syscall.ENOENT:
		return errcode.Wrap(errcode.FileNotFound, err, "%s does not exist", path).With("path", path)
	case syscall.ENOTDIR:
		return errcode.Wrap(errcode.InvalidArgument, err, "%s: a component of the path is not a directory", path)
	case syscall.EACCES, syscall.EPERM:
		return errcode.Wrap(errcode.InvalidArgument, err, "%s: permission denied", path)
	case syscall.EROFS:
		return errcode.Wrap(errcode.InvalidArgument, err, "%s is on a read-only file system", path)
	case syscall.ENAMETOOLONG:
		return errcode.Wrap(errcode.InvalidArgument, err, "%s: file name too long", path)
	case syscall.ELOOP:
		return errcode.Wrap(errcode.InvalidArgument, err, "%s: too many levels of symbolic links", path)
	case syscall.EISDIR:
		return errcode.Wrap(errcode.InvalidArgument, err, "%s is a directory", path)
	case syscall.EEXIST:
		return errcode.Wrap(errcode.Conflict, err, "%s already exists", path)
	case syscall.ENOTEMPTY:
		return errcode.Wrap(errcode.InvalidArgument, err, "directory %s is not empty; pass recursive=true to remove it and its contents", path)
	case syscall.ENOSPC, syscall.EDQUOT:
		return noSpace(err, path)
	case syscall.EFBIG:
		return errcode.Wrap(errcode.FileTooLarge, err, "%s would be larger than the sandbox's largest file, its disk_mb; write less, or create a sandbox with a larger disk_mb", path).
			With("path", path).With("reason", "file_size_limit")
	case syscall.EBUSY:
		return errcode.Wrap(errcode.Conflict, err, "%s is busy (a mount point?)", path)
	case syscall.EXDEV:
		// A write's temporary file and its target on different file systems: something in
		// the sandbox replaced a directory of the path while the write ran.
		return errcode.Wrap(errcode.Conflict, err, "%s changed while it was being written (a directory of the path now leads to another file system); retry the write", path)
	}
	return errcode.Wrap(errcode.Internal, err, "%s: %v", path, errno)
}

// noSpace is the error of a write that found its file system full (blocks or inodes): the
// sandbox's disk, whose size is its disk_mb, or a memory-backed /tmp or /dev/shm.
func noSpace(err error, path string) error {
	if onTmpfs(path) {
		return errcode.Wrap(errcode.FileTooLarge, err, "no space left writing %s: it is on a memory-backed file system (/tmp and /dev/shm are sized from the sandbox's memory_mb and count against it); delete files there or write under /workspace", path).
			With("path", path).With("reason", "tmpfs_full")
	}
	return errcode.Wrap(errcode.FileTooLarge, err, "no space left writing %s: the sandbox's disk (its disk_mb) is full; delete files in the sandbox, or create a sandbox with a larger disk_mb", path).
		With("path", path).With("reason", "disk_full")
}

// parseMode parses octal permission bits ("0644"); empty means def.
func parseMode(s string, def uint32) (uint32, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errcode.New(errcode.InvalidArgument, "mode %q is not octal permission bits like 0644", s)
	}
	return uint32(m), nil
}

// fileMode converts raw permission bits (with setuid/setgid/sticky) to an fs.FileMode.
func fileMode(m uint32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		fm |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

func modeString(fi fs.FileInfo) string {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%04o", uint32(st.Mode)&0o7777)
	}
	m := uint32(fi.Mode().Perm())
	if fi.Mode()&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if fi.Mode()&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if fi.Mode()&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return fmt.Sprintf("%04o", m)
}

func fileType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "other"
}

// kindOf names a non-regular file's kind for messages.
func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return "not a regular file"
}

func newFileInfo(path string, fi fs.FileInfo) FileInfo {
	return FileInfo{
		Path:    path,
		Name:    filepath.Base(path),
		Type:    fileType(fi.Mode()),
		Size:    fi.Size(),
		Mode:    modeString(fi),
		ModTime: fi.ModTime().UTC(),
	}
}

// statPath describes path, following a final symlink (a dangling one is described as itself);
// LinkTarget is set when path is a symlink.
func statPath(path string) (FileInfo, error) {
	lfi, err := os.Lstat(path)
	if err != nil {
		return FileInfo{}, fsError(err, path)
	}
	if lfi.Mode()&fs.ModeSymlink == 0 {
		return newFileInfo(path, lfi), nil
	}
	info := newFileInfo(path, lfi)
	if fi, err := os.Stat(path); err == nil {
		info = newFileInfo(path, fi)
	}
	info.LinkTarget, _ = os.Readlink(path)
	return info, nil
}

func queryInt(q url.Values, name string) (int64, error) {
	s := q.Get(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, errcode.New(errcode.InvalidArgument, "%s must be a non-negative integer, got %q", name, s)
	}
	return n, nil
}

func (s *server) handleStat(w http.ResponseWriter, r *http.Request) {
	p, err := s.queryPath(r.URL.Query())
	if err != nil {
		s.writeError(w, err)
		return
	}
	info, err := statPath(p)
	if err != nil {
		s.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// handleWriteFile writes the request body to path atomically: a temp file in the same
// directory gets the body and the mode, then is renamed over the target. A final symlink is
// followed (its target is replaced); an existing file's owner is kept when the agent may.
func (s *server) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p, err := s.queryPath(q)
	if err != nil {
		s.writeError(w, err)
		return
	}
	mode, err := parseMode(q.Get("mode"), 0o644)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if mode == 0 {
		// The client always sends a mode; 0 is its zero value, not a request for an
		// unreadable file.
		mode = 0o644
	}
	if err := s.writeFile(p, mode, r.Body); err != nil {
		s.writeError(w, err)
		return
	}
	info, err := statPath(p)
	if err != nil {
		s.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// bodyReader remembers a read error, to tell a broken upload from a failing disk.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

func (s *server) writeFile(p string, mode uint32, body io.Reader) (err error) {
	target := p
	var existing fs.FileInfo
	if lfi, lerr := os.Lstat(p); lerr == nil {
		if lfi.Mode()&fs.ModeSymlink != 0 {
			if real, rerr := filepath.EvalSymlinks(p); rerr == nil {
				target = real
				lfi, lerr = os.Lstat(real)
			}
		}
		if lerr == nil {
			if lfi.IsDir() {
				return errcode.New(errcode.InvalidArgument, "%s is a directory; pass the path of a file to write", p)
			}
			existing = lfi
		}
	}
	dir, base := filepath.Split(target)
	if len(base) > 100 {
		base = base[:100]
	}
	tmp, err := os.CreateTemp(dir, "."+base+".agentbox-*")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errcode.Wrap(errcode.FileNotFound, err, "parent directory %s does not exist; create it first (mkdir with parents=true)", filepath.Clean(dir)).With("path", p)
		}
		return fsError(err, filepath.Clean(dir))
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	br := &bodyReader{r: body}
	if _, err := io.Copy(tmp, br); err != nil {
		if br.err != nil {
			return errcode.Wrap(errcode.InvalidArgument, err, "the upload of %s was interrupted: %v", p, br.err)
		}
		return fsError(err, p)
	}
	// Before the chmod: chown clears setuid bits.
	if existing != nil {
		// Keep the owner of the file being replaced.
		if st, ok := existing.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid()) {
			_ = tmp.Chown(int(st.Uid), int(st.Gid))
		}
	} else if s.user != nil {
		// A new file belongs to the default user, so commands can change it.
		if err := tmp.Chown(int(s.user.UID), int(s.user.GID)); err != nil {
			return fsError(err, p)
		}
	}
	if err := tmp.Chmod(fileMode(mode)); err != nil {
		return fsError(err, p)
	}
	if err := tmp.Close(); err != nil {
		return fsError(err, p)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return fsError(err, p)
	}
	return nil
}

// handleReadFile streams a byte range of a regular file.
func (s *server) handleReadFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p, err := s.queryPath(q)
	if err != nil {
		s.writeError(w, err)
		return
	}
	var offset, length, limit int64
	for _, v := range []struct {
		name string
		dst  *int64
	}{{"offset", &offset}, {"length", &length}, {"limit", &limit}} {
		if *v.dst, err = queryInt(q, v.name); err != nil {
			s.writeError(w, err)
			return
		}
	}
	if limit == 0 {
		limit = DefaultReadLimit
	}
	f, size, err := openRegular(p)
	if err != nil {
		s.writeError(w, err)
		return
	}
	defer f.Close()
	var n int64
	if offset < size {
		n = size - offset
		if length > 0 && length < n {
			n = length
		}
	}
	if n > limit {
		s.writeError(w, errcode.New(errcode.FileTooLarge,
			"%s is %d bytes and the requested range is %d bytes, more than the limit of %d; pass offset and length to read it in parts",
			p, size, n, limit).With("size", size).With("limit", limit))
		return
	}
	if n > 0 {
		if _, err := f.Seek(offset, io.SeekStart); err != nil {
			s.writeError(w, fsError(err, p))
			return
		}
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set(SizeHeader, strconv.FormatInt(size, 10))
	h.Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	if n == 0 {
		return
	}
	if _, err := io.CopyN(w, f, n); err != nil {
		// The reply is cut short (the file shrank, or the client left): net/http closes the
		// connection because fewer than Content-Length bytes were sent.
		s.log.Warn("guest: file read cut short", "path", p, "err", err)
	}
}

// openRegular opens a regular file for reading without ever blocking on the open (a FIFO
// with no writer would hang a plain open) and without reading other kinds of files.
func openRegular(p string) (*os.File, int64, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, 0, fsError(err, p)
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, notRegular(p, fi.Mode())
	}
	var fd int
	for {
		fd, err = unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, 0, fsError(&fs.PathError{Op: "open", Path: p, Err: err}, p)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return nil, 0, fsError(err, p)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		_ = unix.Close(fd)
		// Replaced between the stat and the open.
		return nil, 0, errcode.New(errcode.InvalidArgument, "%s is not a regular file; only regular files can be read", p)
	}
	_ = unix.SetNonblock(fd, false)
	return os.NewFile(uintptr(fd), p), st.Size, nil
}

func notRegular(p string, m fs.FileMode) error {
	return errcode.New(errcode.InvalidArgument, "%s is %s, not a regular file; only regular files can be read", p, kindOf(m)).With("type", fileType(m))
}

// nameHeap is a max-heap of names: it keeps the smallest MaxListEntries names of a directory
// of any size in bounded memory.
type nameHeap []string

func (h nameHeap) Len() int           { return len(h) }
func (h nameHeap) Less(i, j int) bool { return h[i] > h[j] }
func (h nameHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nameHeap) Push(x any)        { *h = append(*h, x.(string)) }
func (h *nameHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// handleList lists a directory sorted by name: at most MaxListEntries entries (the first by
// name), with the total count. Entries describe the names themselves (symlinks not followed).
func (s *server) handleList(w http.ResponseWriter, r *http.Request) {
	p, err := s.queryPath(r.URL.Query())
	if err != nil {
		s.writeError(w, err)
		return
	}
	dl, err := listDir(p, MaxListEntries)
	if err != nil {
		s.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, dl)
}

func listDir(p string, maxEntries int) (DirList, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return DirList{}, fsError(err, p)
	}
	if !fi.IsDir() {
		return DirList{}, errcode.New(errcode.InvalidArgument, "%s is %s, not a directory; use stat for a single file", p, kindOrFile(fi.Mode()))
	}
	// O_DIRECTORY|O_NONBLOCK: a path swapped for a FIFO cannot hang the open.
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return DirList{}, fsError(&fs.PathError{Op: "open", Path: p, Err: err}, p)
	}
	d := os.NewFile(uintptr(fd), p)
	defer d.Close()
	var h nameHeap
	total := 0
	for {
		names, err := d.Readdirnames(1024)
		for _, n := range names {
			total++
			switch {
			case len(h) < maxEntries:
				heap.Push(&h, n)
			case n < h[0]:
				h[0] = n
				heap.Fix(&h, 0)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return DirList{}, fsError(err, p)
		}
	}
	names := []string(h)
	slices.Sort(names)
	dl := DirList{Path: p, Entries: make([]FileInfo, 0, len(names)), Total: total}
	for _, n := range names {
		ep := filepath.Join(p, n)
		lfi, err := os.Lstat(ep)
		if err != nil {
			dl.Total-- // removed meanwhile
			continue
		}
		info := newFileInfo(ep, lfi)
		if lfi.Mode()&fs.ModeSymlink != 0 {
			info.LinkTarget, _ = os.Readlink(ep)
		}
		dl.Entries = append(dl.Entries, info)
	}
	dl.Truncated = dl.Total > len(dl.Entries)
	return dl, nil
}

func kindOrFile(m fs.FileMode) string {
	if m.IsRegular() {
		return "a file"
	}
	return kindOf(m)
}

func (s *server) handleMkdir(w http.ResponseWriter, r *http.Request) {
	var req MkdirRequest
	if err := decodeJSON(w, r, maxSmallBody, &req); err != nil {
		s.writeError(w, err)
		return
	}
	p, err := s.resolve(req.Path, "path")
	if err != nil {
		s.writeError(w, err)
		return
	}
	mode, err := parseMode(req.Mode, 0o755)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if err := s.mkdir(p, mode, req.Parents); err != nil {
		s.writeError(w, err)
		return
	}
	info, err := statPath(p)
	if err != nil {
		s.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// mkdir creates p with exactly mode (the umask does not apply to it), owned by the default user
// when there is one. With parents, missing parents are created too (0755, owned the same way)
// and an existing directory is fine (like mkdir -p).
func (s *server) mkdir(p string, mode uint32, parents bool) error {
	if fi, err := os.Stat(p); err == nil {
		if !fi.IsDir() {
			return errcode.New(errcode.Conflict, "%s already exists and is %s", p, kindOrFile(fi.Mode()))
		}
		if parents {
			return nil
		}
		return errcode.New(errcode.Conflict, "directory %s already exists (pass parents=true to accept an existing directory)", p)
	}
	if parents {
		if err := s.mkdirParents(filepath.Dir(p)); err != nil {
			return err
		}
	}
	if err := os.Mkdir(p, fileMode(mode)&fs.ModePerm); err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return errcode.Wrap(errcode.FileNotFound, err, "parent directory %s does not exist; pass parents=true to create it", filepath.Dir(p)).With("path", p)
		case errors.Is(err, fs.ErrExist) && parents:
			// Created concurrently; fine for mkdir -p if it is a directory.
			if fi, serr := os.Stat(p); serr == nil && fi.IsDir() {
				return nil
			}
		}
		return fsError(err, p)
	}
	return s.ownNewDir(p, mode)
}

// mkdirParents creates p and its missing parents, like os.MkdirAll, each new one 0755 and owned
// like every directory the agent creates.
func (s *server) mkdirParents(p string) error {
	fi, err := os.Stat(p)
	if err == nil {
		if !fi.IsDir() {
			return fsError(&fs.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}, p)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fsError(err, p)
	}
	if parent := filepath.Dir(p); parent != p {
		if err := s.mkdirParents(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		if fi, serr := os.Stat(p); errors.Is(err, fs.ErrExist) && serr == nil && fi.IsDir() {
			return nil // created concurrently
		}
		return fsError(err, p)
	}
	return s.ownNewDir(p, 0o755)
}

// ownNewDir gives a directory the agent has just made exactly mode (with setuid, setgid and
// sticky bits; no umask) and, when there is a default user, that user as owner, so commands can
// use it. It changes the directory through a descriptor opened without following symlinks: a
// path swapped for a symlink meanwhile is refused, never followed.
func (s *server) ownNewDir(p string, mode uint32) error {
	var fd int
	var err error
	for {
		fd, err = unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fsError(&fs.PathError{Op: "open", Path: p, Err: err}, p)
	}
	defer unix.Close(fd)
	if s.user != nil {
		// Before the chmod: a chown may clear setuid and setgid bits.
		if err := unix.Fchown(fd, int(s.user.UID), int(s.user.GID)); err != nil {
			return fsError(&fs.PathError{Op: "chown", Path: p, Err: err}, p)
		}
	}
	if err := unix.Fchmod(fd, mode&0o7777); err != nil {
		return fsError(&fs.PathError{Op: "chmod", Path: p, Err: err}, p)
	}
	return nil
}

// handleRemove deletes a file, symlink (not its target) or empty directory; with recursive, a
// directory tree. "/", the workdir and its ancestors are refused.
func (s *server) handleRemove(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p, err := s.queryPath(q)
	if err != nil {
		s.writeError(w, err)
		return
	}
	recursive := false
	if v := q.Get("recursive"); v != "" {
		if recursive, err = strconv.ParseBool(v); err != nil {
			s.writeError(w, errcode.New(errcode.InvalidArgument, "recursive must be true or false, got %q", v))
			return
		}
	}
	if p == "/" || p == s.workdir || strings.HasPrefix(s.workdir, strings.TrimSuffix(p, "/")+"/") {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "refusing to remove %s: it is the root or holds the working directory %s", p, s.workdir))
		return
	}
	lfi, err := os.Lstat(p)
	if err != nil {
		s.writeError(w, fsError(err, p))
		return
	}
	if lfi.IsDir() && recursive {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
	}
	if err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			err = syscall.ENOTEMPTY // rmdir may report either
		}
		s.writeError(w, fsError(err, p))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
