package guest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
	"github.com/agentbox/agentbox/internal/text"
)

// The host reads nothing from an agent without a bound: root inside a sandbox can replace the
// agent's socket with a listener of its own, and the control plane serves every sandbox. Each
// bound is what the protocol allows for that reply, computed for the worst legitimate encoding:
// JSON escapes one byte of a string into at most six ("\u00XX", or "\ufffd" for invalid UTF-8),
// and base64 ([]byte fields) takes four bytes for three.
const (
	// MaxFrameData is the most output one streamed frame carries: the agent reads (and sends)
	// output in pieces of at most this size.
	MaxFrameData = 32 << 10
	// jsonGrowth is how much larger a string or []byte field can be once encoded.
	jsonGrowth = 6
	// replySlack covers field names, numbers and the short fields of a reply.
	replySlack = 16 << 10
	// maxPathBytes bounds a path in a reply: a request's path (4096 bytes, the host's limit)
	// resolved under /workspace, plus a name of a directory's entry.
	maxPathBytes = 4096 + 512
	// maxNameBytes is NAME_MAX; maxLinkBytes bounds a symlink's target (PATH_MAX).
	maxNameBytes = 255
	maxLinkBytes = 4096

	maxHealthReply  = 4 << 10
	maxOOMKillReply = 4 << 10
	maxErrorReply   = peerreply.MaxErrorBody
	// maxFileInfoReply bounds one FileInfo: its path, name and link target, escaped.
	maxFileInfoReply = jsonGrowth*(2*maxPathBytes+maxNameBytes+maxLinkBytes) + replySlack
	// maxListDecoded bounds the text of a listing's entries once decoded: MaxListEntries
	// entries of a long path, a name and a link target (86 MiB) fit.
	maxListDecoded = 96 << 20
	// maxOutputFrame bounds an output frame: MaxFrameData of data (base64) and its field names.
	maxOutputFrame = (MaxFrameData+2)/3*4 + 256
	// maxHeaderBytes bounds a reply's header.
	maxHeaderBytes = 64 << 10
)

// maxExecReply bounds a non-streamed exec result (and a streamed exec's result frame): two
// streams of what maxOut keeps, escaped, and the rest of the result.
func maxExecReply(maxOut int64) int64 {
	if maxOut <= 0 {
		maxOut = DefaultMaxOutputBytes
	}
	maxOut = min(maxOut, MaxMaxOutputBytes)
	return 2*jsonGrowth*maxOut + replySlack
}

func validOOMKill(r *OOMKillResult) error {
	if r.Killed < 0 || r.RSSBytes < 0 {
		return errors.New("negative count")
	}
	return nil
}

