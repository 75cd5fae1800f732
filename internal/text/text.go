// Package text shortens and cleans strings for display without breaking them: cuts land on
// character (rune) boundaries, so the result is valid UTF-8 whenever the input was (Postgres, JSON
// encoders and terminals all reject or mangle half a character), and Clean makes text that came
// from outside (an agent in a sandbox, a joined machine) safe to show on one line.
//
// It imports only the standard library, so every package may use it, the machine agent's
// (built for Linux, macOS and Windows) included.
package text

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Ellipsis marks a cut.
const Ellipsis = "…"

// Cut returns the longest prefix of s of at most n bytes that ends on a rune boundary.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Truncate returns s if it is at most n bytes long, else its first n bytes, cut back to a rune
// boundary, followed by Ellipsis (so the result may be up to len(Ellipsis) bytes longer than n).
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Cut(s, n) + Ellipsis
}

// TruncateNoting is Truncate that also says how long s was: its first n bytes, cut back to a rune
// boundary, then "…(N bytes)" (for records where the size of what was left out matters).
func TruncateNoting(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Cut(s, n) + Ellipsis + "(" + strconv.Itoa(len(s)) + " bytes)"
}

// Clean makes s safe to show as one line and returns at most max bytes of it: invalid UTF-8
// becomes U+FFFD; line breaks and tabs become spaces; ANSI escape sequences (CSI, OSC and the
// other ESC sequences, 7- and 8-bit), other control characters and format characters (category
// Cf: the bidi embeddings, overrides and isolates U+202A–U+202E and U+2066–U+2069, the marks
// U+200E, U+200F and U+061C, zero-width characters) are dropped; a cut ends with Ellipsis, the
// whole within max bytes.
func Clean(s string, max int) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:]) // an invalid byte reads as U+FFFD, size 1
		if r == 0x1b || r == 0x9b || r == 0x9d || r == 0x90 || r == 0x9e || r == 0x9f {
			i += escapeLen(s[i:])
			continue
		}
		i += size
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			r = ' '
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			continue
		}
		if b.Len()+utf8.RuneLen(r) > max {
			return Cut(b.String(), max-len(Ellipsis)) + Ellipsis
		}
		b.WriteRune(r)
	}
	return b.String()
}

// escapeLen is the length of the escape sequence s starts with (s[0] is ESC, or the start of an
// 8-bit CSI, OSC, DCS, PM or APC): ESC [ (or CSI) parameters, intermediates and a final byte;
// ESC ] / P / ^ / _ (or OSC, DCS, PM, APC) a string ended by BEL or ST (ESC \ or U+009C);
// ESC and one more character otherwise. An unended sequence runs to the end of s.
func escapeLen(s string) int {
	first, n := utf8.DecodeRuneInString(s)
	kind := first
	if first == 0x1b {
		if len(s) == n {
			return n
		}
		next, m := utf8.DecodeRuneInString(s[n:])
		n += m
		switch next {
		case '[':
			kind = 0x9b
		case ']':
			kind = 0x9d
		case 'P', '^', '_':
			kind = 0x90
		default:
			return n // a two-character sequence (ESC c, ESC 7, ESC ( B's first half…)
		}
	}
	if kind == 0x9b { // CSI: parameter bytes 0x30–0x3F, intermediates 0x20–0x2F, final 0x40–0x7E
		for n < len(s) {
			c := s[n]
			n++
			if c >= 0x40 && c <= 0x7e {
				return n
			}
			if c < 0x20 || c > 0x3f {
				return n - 1 // not a CSI byte: the sequence was broken; keep what follows
			}
		}
		return n
	}
	// A control string (OSC, DCS, PM, APC): up to BEL or ST.
	for n < len(s) {
		r, m := utf8.DecodeRuneInString(s[n:])
		n += m
		switch {
		case r == 0x07 || r == 0x9c:
			return n
		case r == 0x1b && n < len(s) && s[n] == '\\':
			return n + 1
		}
	}
	return n
}
