package mitm

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// A response from an intercepted host could carry a secret's value back (an echo endpoint, a
// debug or error page): the scrubber replaces every occurrence of each value with its
// placeholder before the response reaches the sandbox, in the status line, the headers, the
// trailers and the body (decoded first when it is compressed).

// scrubPair is one value to take out of responses and the placeholder that stands for it.
type scrubPair struct {
	secret      int // index into the target's secrets
	value       []byte
	placeholder []byte
	fail        []int // KMP failure function of value (for the held-back tail)
	anchor      int   // index of value's byte searched for first: the one likely rarest in a body
}

// scrubber replaces values with placeholders and counts the replacements per pair.
type scrubber struct {
	pairs  []scrubPair
	counts []int64
}

// newScrubber returns a scrubber for pairs (empty values and duplicates dropped), or nil
// when there is nothing to scrub.
func newScrubber(pairs []scrubPair) *scrubber {
	var kept []scrubPair
	for _, p := range pairs {
		if len(p.value) == 0 {
			continue
		}
		dup := false
		for _, k := range kept {
			dup = dup || bytes.Equal(k.value, p.value)
		}
		if dup {
			continue
		}
		p.fail = kmpFailure(p.value)
		p.anchor = rarest(p.value)
		kept = append(kept, p)
	}
	if len(kept) == 0 {
		return nil
	}
	return &scrubber{pairs: kept, counts: make([]int64, len(kept))}
}

// kmpFailure is v's prefix function: f[i] is the length of the longest proper prefix of
// v[:i+1] that is also its suffix.
func kmpFailure(v []byte) []int {
	f := make([]int, len(v))
	for i, k := 1, 0; i < len(v); i++ {
		for k > 0 && v[i] != v[k] {
			k = f[k-1]
		}
		if v[i] == v[k] {
			k++
		}
		f[i] = k
	}
	return f
}

// rarest returns the index of v's byte likely least frequent in a response body (text is
// mostly lower-case letters, spaces and a few punctuation marks; a key's upper-case letters
// and digits are rarer), so the search wakes up at as few false candidates as it can.
func rarest(v []byte) int {
	rank := func(c byte) int {
		switch {
		case strings.IndexByte(" etaoinshrdlu", c) >= 0:
			return 5
		case c >= 'a' && c <= 'z':
			return 4
		case strings.IndexByte("\",:./-_={}<>", c) >= 0:
			return 3
		case c >= '0' && c <= '9' || c >= 'A' && c <= 'Z':
			return 2
		default:
			return 1
		}
	}
	best := 0
	for i := range v {
		if rank(v[i]) < rank(v[best]) {
			best = i
		}
	}
	return best
}

// index returns the first position of p's value in b, or -1: the anchor byte is found with
// bytes.IndexByte (vectorised) and each candidate checked whole; after many false candidates
// (a body full of the anchor byte) bytes.Index takes over for the rest.
func (p *scrubPair) index(b []byte) int {
	v, j := p.value, p.anchor
	n := len(v)
	c := v[j]
	fails := 0
	for i := 0; len(b)-i >= n; {
		k := bytes.IndexByte(b[i+j:len(b)-n+j+1], c)
		if k < 0 {
			return -1
		}
		start := i + k
		if bytes.Equal(b[start:start+n], v) {
			return start
		}
		i = start + 1
		if fails++; fails > 8+i>>6 {
			if r := bytes.Index(b[i:], v); r >= 0 {
				return i + r
			}
			return -1
		}
	}
	return -1
}

// next returns the leftmost match in b at or after from (the longest value on a tie): its
// position and pair, or -1.
func (s *scrubber) next(b []byte, from int) (pos, pair int) {
	pos, pair = -1, -1
	for k := range s.pairs {
		v := s.pairs[k].value
		i := s.pairs[k].index(b[from:])
		if i < 0 {
			continue
		}
		i += from
		if pos < 0 || i < pos || i == pos && len(v) > len(s.pairs[pair].value) {
			pos, pair = i, k
		}
	}
	return pos, pair
}

// appendScrubbed appends b[from:] with every value replaced to dst, taking only matches that
// start before limit (len(b): all); it returns dst and the offset in b after the last
// replacement (from when none): the bytes from there on are not in dst.
func (s *scrubber) appendScrubbed(dst, b []byte, from, limit int) ([]byte, int) {
	i := from
	for {
		pos, k := s.next(b, i)
		if pos < 0 || pos >= limit {
			return dst, i
		}
		dst = append(dst, b[i:pos]...)
		dst = append(dst, s.pairs[k].placeholder...)
		s.counts[k]++
		i = pos + len(s.pairs[k].value)
	}
}

// String returns v scrubbed.
func (s *scrubber) String(v string) string {
	if s == nil {
		return v
	}
	found := false
	for _, p := range s.pairs {
		found = found || strings.Contains(v, string(p.value))
	}
	if !found {
		return v
	}
	out, i := s.appendScrubbed(nil, []byte(v), 0, len(v))
	return string(append(out, v[i:]...))
}

// held is how many bytes at the end of b could be the start of a value that later bytes
// complete: the longest suffix of b that is a proper prefix of any value, found with each
// value's prefix function over at most its length - 1 last bytes.
func (s *scrubber) held(b []byte) int {
	h := 0
	for _, p := range s.pairs {
		w := b[max(0, len(b)-(len(p.value)-1)):]
		if len(w) <= h {
			continue
		}
		k := 0
		for _, c := range w {
			for k > 0 && c != p.value[k] {
				k = p.fail[k-1]
			}
			if c == p.value[k] {
				k++
			}
			if k == len(p.value) { // a whole value: not a proper prefix, look for a shorter one
				k = p.fail[k-1]
			}
		}
		h = max(h, k)
	}
	return h
}

