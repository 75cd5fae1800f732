package mitm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestScrubWebSocket: a WebSocket upgraded through the interceptor to a secret's host (a real
// WebSocket server, coder/websocket, offered compression by the client) gets every message
// from it scrubbed: a value split across the frames of a text message, one in a binary
// message over wsChunk straddling a chunk boundary, one in the close reason; what the sandbox
// sends still reaches the server, the value is never seen by the sandbox, and the scrubs are
// recorded.
func TestScrubWebSocket(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", echoValue)
	long := strings.Repeat("x", wsChunk-10) + echoValue + strings.Repeat("y", 3*wsChunk)
	e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionContextTakeover})
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		auth := r.Header.Get("Authorization")
		mw, err := c.Writer(ctx, websocket.MessageText)
		if err != nil {
			return
		}
		half := len("you sent: ") + len(auth)/2
		msg := "you sent: " + auth + " (twice: " + auth + ")"
		mw.Write([]byte(msg[:half])) // each Write is a frame of the message
		mw.Write([]byte(msg[half:]))
		mw.Close()
		c.Write(ctx, websocket.MessageBinary, []byte(long))
		for { // then echo, until the client says bye
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if string(b) == "bye" {
				c.Close(websocket.StatusNormalClosure, "bye "+echoValue)
				return
			}
			c.Write(ctx, typ, append([]byte("echo: "), b...))
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "wss://api.example.com/ws", &websocket.DialOptions{
		HTTPClient: e.client("api.example.com", nil), CompressionMode: websocket.CompressionContextTakeover,
		HTTPHeader: map[string][]string{"Authorization": {"Bearer " + phA}},
	})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.CloseNow()
	if ext := resp.Header.Get("Sec-WebSocket-Extensions"); ext != "" {
		t.Fatalf("an extension was negotiated through the interceptor: %s", ext)
	}
	c.SetReadLimit(1 << 20)
	read := func() string {
		t.Helper()
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return string(b)
	}
	if got, want := read(), "you sent: Bearer "+phA+" (twice: Bearer "+phA+")"; got != want {
		t.Fatalf("text message %q, want %q", got, want)
	}
	if got, want := read(), strings.Replace(long, echoValue, phA, 1); got != want {
		t.Fatalf("binary message of %d bytes is not the scrubbed one (%d bytes; value there: %v)", len(got), len(want), strings.Contains(got, echoValue))
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "echo: ping" {
		t.Fatalf("echo %q", got)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("bye")); err != nil {
		t.Fatal(err)
	}
	_, _, err = c.Read(ctx)
	if ce := (websocket.CloseError{}); !errors.As(err, &ce) || ce.Reason != "bye "+phA {
		t.Fatalf("close: %v, want the reason scrubbed", err)
	}
	calls := e.waitScrubbed(t, map[string]int64{"OPENAI_API_KEY": 4})
	e.assertNoValue(t, calls, echoValue)
}

// wsFrame encodes one frame (masked when mask is not nil).
func wsFrame(fin bool, op byte, p []byte, mask []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	out := []byte{b0}
	var m byte
	if mask != nil {
		m = 0x80
	}
	switch {
	case len(p) < 126:
		out = append(out, m|byte(len(p)))
	default:
		out = append(out, m|126, byte(len(p)>>8), byte(len(p)))
	}
	if mask != nil {
		out = append(out, mask...)
		q := make([]byte, len(p))
		for i := range p {
			q[i] = p[i] ^ mask[i%4]
		}
		p = q
	}
	return append(out, p...)
}

// TestWSScrubberFrames: a value split over three fragments with a ping between them (and the
// ping carrying the value too), a masked frame, and a frame with a reserved bit (an
// extension) that ends the relay.
func TestWSScrubberFrames(t *testing.T) {
	sc := newScrubber([]scrubPair{{value: []byte("SECRETVALUE"), placeholder: []byte("<ph>")}})
	var in bytes.Buffer
	in.Write(wsFrame(false, 1, []byte("a SECR"), nil))
	in.Write(wsFrame(true, 9, []byte("ping SECRETVALUE"), nil))
	in.Write(wsFrame(false, 0, []byte("ETVA"), nil))
	in.Write(wsFrame(true, 0, []byte("LUE b"), nil))
	in.Write(wsFrame(true, 2, []byte("masked SECRETVALUE"), []byte{1, 2, 3, 4}))
	in.Write([]byte{0x80 | 0x40 | 1, 0}) // RSV1: compressed
	var out bytes.Buffer
	err := newWSScrubber(sc, bufio.NewReader(&in), &out).run()
	if !errors.Is(err, errWSExtension) {
		t.Fatalf("run: %v, want the extension refused", err)
	}
	// Read back what went out: message payloads by opcode, in order.
	var got []string
	var msg []byte
	r := bufio.NewReader(&out)
	for {
		h := make([]byte, 2)
		if _, err := io.ReadFull(r, h); err != nil {
			break
		}
		if h[1]&0x80 != 0 {
			t.Fatal("a frame to the sandbox is masked")
		}
		n := int(h[1] & 0x7f)
		p := make([]byte, n)
		io.ReadFull(r, p)
		op := h[0] & 0x0f
		if op >= 8 {
			got = append(got, fmt.Sprintf("ctl%d:%s", op, p))
			continue
		}
		msg = append(msg, p...)
		if h[0]&0x80 != 0 {
			got = append(got, string(msg))
			msg = nil
		}
	}
	want := []string{"ctl9:ping <ph>", "a <ph> b", "masked <ph>"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("relayed %q, want %q", got, want)
	}
	if sc.counts[0] != 3 {
		t.Fatalf("counted %d scrubs, want 3", sc.counts[0])
	}
}
