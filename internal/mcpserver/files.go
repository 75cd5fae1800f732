package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
)

// FileWriteIn are file_write's arguments.
type FileWriteIn struct {
	SandboxID     string  `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab (from sandbox_create or sandbox_list)."`
	Path          string  `json:"path" jsonschema:"File path in the sandbox, absolute or relative to /workspace. Parent directories must exist."`
	Content       *string `json:"content,omitempty" jsonschema:"The file's content as UTF-8 text. Give this or content_base64."`
	ContentBase64 *string `json:"content_base64,omitempty" jsonschema:"The file's content as standard base64, for binary files. Give this or content."`
	Mode          string  `json:"mode,omitempty" jsonschema:"Permission bits in octal, e.g. 0644 (default) or 0755 for a script."`
}

// FileWriteOut is file_write's reply.
type FileWriteOut struct {
	Path string `json:"path" jsonschema:"Absolute path written."`
	Size int64  `json:"size" jsonschema:"File size in bytes."`
	Mode string `json:"mode" jsonschema:"Permission bits in octal."`
}

// FileReadIn are file_read's arguments.
type FileReadIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab (from sandbox_create or sandbox_list)."`
	Path      string `json:"path" jsonschema:"File path in the sandbox, absolute or relative to /workspace."`
	Offset    int64  `json:"offset,omitempty" jsonschema:"Byte offset to start at; default 0."`
	Length    int64  `json:"length,omitempty" jsonschema:"Bytes to read, at most 1048576; default the rest of the file (which must then fit in 1 MiB)."`
}

// FileReadOut is file_read's reply: content when the bytes are UTF-8 text, else content_base64.
type FileReadOut struct {
	Path          string  `json:"path" jsonschema:"The path read."`
	Size          int64   `json:"size" jsonschema:"The file's total size in bytes."`
	Offset        int64   `json:"offset" jsonschema:"Offset of the first byte returned."`
	Bytes         int64   `json:"bytes" jsonschema:"Number of bytes returned."`
	Encoding      string  `json:"encoding" jsonschema:"utf-8 (content is set) or base64 (content_base64 is set)."`
	Content       *string `json:"content,omitempty" jsonschema:"The bytes as text, when they are valid UTF-8 without control bytes (other than whitespace and escape)."`
	ContentBase64 *string `json:"content_base64,omitempty" jsonschema:"The bytes in standard base64, when they are not text."`
	EOF           bool    `json:"eof" jsonschema:"True when the reply reaches the end of the file."`
	NextOffset    int64   `json:"next_offset,omitempty" jsonschema:"Offset to pass to read the next part, when eof is false."`
}

// FileListIn are file_list's arguments.
type FileListIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab (from sandbox_create or sandbox_list)."`
	Path      string `json:"path,omitempty" jsonschema:"Directory to list, absolute or relative to /workspace; default /workspace."`
}

// FileEntry is one directory entry.
type FileEntry struct {
	Name       string    `json:"name" jsonschema:"Entry name."`
	Type       string    `json:"type" jsonschema:"file, dir, symlink or other."`
	Size       int64     `json:"size" jsonschema:"Size in bytes."`
	Mode       string    `json:"mode" jsonschema:"Permission bits in octal."`
	ModTime    time.Time `json:"mod_time" jsonschema:"Last modification (RFC 3339)."`
	LinkTarget string    `json:"link_target,omitempty" jsonschema:"Target of a symlink."`
}

// FileListOut is file_list's reply.
type FileListOut struct {
	Path      string      `json:"path" jsonschema:"The directory listed."`
	Entries   []FileEntry `json:"entries" jsonschema:"Entries sorted by name."`
	Total     int         `json:"total" jsonschema:"Number of entries in the directory."`
	Truncated bool        `json:"truncated" jsonschema:"True when the directory has more entries than were returned (10000)."`
}