func validExecResult(r *ExecResult) error {
	if r.StdoutBytes < 0 || r.StderrBytes < 0 || r.DurationMs < 0 {
		return errors.New("negative count or duration")
	}
	if len(r.Signal) > 16 || strings.IndexFunc(r.Signal, func(c rune) bool { return (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '+' }) >= 0 {
		return fmt.Errorf("bad signal name %q", text.Clean(r.Signal, 32))
	}
	return nil
}

func validFileInfo(fi *FileInfo) error {
	switch fi.Type {
	case "file", "dir", "symlink", "other":
	default:
		return fmt.Errorf("unknown file type %q", text.Clean(fi.Type, 32))
	}
	if fi.Size < 0 {
		return errors.New("negative size")
	}
	return nil
}

// frameReader reads a streamed exec's frames, one line each, never more than a frame's bound.
type frameReader struct {
	br    *bufio.Reader
	limit int64 // the result frame's bound, the largest a frame may be
	line  []byte
}

func newFrameReader(body io.Reader, maxOut int64) *frameReader {
	return &frameReader{br: bufio.NewReaderSize(body, 64<<10), limit: maxExecReply(maxOut)}
}

// errEndOfStream is a stream that ended cleanly between frames.
var errEndOfStream = errors.New("end of stream")

// next returns the next frame. A stream that ends between frames is errEndOfStream; one that
// ends inside a frame, or breaks, is SANDBOX_NOT_RUNNING; a frame past its bound or not one of
// the protocol's kinds is INTERNAL.
func (fr *frameReader) next() (Frame, error) {
	line, err := fr.readLine()
	if err != nil {
		return Frame{}, err
	}
	var f Frame
	if err := json.Unmarshal(line, &f); err != nil {
		return Frame{}, agent.Malformed("exec", err)
	}
	if err := validFrame(&f, int64(len(line))); err != nil {
		return Frame{}, err
	}
	return f, nil
}

// readLine reads one line of at most limit bytes (newline excluded).
func (fr *frameReader) readLine() ([]byte, error) {
	fr.line = fr.line[:0]
	for {
		chunk, err := fr.br.ReadSlice('\n')
		if int64(len(fr.line)+len(chunk)) > fr.limit+1 {
			return nil, agent.Oversized("exec (one frame)", fr.limit)
		}
		switch {
		case err == nil && len(fr.line) == 0:
			return chunk[:len(chunk)-1], nil // the common case: no copy
		case err == nil:
			fr.line = append(fr.line, chunk...)
			return fr.line[:len(fr.line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			fr.line = append(fr.line, chunk...)
		case errors.Is(err, io.EOF) && len(fr.line)+len(chunk) == 0:
			return nil, errEndOfStream
		default:
			return nil, errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent broke off the stream of exec inside a frame (the sandbox may have stopped)")
		}
	}
}

// validFrame checks that f is exactly one of the protocol's frames, within its bound.
func validFrame(f *Frame, size int64) error {
	kinds := 0
	for _, set := range []bool{f.Stream != "" || f.Data != nil, f.Result != nil, f.Error != nil} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return agent.Malformed("exec", errors.New("a frame must be output, a result or an error"))
	}
	switch {
	case f.Result != nil:
		if err := validExecResult(f.Result); err != nil {
			return agent.Malformed("exec", err)
		}
	case f.Error != nil:
	case size > maxOutputFrame || len(f.Data) > MaxFrameData:
		return agent.Oversized("exec (one output frame)", maxOutputFrame)
	case f.Stream != "stdout" && f.Stream != "stderr":
		return agent.Malformed("exec", fmt.Errorf("unknown stream %q", text.Clean(f.Stream, 32)))
	}
	return nil
}

// decodeDirList decodes a listing entry by entry: at most MaxListEntries entries, each within
// maxFileInfoReply and all within maxListDecoded once decoded, so the reply is never buffered
// whole.
func decodeDirList(body io.Reader) (DirList, error) {
	const what = "list"
	br := &budgetReader{r: body}
	dec := json.NewDecoder(br)
	br.dec = dec
	var dl DirList
	err := decodeObject(dec, br, func(key string) error {
		switch key {
		case "path":
			return dec.Decode(&dl.Path)
		case "truncated":
			return dec.Decode(&dl.Truncated)
		case "total":
			return dec.Decode(&dl.Total)
		case "entries":
			return decodeEntries(dec, br, &dl)
		}
		var skip json.RawMessage
		return dec.Decode(&skip)
	})
	if err == nil {
		_, err = dec.Token()
		if errors.Is(err, io.EOF) {
			err = nil
		} else if err == nil {
			err = errors.New("data after the listing")
		}
	}
	if err == nil && (dl.Total < len(dl.Entries) || dl.Truncated != (dl.Total > len(dl.Entries))) {
		err = fmt.Errorf("total %d does not match %d entries (truncated %v)", dl.Total, len(dl.Entries), dl.Truncated)
	}
	switch {
	case err == nil:
		return dl, nil
	case errors.Is(err, errOverBudget):
		return DirList{}, agent.Oversized(what, br.budget)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return DirList{}, errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent broke off its reply to %s (the sandbox may have stopped)", what)
	}
	if e, ok := errcode.As(err); ok {
		return DirList{}, e
	}
	return DirList{}, agent.Malformed(what, err)
}

// decodeObject walks one JSON object, calling field for each key with the decoder at its
// value; each key and value is read within maxFileInfoReply.
func decodeObject(dec *json.Decoder, br *budgetReader, field func(key string) error) error {
	br.allow(maxFileInfoReply)
	if err := wantDelim(dec, '{'); err != nil {
		return err
	}
	for dec.More() {
		br.allow(maxFileInfoReply)
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		if err := field(key); err != nil {
			return err
		}
	}
	br.allow(maxFileInfoReply)
	return wantDelim(dec, '}')
}

func decodeEntries(dec *json.Decoder, br *budgetReader, dl *DirList) error {
	tok, err := dec.Token()
	if err != nil || tok == nil {
		return err // null: no entries
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return fmt.Errorf("entries is %v, not an array", tok)
	}
	var text int64
	for dec.More() {
		if len(dl.Entries) == MaxListEntries {
			return fmt.Errorf("more than %d entries", MaxListEntries)
		}
		br.allow(maxFileInfoReply)
		var fi FileInfo
		if err := dec.Decode(&fi); err != nil {
			return err
		}
		if err := validFileInfo(&fi); err != nil {
			return err
		}
		if text += int64(len(fi.Path) + len(fi.Name) + len(fi.LinkTarget) + len(fi.Type) + len(fi.Mode)); text > maxListDecoded {
			br.budget = maxListDecoded
			return errOverBudget
		}
		dl.Entries = append(dl.Entries, fi)
	}
	return wantDelim(dec, ']')
}

func wantDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("expected %q, got %v", want, tok)
	}
	return nil
}

