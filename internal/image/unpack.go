package image

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds of one layer's unpack. A layer past any of them is refused (IMAGE_PULL_FAILED,
// details.reason "too_large" or "unsafe_layer"), and nothing of it is kept.
const (
	// MaxEntryBytes bounds one regular file of a layer (a tar header's size).
	MaxEntryBytes = 8 << 30
	// DefaultMaxLayerBytes bounds one layer's uncompressed tar (Options.MaxLayerBytes).
	DefaultMaxLayerBytes = 16 << 30
	// DefaultMaxImageBytes bounds an image's layers' uncompressed total (Options.MaxImageBytes).
	DefaultMaxImageBytes = 32 << 30
	// MaxLayerEntries bounds the entries of one layer's tar.
	MaxLayerEntries = 1 << 20
	// MaxEntryNameBytes bounds an entry's name and a link's target (PATH_MAX).
	MaxEntryNameBytes = 4096
	// MaxEntryXattrs bounds the xattrs kept on one entry; MaxXattrBytes one xattr's value.
	MaxEntryXattrs = 64
	MaxXattrBytes  = 64 << 10
	// MaxLayerID is the largest uid or gid a layer's file keeps; larger ids are clamped to
	// ClampedID (nobody), as they cannot be mapped into a sandbox's 65536 ids.
	MaxLayerID = 65535
	ClampedID  = 65534
)

// Unpack reasons (details.reason of IMAGE_PULL_FAILED).
const (
	ReasonUnreachable    = "unreachable"
	ReasonUnauthorized   = "unauthorized"
	ReasonDigestMismatch = "digest_mismatch"
	ReasonUnsafeLayer    = "unsafe_layer"
	ReasonTooLarge       = "too_large"
	ReasonNoPlatform     = "no_platform"
)

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	xattrOpaque    = "trusted.overlay.opaque"
)

// unsafeLayer is the typed error of a layer refused for one of its entries.
func unsafeLayer(entry, format string, args ...any) *errcode.Error {
	return errcode.New(errcode.ImagePullFailed, "layer refused: entry %q: %s", entry, fmt.Sprintf(format, args...)).
		With("reason", ReasonUnsafeLayer).With("entry", entry)
}

func tooLarge(format string, args ...any) *errcode.Error {
	return errcode.New(errcode.ImagePullFailed, format, args...).With("reason", ReasonTooLarge)
}

// unpackStats counts what an unpack did.
type unpackStats struct {
	Entries   int
	Bytes     int64 // regular files' sizes
	DiskBytes int64 // a rough on-disk size (files rounded to 4 KiB, 4 KiB per other entry)
	Skipped   int   // devices, fifos, sockets
	Clamped   int   // entries whose ids were clamped
}

// decompress returns a reader of r's uncompressed stream, detecting gzip and zstd by their
// magic numbers (anything else is read as an uncompressed tar).
func decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	magic, _ := br.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, err
		}
		return zr, nil
	case len(magic) == 4 && bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		return zr.IOReadCloser(), nil
	}
	return io.NopCloser(br), nil
}

// cleanEntryName returns a tar entry's name relative to the layer's root ("" for the root
// itself), or an error if it is absolute, climbs out with "..", or is too long.
func cleanEntryName(name string) (string, error) {
	if len(name) > MaxEntryNameBytes {
		return "", fmt.Errorf("name is %d bytes, more than %d", len(name), MaxEntryNameBytes)
	}
	if strings.ContainsRune(name, 0) {
		return "", errors.New("name contains NUL")
	}
	if strings.HasPrefix(name, "/") {
		return "", errors.New("absolute name")
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", errors.New(`name climbs with ".."`)
		}
	}
	c := path.Clean(name)
	if c == "." {
		return "", nil
	}
	return c, nil
}