func (s *Server) addFileTools() {
	addTool(s, &mcp.Tool{
		Name:  "file_write",
		Title: "Write a file into a sandbox",
		Description: `Create or replace a file in a running sandbox (atomically: readers see the old or the new file, never half of it).
Arguments: sandbox_id (required), path (required; absolute, or relative to /workspace; the parent directory must exist — create it with exec ["mkdir", "-p", "dir"]), content (UTF-8 text) or content_base64 (binary) — exactly one, mode (octal string, default "0644"; "0755" for scripts).
At most 10 MiB per call: split bigger files into parts and join them with exec ["sh", "-c", "cat part.* > file"], or use agentbox's REST API (PUT /v1/sandboxes/{id}/files) which streams files up to 1 GiB.
Reply: {path, size, mode}. Next: exec to use the file.
` + errorsDoc(errNotFound, errNotRunning, errInvalid, "FILE_TOO_LARGE (split the file as above)", "FILE_NOT_FOUND (the parent directory does not exist: create it)"),
		Annotations: &mcp.ToolAnnotations{Title: "Write a file into a sandbox", DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.fileWrite)

	addTool(s, &mcp.Tool{
		Name:  "file_read",
		Title: "Read a file from a sandbox",
		Description: `Read a file (or a byte range of it) from a running sandbox.
Arguments: sandbox_id (required), path (required), offset (default 0), length (default: the rest of the file).
At most 1 MiB per call: page through bigger files with offset and length (the reply's next_offset is where the next page starts), or search them with exec (grep, head, tail).
Reply: {path, size (the whole file), offset, bytes (returned), encoding, content (UTF-8 text) or content_base64 (binary), eof, next_offset}.
` + errorsDoc(errNotFound, errNotRunning, errInvalid, "FILE_NOT_FOUND (no such file: check the path with file_list)", "FILE_TOO_LARGE (page with offset and length as above)"),
		Annotations: &mcp.ToolAnnotations{Title: "Read a file from a sandbox", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.fileRead)

	addTool(s, &mcp.Tool{
		Name:  "file_list",
		Title: "List a directory in a sandbox",
		Description: `List a directory in a running sandbox. Arguments: sandbox_id (required), path (default /workspace).
Reply: {path, entries: [{name, type ("file", "dir", "symlink" or "other"), size, mode, mod_time, link_target}], total, truncated}. Entries are sorted by name; at most 10000 are returned (truncated says so) — use exec ["find", ...] for big trees.
` + errorsDoc(errNotFound, errNotRunning, errInvalid, "FILE_NOT_FOUND (no such directory)"),
		Annotations: &mcp.ToolAnnotations{Title: "List a directory in a sandbox", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.fileList)
}

func (s *Server) fileWrite(ctx context.Context, _ *mcp.CallToolRequest, in FileWriteIn) (FileWriteOut, string, error) {
	var data []byte
	switch {
	case in.Content != nil && in.ContentBase64 != nil:
		return FileWriteOut{}, "", errcode.New(errcode.InvalidArgument, "give content (UTF-8 text) or content_base64 (binary), not both")
	case in.Content != nil:
		data = []byte(*in.Content)
	case in.ContentBase64 != nil:
		var err error
		if data, err = decodeBase64(*in.ContentBase64); err != nil {
			return FileWriteOut{}, "", errcode.New(errcode.InvalidArgument, "content_base64 is not valid standard base64 (%v); for text, pass it as content instead", err)
		}
	default:
		return FileWriteOut{}, "", errcode.New(errcode.InvalidArgument, "missing required argument: give content (UTF-8 text) or content_base64 (binary); content \"\" writes an empty file")
	}
	if len(data) > MaxWriteBytes {
		return FileWriteOut{}, "", errcode.New(errcode.FileTooLarge, "content is %d bytes; file_write takes at most %d bytes (10 MiB) per call: write the file in parts (part.000, part.001, …) and join them with exec [\"sh\", \"-c\", \"cat part.* > file && rm part.*\"], or upload it with the REST API (PUT /v1/sandboxes/{id}/files, up to 1 GiB)", len(data), MaxWriteBytes).
			With("size", len(data)).With("limit", MaxWriteBytes)
	}
	mode := uint64(0o644)
	if in.Mode != "" {
		var err error
		if mode, err = strconv.ParseUint(strings.TrimPrefix(in.Mode, "0o"), 8, 32); err != nil || mode > 0o7777 {
			return FileWriteOut{}, "", errcode.New(errcode.InvalidArgument, "mode must be octal permission bits as a string, such as \"0644\" or \"0755\"; got %q", in.Mode)
		}
	}
	fi, err := s.b.WriteFile(ctx, in.SandboxID, in.Path, uint32(mode), bytes.NewReader(data))
	if e, ok := errcode.As(err); ok && e.Code == errcode.FileNotFound && strings.Contains(e.Message, "parent directory") {
		dir := path.Dir(in.Path)
		return FileWriteOut{}, "", errcode.New(errcode.FileNotFound, "the parent directory %s does not exist: create it with exec [\"mkdir\", \"-p\", %q], then retry", dir, dir).With("path", in.Path)
	}
	if err != nil {
		return FileWriteOut{}, "", err
	}
	out := FileWriteOut{Path: fi.Path, Size: fi.Size, Mode: fi.Mode}
	return out, fmt.Sprintf("Wrote %s (%d bytes, mode %s).", out.Path, out.Size, out.Mode), nil
}

// decodeBase64 accepts standard base64 with or without padding, ignoring line breaks.
func decodeBase64(s string) ([]byte, error) {
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == ' ' || r == '\t' {
			return -1
		}
		return r
	}, s)
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
}

func (s *Server) fileRead(ctx context.Context, _ *mcp.CallToolRequest, in FileReadIn) (FileReadOut, string, error) {
	if in.Offset < 0 {
		return FileReadOut{}, "", errcode.New(errcode.InvalidArgument, "offset must not be negative; got %d", in.Offset)
	}
	if in.Length < 0 || in.Length > MaxReadBytes {
		return FileReadOut{}, "", errcode.New(errcode.InvalidArgument, "length must be between 1 and %d (file_read returns at most 1 MiB per call; page with offset); got %d", MaxReadBytes, in.Length)
	}
	rc, size, err := s.b.ReadFile(ctx, in.SandboxID, in.Path, in.Offset, in.Length, MaxReadBytes)
	if err != nil {
		if e, ok := errcode.As(err); ok && e.Code == errcode.FileTooLarge {
			total := size
			if v, ok := e.Details["size"]; ok {
				total = toInt64(v)
			}
			return FileReadOut{}, "", errcode.New(errcode.FileTooLarge, "%s is %d bytes; from offset %d that is more than file_read returns in one call (%d bytes): read it in pages with offset and length (offset %d, length %d; then offset %d, …), or search it with exec (grep, head, tail)",
				in.Path, total, in.Offset, MaxReadBytes, in.Offset, MaxReadBytes, in.Offset+MaxReadBytes).With("size", total).With("limit", MaxReadBytes)
		}
		return FileReadOut{}, "", err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxReadBytes+1))
	if err != nil {
		return FileReadOut{}, "", errcode.Wrap(errcode.Internal, err, "reading %s was interrupted; retry", in.Path)
	}
	if len(data) > MaxReadBytes {
		data = data[:MaxReadBytes]
	}
	out := FileReadOut{Path: in.Path, Size: size, Offset: in.Offset}
	if text, ok := asText(data, in.Offset+int64(len(data)) >= size); ok {
		data = data[:len(text)] // a rune split at the end of the page moves to the next page
		out.Encoding, out.Content = "utf-8", &text
	} else {
		b64 := base64.StdEncoding.EncodeToString(data)
		out.Encoding, out.ContentBase64 = "base64", &b64
	}
	out.Bytes = int64(len(data))
	out.EOF = in.Offset+out.Bytes >= size
	if !out.EOF {
		out.NextOffset = in.Offset + out.Bytes
	}
	return out, renderRead(out), nil
}

// asText returns data as text when it is UTF-8 without control bytes. Unless atEOF, an incomplete
// rune at the end is left out (the caller returns fewer bytes).
func asText(data []byte, atEOF bool) (string, bool) {
	for _, c := range data {
		// Control bytes other than whitespace, backspace and escape (terminal colours) mean
		// binary data.
		if (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v' && c != '\b' && c != 0x1b) || c == 0x7f {
			return "", false
		}
	}
	if utf8.Valid(data) {
		return string(data), true
	}
	if atEOF {
		return "", false
	}
	for i := 1; i <= 3 && i < len(data); i++ {
		if utf8.Valid(data[:len(data)-i]) {
			return string(data[:len(data)-i]), true
		}
	}
	return "", false
}

func toInt64(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int:
		return int64(n)
	case float64:
		return int64(n)
	}
	return 0
}

func (s *Server) fileList(ctx context.Context, _ *mcp.CallToolRequest, in FileListIn) (FileListOut, string, error) {
	if in.Path == "" {
		in.Path = "/workspace"
	}
	dl, err := s.b.ListDir(ctx, in.SandboxID, in.Path)
	if err != nil {
		return FileListOut{}, "", err
	}
	out := FileListOut{Path: dl.Path, Entries: make([]FileEntry, 0, len(dl.Entries)), Total: dl.Total, Truncated: dl.Truncated}
	for _, e := range dl.Entries {
		out.Entries = append(out.Entries, FileEntry{Name: e.Name, Type: e.Type, Size: e.Size, Mode: e.Mode, ModTime: e.ModTime, LinkTarget: e.LinkTarget})
	}
	return out, renderDir(out), nil
}