// errOverBudget is a JSON value larger than its budget.
var errOverBudget = errors.New("value over budget")

// budgetReader lets a json.Decoder read at most budget bytes past the value it is at.
type budgetReader struct {
	r      io.Reader
	dec    *json.Decoder
	read   int64
	limit  int64
	budget int64
}

// allow lets the next value take up to n bytes (and a little for separators and whitespace).
func (b *budgetReader) allow(n int64) {
	b.budget = n
	b.limit = b.dec.InputOffset() + n + 64
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.read >= b.limit {
		return 0, errOverBudget
	}
	if int64(len(p)) > b.limit-b.read {
		p = p[:b.limit-b.read]
	}
	n, err := b.r.Read(p)
	b.read += int64(n)
	return n, err
}

// fileRange checks a read's reply against the range asked for and returns a body that yields
// exactly that range: offset, then length bytes (0 = to the end), refused past limit.
func fileRange(resp *http.Response, offset, length, limit int64) (io.ReadCloser, int64, error) {
	size, err := strconv.ParseInt(resp.Header.Get(SizeHeader), 10, 64)
	if err != nil || size < 0 {
		return nil, 0, agent.Malformed("read", fmt.Errorf("bad %s header %q", SizeHeader, text.Clean(resp.Header.Get(SizeHeader), 32)))
	}
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	var n int64
	if offset < size {
		n = size - offset
		if length > 0 {
			n = min(n, length)
		}
	}
	switch {
	case n > limit:
		return nil, 0, agent.Malformed("read", fmt.Errorf("a range of %d bytes past the limit of %d", n, limit))
	case resp.ContentLength >= 0 && resp.ContentLength != n:
		return nil, 0, agent.Malformed("read", fmt.Errorf("%d bytes of content for a range of %d", resp.ContentLength, n))
	}
	return &rangeBody{body: resp.Body, size: n, left: n}, size, nil
}

// rangeBody yields exactly left bytes of body: fewer is a broken reply, more an oversized one.
type rangeBody struct {
	body io.ReadCloser
	size int64 // of the range
	left int64
}

func (r *rangeBody) Read(p []byte) (int, error) {
	if r.left == 0 {
		// Look for the end, so that a complete reply leaves the connection reusable.
		var one [1]byte
		n, err := r.body.Read(one[:])
		switch {
		case n > 0:
			return 0, agent.Oversized("read (more than the range asked for)", r.size)
		case err != nil && !errors.Is(err, io.EOF):
			return 0, err
		}
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := r.body.Read(p)
	r.left -= int64(n)
	if (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) && r.left > 0 {
		err = errcode.Wrap(errcode.SandboxNotRunning, io.ErrUnexpectedEOF, "the sandbox's agent broke off a file read with %d bytes to go (the file shrank, or the sandbox stopped)", r.left)
	} else if errors.Is(err, io.EOF) {
		err = nil
	}
	return n, err
}

func (r *rangeBody) Close() error { return r.body.Close() }

func compactErr(b []byte) string { return text.Clean(string(bytes.TrimSpace(b)), peerreply.MaxMessage) }
