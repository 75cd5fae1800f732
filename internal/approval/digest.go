package approval

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Digest is the SHA-256 (lowercase hex) of the canonical form of one call: the JSON object
// {"arguments": args, "tool": tool}, canonicalised per RFC 8785 (JCS): object members sorted by
// the UTF-16 code units of their names, no insignificant whitespace, strings with only the
// escapes JSON requires (", \, and control characters: \b \t \n \f \r, else \u00xx), numbers
// in ECMAScript's shortest round-trip form (1.0 and 1e0 are both 1; 1e21 is 1e+21). Empty or
// null args are {}. Two calls have the same digest exactly when they are the same tool with the
// same arguments, whatever the order of their keys or their whitespace. Invalid UTF-8 in a
// string is replaced by U+FFFD (as encoding/json decodes it, and so as the tool sees it).
func Digest(tool string, args json.RawMessage) (string, error) {
	c, err := Canonical(tool, args)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

// Canonical returns the canonical JSON that Digest hashes.
func Canonical(tool string, args json.RawMessage) ([]byte, error) {
	var v any = map[string]any{}
	if t := bytes.TrimSpace(args); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		d := json.NewDecoder(bytes.NewReader(t))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			return nil, errcode.New(errcode.InvalidArgument, "arguments are not valid JSON: %v", err)
		}
		if d.More() {
			return nil, errcode.New(errcode.InvalidArgument, "arguments are not one JSON value")
		}
		if v == nil {
			v = map[string]any{}
		}
	}
	var b bytes.Buffer
	if err := writeCanonical(&b, map[string]any{"tool": tool, "arguments": v}); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeCanonical(b *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case string:
		writeString(b, x)
	case json.Number:
		s, err := canonicalNumber(string(x))
		if err != nil {
			return err
		}
		b.WriteString(s)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, compareUTF16)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, x[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("canonical JSON: unexpected %T", v)
	}
	return nil
}

// compareUTF16 orders strings by their UTF-16 code units (RFC 8785 §3.2.3).
func compareUTF16(a, b string) int {
	return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
}

func writeString(b *bytes.Buffer, s string) {
	const hexd = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s { // invalid UTF-8 yields U+FFFD
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\f':
			b.WriteString(`\f`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hexd[r>>4])
			b.WriteByte(hexd[r&0xf])
		default:
			var buf [utf8.UTFMax]byte
			n := utf8.EncodeRune(buf[:], r)
			b.Write(buf[:n])
		}
	}
	b.WriteByte('"')
}

// canonicalNumber is s in ECMAScript's Number.prototype.toString form (RFC 8785 §3.2.2.3).
func canonicalNumber(s string) (string, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return "", errcode.New(errcode.InvalidArgument, "number %s is outside the range of an IEEE-754 double", s)
	}
	if f == 0 {
		return "0", nil
	}
	if a := math.Abs(f); a >= 1e21 || a < 1e-6 {
		e := strconv.FormatFloat(f, 'e', -1, 64) // 1e+21, 1.5e-07
		mant, exp, _ := strings.Cut(e, "e")
		sign, digits := exp[:1], strings.TrimLeft(exp[1:], "0")
		return mant + "e" + sign + digits, nil
	}
	return strconv.FormatFloat(f, 'f', -1, 64), nil
}
