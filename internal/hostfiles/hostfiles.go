// Package hostfiles is the machine side of the file relay: an http.Handler, mounted
// by the machine agent under /files/, that streams a regular file out (read) and writes one in
// atomically (write), and the Client the server uses to call it over the machine's connection.
//
// Read takes an absolute path. A symlink is followed (the user asked for what the name shows),
// but what is opened must be a regular file: a directory, device, FIFO or socket is refused
// before anything is read. The reply carries the size up front (Content-Length and
// X-Agentbox-Size) and the handler refuses a file larger than the cap the request names, so the
// server never stores more than its per-file limit.
//
// Write takes an absolute dest_path whose parent directory exists. The declared size must be
// within the request's cap and must fit the free space of the destination's filesystem (statfs
// on POSIX, GetDiskFreeSpaceEx on Windows), both checked before a byte is read. The body goes
// to a temporary file in the same directory, is checked against the declared size (short or
// long: the temporary file is removed and nothing is replaced), synced, and renamed over the
// destination. A replaced regular file keeps its permission bits without setuid, setgid and
// sticky, and its owner and group where the agent may set them; a new file is 0600; a symlink
// at dest_path is replaced by the file, never followed; a directory, device, FIFO or socket at
// dest_path is refused.
package hostfiles

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
)

// Routes, under the /files/ prefix the agent mounts the handler at.
const (
	Prefix    = "/files/"
	ReadPath  = "/files/read"
	WritePath = "/files/write"
)

// Headers of a read reply.
const (
	HeaderSize = "X-Agentbox-Size"
	HeaderMode = "X-Agentbox-Mode"
)

// DefaultMaxBytes is the per-file cap when a request names none (the server's default).
const DefaultMaxBytes int64 = 100 << 20

// WriteResult is what a write did: the file as it now is.
type WriteResult struct {
	// Path is the destination written (as given, cleaned).
	Path string `json:"path"`
	// Size is the number of bytes written.
	Size int64 `json:"size"`
	// Mode is the file's permission bits, octal ("0600").
	Mode string `json:"mode"`
	// Replaced is true when a file (or a symlink) stood at Path before.
	Replaced bool `json:"replaced"`
	// Owner is kept from the replaced file ("uid:gid"), or "" when not set (new file, Windows,
	// or the agent may not set it).
	Owner string `json:"owner,omitempty"`
}

// writeErr answers with err as a typed error (peerreply.WriteError).
func writeErr(w http.ResponseWriter, err error) { peerreply.WriteError(w, err) }

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// parseMax reads the cap a request names ("max"; DefaultMaxBytes when absent).
func parseMax(v string) (int64, error) {
	if v == "" {
		return DefaultMaxBytes, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, errcode.New(errcode.InvalidArgument, "max must be a positive byte count, not %q", v)
	}
	return n, nil
}

// fsErr translates a filesystem error on path to a typed error.
func fsErr(op, path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errcode.Wrap(errcode.FileNotFound, err, "%s %s: no such file or directory on the machine", op, path)
	case errors.Is(err, fs.ErrPermission):
		return errcode.Wrap(errcode.PermissionDenied, err, "%s %s: the machine agent may not do this (permission denied)", op, path)
	}
	return errcode.Wrap(errcode.Internal, err, "%s %s: %v", op, path, err)
}

// fmtMode formats permission bits as octal.
func fmtMode(m fs.FileMode) string { return fmt.Sprintf("%04o", uint32(m.Perm())) }

// bodyTooLong reports whether r has a byte left after the declared size.
func bodyTooLong(r io.Reader) bool {
	var one [1]byte
	n, _ := io.ReadFull(r, one[:])
	return n > 0
}