// scrubWriter scrubs a stream on its way to w. It holds back only the bytes at the end of
// what it was given that could begin a value (at most the longest value's length - 1), so
// memory is bounded whatever the body's length and a streamed body (server-sent events)
// still flows: bytes that cannot start a value go out at once.
type scrubWriter struct {
	s    *scrubber
	w    io.Writer
	pend []byte // held-back tail
	out  []byte // reused output buffer
}

func (sw *scrubWriter) Write(p []byte) (int, error) {
	b := p
	if len(sw.pend) > 0 {
		sw.pend = append(sw.pend, p...)
		b = sw.pend
	}
	// A match is taken only if it starts before the held tail (the longest suffix that could
	// begin a value): a value starting there that later bytes complete would be the leftmost
	// match. When a replacement runs over that tail, what could still grow starts after it:
	// the tail is found again from there.
	out, i := sw.out[:0], 0
	keepFrom := 0
	for {
		keepFrom = len(b) - sw.s.held(b[i:])
		var j int
		out, j = sw.s.appendScrubbed(out, b, i, keepFrom)
		if j <= keepFrom {
			i = j
			break
		}
		i = j
	}
	if i == 0 && len(sw.pend) == 0 {
		// nothing replaced: write straight from p (the common case, no copy)
		if keepFrom > 0 {
			if _, err := sw.w.Write(b[:keepFrom]); err != nil {
				return 0, err
			}
		}
		sw.pend = append(sw.pend, b[keepFrom:]...)
		return len(p), nil
	}
	out = append(out, b[i:keepFrom]...)
	sw.out = out
	// b may alias pend: move the tail to its front before writing (write does not touch pend).
	sw.pend = append(sw.pend[:0], b[keepFrom:]...)
	if len(out) > 0 {
		if _, err := sw.w.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Close writes what is held back, scrubbed as the stream's end (no value can grow further).
func (sw *scrubWriter) Close() error {
	if len(sw.pend) == 0 {
		return nil
	}
	out, i := sw.s.appendScrubbed(sw.out[:0], sw.pend, 0, len(sw.pend))
	out = append(out, sw.pend[i:]...)
	sw.pend = sw.pend[:0]
	_, err := sw.w.Write(out)
	return err
}

// Content codings the scrubber can read. A request's Accept-Encoding is narrowed to these
// (so upstream answers in one of them), and a response in any other coding is refused.
var decodable = []string{"gzip", "deflate", "zstd"}

// narrowAcceptEncoding returns the Accept-Encoding to send upstream in place of the
// sandbox's vals: the codings it named that the scrubber decodes (q-values kept), or
// "identity" when none is left. A request that named none keeps none.
func narrowAcceptEncoding(vals []string) (string, bool) {
	if len(vals) == 0 {
		return "", false
	}
	var keep []string
	for _, v := range vals {
		for _, part := range strings.Split(v, ",") {
			part = strings.TrimSpace(part)
			name, _, _ := strings.Cut(part, ";")
			name = strings.ToLower(strings.TrimSpace(name))
			switch name {
			case "gzip", "x-gzip", "deflate", "zstd", "identity":
				keep = append(keep, part)
			}
		}
	}
	if len(keep) == 0 {
		return "identity", true
	}
	return strings.Join(keep, ", "), true
}

// maxCodings bounds how many content codings one response may stack.
const maxCodings = 2

// decoder returns a reader of body decoded from the content codings listed in ce (in the
// order they were applied), or an error naming the first coding it cannot decode.
func decoder(body io.Reader, ce []string) (io.Reader, func(), error) {
	var codings []string
	for _, v := range ce {
		for _, c := range strings.Split(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	if len(codings) > maxCodings {
		return nil, nil, fmt.Errorf("%d content codings stacked (at most %d)", len(codings), maxCodings)
	}
	r := body
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for i := len(codings) - 1; i >= 0; i-- {
		switch codings[i] {
		case "gzip", "x-gzip":
			r = &lazyReader{open: func(src io.Reader) (io.Reader, error) { return gzip.NewReader(src) }, src: r}
		case "deflate":
			r = &lazyReader{open: openDeflate, src: r}
		case "zstd":
			d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(8<<20), zstd.WithDecoderLowmem(true))
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			closers = append(closers, d.Close)
			r = d
		default:
			closeAll()
			return nil, nil, fmt.Errorf("content coding %q", codings[i])
		}
	}
	return r, closeAll, nil
}

// openDeflate reads HTTP's "deflate", which is zlib-wrapped (RFC 9110) though some servers
// send raw DEFLATE: the zlib header is checked first.
func openDeflate(src io.Reader) (io.Reader, error) {
	br := bufio.NewReader(src)
	h, err := br.Peek(2)
	if err == nil && h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
		return zlib.NewReader(br)
	}
	return flate.NewReader(br), nil
}

// lazyReader opens its decoder on the first Read, so an empty body (a compressed coding
// announced on a body of no bytes) reads as empty rather than failing on a missing header.
type lazyReader struct {
	open func(io.Reader) (io.Reader, error)
	src  io.Reader
	r    io.Reader
}

func (l *lazyReader) Read(p []byte) (int, error) {
	if l.r == nil {
		br := bufio.NewReader(l.src)
		if _, err := br.Peek(1); err != nil {
			return 0, err // io.EOF: no bytes at all
		}
		r, err := l.open(br)
		if err != nil {
			return 0, err
		}
		l.r = r
	}
	return l.r.Read(p)
}
