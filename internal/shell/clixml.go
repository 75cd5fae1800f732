package shell

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"unicode/utf16"
)

// clixmlNS is the namespace of PowerShell's serialization format (MS-PSRP 2.2.5).
const clixmlNS = "http://schemas.microsoft.com/powershell/2004/04"

var clixmlHeader = []byte("#< CLIXML")

// errNotCLIXML: the input is not exactly PowerShell's framing.
var errNotCLIXML = errors.New("not CLIXML")

// DecodeCLIXML turns PowerShell's CLIXML stderr framing (what powershell.exe and pwsh write
// when their stderr is not a console: "#< CLIXML", then an <Objs> document of <S S="Error">
// strings and <Obj S="progress"> records) back into the text a console would have shown: the
// error lines as written, warnings, verbose and debug lines prefixed like the console prefixes
// them, progress records dropped, _xHHHH_ escapes decoded. Anything that is not exactly that
// framing (plain text, text around the framing, a cut-off document, an element or namespace
// PowerShell does not write) comes back verbatim, and ok is false.
func DecodeCLIXML(stderr []byte) (text []byte, ok bool) {
	out, err := decodeCLIXML(stderr)
	if err != nil {
		return stderr, false
	}
	return out, true
}

func decodeCLIXML(in []byte) ([]byte, error) {
	var out bytes.Buffer
	rest := in
	blocks := 0
	for {
		rest = bytes.TrimLeft(rest, "\r\n")
		if len(rest) == 0 {
			if blocks == 0 {
				return nil, errNotCLIXML
			}
			return out.Bytes(), nil
		}
		if !bytes.HasPrefix(rest, clixmlHeader) {
			return nil, errNotCLIXML
		}
		rest = rest[len(clixmlHeader):]
		switch {
		case bytes.HasPrefix(rest, []byte("\r\n")):
			rest = rest[2:]
		case bytes.HasPrefix(rest, []byte("\n")):
			rest = rest[1:]
		default:
			return nil, errNotCLIXML
		}
		n, err := decodeObjs(rest, &out)
		if err != nil {
			return nil, err
		}
		rest = rest[n:]
		blocks++
	}
}

// decodeObjs decodes one <Objs> document at the start of in into out and returns how many
// bytes of in it took.
func decodeObjs(in []byte, out *bytes.Buffer) (int, error) {
	d := xml.NewDecoder(bytes.NewReader(in))
	d.Strict = true
	start, err := d.Token()
	if err != nil {
		return 0, errNotCLIXML
	}
	se, isStart := start.(xml.StartElement)
	if !isStart || se.Name.Space != clixmlNS || se.Name.Local != "Objs" || attr(se, "Version") == "" {
		return 0, errNotCLIXML
	}
	for {
		tok, err := d.Token()
		if err != nil {
			return 0, errNotCLIXML
		}
		switch t := tok.(type) {
		case xml.EndElement: // </Objs>: Strict has checked it matches
			return int(d.InputOffset()), nil
		case xml.CharData:
			if len(bytes.TrimSpace(t)) != 0 {
				return 0, errNotCLIXML
			}
		case xml.StartElement:
			if t.Name.Space != clixmlNS {
				return 0, errNotCLIXML
			}
			switch t.Name.Local {
			case "Obj": // progress and other records: not text a console shows on stderr
				if err := d.Skip(); err != nil {
					return 0, errNotCLIXML
				}
			case "S":
				s, err := stringElement(d)
				if err != nil {
					return 0, err
				}
				prefix, known := streamPrefix[strings.ToLower(attr(t, "S"))]
				if !known {
					return 0, errNotCLIXML
				}
				s = unescapeCLIXML(s)
				if prefix != "" {
					s = prefix + s
					if !strings.HasSuffix(s, "\n") {
						s += "\r\n"
					}
				}
				out.WriteString(s)
			default:
				return 0, errNotCLIXML
			}
		default: // comments, processing instructions, directives: PowerShell writes none
			return 0, errNotCLIXML
		}
	}
}

// streamPrefix is what a console writes before a line of each stream PowerShell frames.
var streamPrefix = map[string]string{"error": "", "information": "", "warning": "WARNING: ", "verbose": "VERBOSE: ", "debug": "DEBUG: "}

// stringElement reads the text of an <S> whose start was just read, up to its end.
func stringElement(d *xml.Decoder) (string, error) {
	var sb strings.Builder
	for {
		tok, err := d.Token()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return "", errNotCLIXML
			}
			return "", errNotCLIXML
		}
		switch t := tok.(type) {
		case xml.CharData:
			sb.Write(t)
		case xml.EndElement:
			return sb.String(), nil
		default:
			return "", errNotCLIXML
		}
	}
}

func attr(se xml.StartElement, name string) string {
	for _, a := range se.Attr {
		if a.Name.Space == "" && a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// unescapeCLIXML decodes PowerShell's _xHHHH_ escapes (UTF-16 code units, surrogate pairs as
// two escapes; _x005F_ is a literal underscore).
func unescapeCLIXML(s string) string {
	if !strings.Contains(s, "_x") {
		return s
	}
	var sb strings.Builder
	var units []uint16
	flush := func() {
		if len(units) > 0 {
			sb.WriteString(string(utf16.Decode(units)))
			units = units[:0]
		}
	}
	for i := 0; i < len(s); {
		if u, ok := escapeAt(s, i); ok {
			units = append(units, u)
			i += 7
			continue
		}
		flush()
		sb.WriteByte(s[i])
		i++
	}
	flush()
	return sb.String()
}

// escapeAt reports whether s[i:] starts with _xHHHH_ and the code unit it stands for.
func escapeAt(s string, i int) (uint16, bool) {
	if i+7 > len(s) || s[i] != '_' || s[i+1] != 'x' || s[i+6] != '_' {
		return 0, false
	}
	var u uint16
	for _, c := range []byte(s[i+2 : i+6]) {
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, false
		}
		u = u<<4 | uint16(v)
	}
	return u, true
}
