package mitm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// After an upgrade the bytes from a secret's host still reach the sandbox through the
// interceptor, so they are scrubbed too. A WebSocket (RFC 6455) is read frame by frame: each
// message's payload goes through the stream scrubber (a value split across its frames is
// caught; what could begin a value is held back only until the message's next frame or its
// end), the frames are written again with their new lengths — a long frame as several
// fragments of at most wsChunk bytes, which an intermediary may do when no extension is
// negotiated (RFC 6455 §5.4) — and control frames (close reasons, pings) are scrubbed whole.
// No extension may be negotiated (permessage-deflate would hide the payload): the request's
// Sec-WebSocket-Extensions is removed, and an upstream that answers with one, or sends a frame
// with a reserved bit set, is cut off. Any other upgraded protocol is an opaque stream,
// scrubbed as a close-delimited body is.

// wsChunk bounds what one data frame's scrubbing buffers.
const wsChunk = 32 << 10

// isWebSocket reports whether an upgrade request asks for a WebSocket.
func isWebSocket(h http.Header) bool {
	for _, v := range h.Values("Upgrade") {
		for _, p := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(p), "websocket") {
				return true
			}
		}
	}
	return false
}

// WebSocket opcodes.
const (
	wsContinuation = 0x0
	wsClose        = 0x8
	wsMaxControl   = 125
)

var errWSExtension = errors.New("the upstream WebSocket used an extension (a reserved bit is set): its frames cannot be scrubbed")

// wsScrubber copies WebSocket frames from r to w, scrubbing their payloads.
type wsScrubber struct {
	sc  *scrubber
	r   *bufio.Reader
	w   io.Writer
	buf []byte // what the current data frame's scrubbing produced
	sw  *scrubWriter
	// msgOpcode is the opcode of the message being relayed, sent is whether a frame of it went
	// out (the next ones are continuations).
	inMessage bool
	msgOpcode byte
	sent      bool
	hdr       [14]byte
	payload   []byte
	out       []byte
}

func newWSScrubber(sc *scrubber, r *bufio.Reader, w io.Writer) *wsScrubber {
	ws := &wsScrubber{sc: sc, r: r, w: w, payload: make([]byte, wsChunk)}
	ws.sw = &scrubWriter{s: sc, w: (*appendWriter)(&ws.buf)}
	return ws
}

// appendWriter appends what is written to a byte slice.
type appendWriter []byte

func (a *appendWriter) Write(p []byte) (int, error) {
	*a = append(*a, p...)
	return len(p), nil
}

// run relays frames until r ends or fails.
func (ws *wsScrubber) run() error {
	for {
		var h [2]byte
		if _, err := io.ReadFull(ws.r, h[:]); err != nil {
			return err
		}
		fin, rsv, opcode := h[0]&0x80 != 0, h[0]&0x70, h[0]&0x0f
		masked, n := h[1]&0x80 != 0, uint64(h[1]&0x7f)
		if rsv != 0 {
			return errWSExtension
		}
		switch n {
		case 126:
			var b [2]byte
			if _, err := io.ReadFull(ws.r, b[:]); err != nil {
				return err
			}
			n = uint64(binary.BigEndian.Uint16(b[:]))
		case 127:
			var b [8]byte
			if _, err := io.ReadFull(ws.r, b[:]); err != nil {
				return err
			}
			n = binary.BigEndian.Uint64(b[:])
			if n > 1<<62 {
				return fmt.Errorf("WebSocket frame of %d bytes", n)
			}
		}
		var mask [4]byte
		if masked { // a server must not mask; unmasked here, it is sent on unmasked
			if _, err := io.ReadFull(ws.r, mask[:]); err != nil {
				return err
			}
		}
		if opcode >= wsClose {
			if err := ws.control(opcode, n, masked, mask); err != nil {
				return err
			}
			continue
		}
		if opcode == wsContinuation {
			if !ws.inMessage {
				return errors.New("WebSocket continuation frame outside a message")
			}
		} else {
			if ws.inMessage {
				return errors.New("WebSocket data frame inside a fragmented message")
			}
			ws.inMessage, ws.msgOpcode, ws.sent = true, opcode, false
		}
		if err := ws.data(fin, n, masked, mask); err != nil {
			return err
		}
	}
}

// data relays one data frame's n bytes of payload, wsChunk at a time, each chunk scrubbed and
// sent as a fragment; the message's last frame also flushes what was held back.
func (ws *wsScrubber) data(fin bool, n uint64, masked bool, mask [4]byte) error {
	var off uint64
	for {
		k := min(n-off, uint64(len(ws.payload)))
		p := ws.payload[:k]
		if _, err := io.ReadFull(ws.r, p); err != nil {
			return err
		}
		if masked {
			for i := range p {
				p[i] ^= mask[(off+uint64(i))%4]
			}
		}
		off += k
		ws.buf = ws.buf[:0]
		if _, err := ws.sw.Write(p); err != nil {
			return err
		}
		last := off == n && fin
		if last {
			if err := ws.sw.Close(); err != nil {
				return err
			}
		}
		// An empty fragment in the middle carries nothing: skip it (the message's last one is
		// always sent).
		if len(ws.buf) > 0 || last {
			op := byte(wsContinuation)
			if !ws.sent {
				op = ws.msgOpcode
			}
			if err := ws.frame(last, op, ws.buf); err != nil {
				return err
			}
			ws.sent = true
		}
		if last {
			ws.inMessage = false
		}
		if off == n {
			return nil
		}
	}
}

// control relays a control frame (close, ping, pong) scrubbed whole; one that scrubbing made
// longer than a control frame may be is cut to fit.
func (ws *wsScrubber) control(opcode byte, n uint64, masked bool, mask [4]byte) error {
	if n > wsMaxControl {
		return fmt.Errorf("WebSocket control frame of %d bytes (at most %d)", n, wsMaxControl)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(ws.r, p); err != nil {
		return err
	}
	if masked {
		for i := range p {
			p[i] ^= mask[i%4]
		}
	}
	out, i := ws.sc.appendScrubbed(nil, p, 0, len(p))
	out = append(out, p[i:]...)
	if len(out) > wsMaxControl {
		out = out[:wsMaxControl]
	}
	return ws.frame(true, opcode, out)
}

// frame writes one unmasked frame.
func (ws *wsScrubber) frame(fin bool, opcode byte, p []byte) error {
	h := ws.hdr[:2]
	h[0] = opcode
	if fin {
		h[0] |= 0x80
	}
	switch n := len(p); {
	case n < 126:
		h[1] = byte(n)
	case n <= 0xffff:
		h[1] = 126
		h = binary.BigEndian.AppendUint16(h, uint16(n))
	default:
		h[1] = 127
		h = binary.BigEndian.AppendUint64(h, uint64(n))
	}
	ws.out = append(append(ws.out[:0], h...), p...) // one write: one TLS record
	_, err := ws.w.Write(ws.out)
	return err
}
