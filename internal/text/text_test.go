package text

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncateMultibyte(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"hello", 10, "hello"},
		{"hello", 5, "hello"},
		{"hello", 3, "hel…"},
		{"", 0, ""},
		{"abc", 0, "…"},
		// é is 2 bytes: a cut inside it steps back before it.
		{"café au lait", 4, "caf…"},
		{"café au lait", 5, "café…"},
		// 日 and 本 are 3 bytes each.
		{"日本語", 4, "日…"},
		{"日本語", 5, "日…"},
		{"日本語", 6, "日本…"},
		{"日本語", 2, "…"},
		// 😀 is 4 bytes.
		{"a😀b", 2, "a…"},
		{"a😀b", 4, "a…"},
		{"a😀b", 5, "a😀…"},
	} {
		got := Truncate(tc.s, tc.n)
		if got != tc.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("Truncate(%q, %d) = %q is not valid UTF-8", tc.s, tc.n, got)
		}
	}
}

func TestTruncateNoting(t *testing.T) {
	if got := TruncateNoting("日本語", 4); got != "日…(9 bytes)" {
		t.Errorf("TruncateNoting = %q", got)
	}
	if got := TruncateNoting("short", 5); got != "short" {
		t.Errorf("TruncateNoting = %q", got)
	}
}

// TestTruncateEveryCut cuts multibyte text at every length: always valid UTF-8, never longer
// than n plus the ellipsis, and a prefix of the input.
func TestTruncateEveryCut(t *testing.T) {
	s := "é日本😀 naïve 🇫🇷 z"
	for n := 0; n <= len(s)+1; n++ {
		got := Truncate(s, n)
		if !utf8.ValidString(got) {
			t.Fatalf("Truncate(%q, %d) = %q is not valid UTF-8", s, n, got)
		}
		body := strings.TrimSuffix(got, Ellipsis)
		if len(body) > n || !strings.HasPrefix(s, body) {
			t.Fatalf("Truncate(%q, %d) = %q", s, n, got)
		}
		if c := Cut(s, n); c != body && n < len(s) {
			t.Fatalf("Cut(%q, %d) = %q, Truncate's body %q", s, n, c, body)
		}
	}
}

func TestClean(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"plain", "job done", "job done"},
		{"line breaks and tabs", "a\nb\r\nc\td", "a b  c d"},
		{"C0 controls", "a\x00b\x07c\x7fd", "abcd"},
		{"C1 controls", "a\u0085b", "ab"},
		{"ANSI colour", "\x1b[31mred\x1b[0m text", "red text"},
		{"ANSI cursor moves", "ok\x1b[2K\x1b[1A\x1b[?25lhidden", "okhidden"},
		{"8-bit CSI", "a\u009b31mb", "ab"},
		{"OSC title with BEL", "\x1b]0;pwned\x07after", "after"},
		{"OSC hyperlink with ST", "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\", "link"},
		{"two-character escape", "a\x1bcb", "ab"},
		{"lone ESC at the end", "abc\x1b", "abc"},
		{"bidi override", "user\u202Etxt.exe", "usertxt.exe"},
		{"bidi embeddings", "\u202Aa\u202Bb\u202Cc\u202Dd", "abcd"},
		{"bidi isolates", "\u2066a\u2067b\u2068c\u2069", "abc"},
		{"marks", "a\u200Eb\u200Fc\u061Cd", "abcd"},
		{"zero width", "a\u200Bb\uFEFFc", "abc"},
		{"invalid UTF-8", "a\xffb\xc3", "a\uFFFDb\uFFFD"},
		{"multibyte kept", "é日本😀", "é日本😀"},
	} {
		if got := Clean(tc.in, 1024); got != tc.want {
			t.Errorf("%s: Clean(%q) = %q, want %q", tc.name, tc.in, got, tc.want)
		}
	}
}

func TestCleanCut(t *testing.T) {
	s := "é日本😀 and more \x1b[31mtext\x1b[0m"
	for max := len(Ellipsis); max <= len(s)+1; max++ {
		got := Clean(s, max)
		if len(got) > max || !utf8.ValidString(got) {
			t.Fatalf("Clean(%q, %d) = %q (%d bytes)", s, max, got, len(got))
		}
	}
	if got := Clean("日本語", 7); got != "日…" {
		t.Errorf("Clean cut = %q, want 日…", got)
	}
}

func FuzzClean(f *testing.F) {
	f.Add("\x1b[31mred\u202E", 16)
	f.Fuzz(func(t *testing.T, s string, max int) {
		if max < len(Ellipsis) || max > 1<<16 {
			return
		}
		got := Clean(s, max)
		if len(got) > max || !utf8.ValidString(got) || strings.ContainsAny(got, "\x1b\n\r\t\u202E\u2066\u200F\u061C\u009b") {
			t.Fatalf("Clean(%q, %d) = %q", s, max, got)
		}
	})
}
