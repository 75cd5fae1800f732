package mcpserver

import (
	"strings"
	"testing"
)

func TestProgressKeepsRunesWhole(t *testing.T) {
	var msgs []string
	var last int64
	p := &progress{notify: func(msg string, sent int64) {
		if sent <= last {
			t.Fatalf("progress %d after %d", sent, last)
		}
		last = sent
		msgs = append(msgs, msg)
	}}
	// "é" is 0xC3 0xA9 and "€" is 0xE2 0x82 0xAC: split them across chunks.
	p.output("stdout", []byte("caf\xc3"))
	p.output("stderr", []byte("err\xe2\x82"))
	p.output("stdout", []byte("\xa9 ok\n"))
	p.output("stderr", []byte("\xac\n"))
	p.output("stdout", []byte("tail\xc3")) // cut off for good: flushed at the end
	p.finish()
	want := []string{"caf", "err", "é ok\n", "€\n", "tail", "\uFFFD"}
	if strings.Join(msgs, "|") != strings.Join(want, "|") {
		t.Fatalf("messages %q, want %q", msgs, want)
	}
	if last != int64(len("café ok\nerr€\ntail\xc3")) {
		t.Fatalf("progress %d", last)
	}
}

func TestProgressIsBounded(t *testing.T) {
	n := 0
	var lastMsg string
	p := &progress{notify: func(msg string, sent int64) { n++; lastMsg = msg }}
	chunk := []byte(strings.Repeat("x", 1<<20))
	for range 40 {
		p.output("stdout", chunk)
	}
	p.finish()
	if n != MaxProgressBytes>>20+1 || !strings.Contains(lastMsg, "not streamed") {
		t.Fatalf("%d notifications, last %q", n, lastMsg)
	}
}

func TestAsText(t *testing.T) {
	for _, tc := range []struct {
		in    string
		atEOF bool
		want  string
		ok    bool
	}{
		{"hello\n", true, "hello\n", true},
		{"tab\tand\x1b[1mbold", true, "tab\tand\x1b[1mbold", true},
		{"nul\x00", true, "", false},
		{"bell\x07", true, "", false},
		{"caf\xc3", false, "caf", true}, // the page ends inside a rune
		{"caf\xc3", true, "", false},    // the file does
		{"\xff\xfe", false, "", false},
	} {
		got, ok := asText([]byte(tc.in), tc.atEOF)
		if got != tc.want || ok != tc.ok {
			t.Errorf("asText(%q, %v) = %q, %v", tc.in, tc.atEOF, got, ok)
		}
	}
}

func TestDecodeBase64(t *testing.T) {
	for _, in := range []string{"aGVsbG8=", "aGVsbG8", "aGVs\nbG8=\n"} {
		if b, err := decodeBase64(in); err != nil || string(b) != "hello" {
			t.Errorf("decodeBase64(%q) = %q, %v", in, b, err)
		}
	}
	if _, err := decodeBase64("%%%"); err == nil {
		t.Error("decodeBase64 accepted garbage")
	}
}
