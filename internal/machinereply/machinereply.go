// Package machinereply is the error half of the wire between the server and the HTTP handlers a
// joined machine's agent serves (remote exec, screenshots): the handler writes a typed error as
// {"error":{code,message,details}} with its HTTP status, and the server reads it back bounded,
// with only the codes the endpoint may return, its text cleaned and marked as the machine's
// words (details.origin = "machine_agent"): nothing a machine sends is trusted unchecked.
package machinereply

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
)

const (
	// Origin marks, in an error's details ("origin"), what a machine's agent said.
	Origin = "machine_agent"
	// MaxErrorBody bounds an error reply from a machine.
	MaxErrorBody = 64 << 10
	maxMessage   = 1024
	maxDetails   = 8
	maxDetailKey = 32
	maxDetailVal = 256
)

type body struct {
	Error struct {
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details,omitempty"`
	} `json:"error"`
}

// WriteError writes err as a typed error reply (untyped errors become INTERNAL with a generic
// message; their text stays on the machine).
func WriteError(w http.ResponseWriter, err error) {
	var b body
	b.Error.Code = string(errcode.Of(err))
	b.Error.Message = errcode.Message(err)
	if e, ok := errcode.As(err); ok {
		b.Error.Details = e.Details
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(errcode.HTTPStatus(errcode.Code(b.Error.Code)))
	_ = json.NewEncoder(w).Encode(b)
}

// ReadError turns a machine's non-2xx reply into the error the server passes on: one of
// allowed codes (any other is INTERNAL: an agent that is not ours, or broken), a bounded
// printable message and a few short scalar details, marked as the machine's.
func ReadError(resp *http.Response, what string, allowed ...errcode.Code) error {
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody+1))
	if err != nil {
		return errcode.Wrap(errcode.Internal, err, "the machine's reply to %s broke off: %s", what, CleanText(err.Error(), 200)).With("origin", Origin)
	}
	if len(raw) > MaxErrorBody {
		return errcode.New(errcode.Internal, "the machine sent an oversized error reply to %s (more than %d bytes)", what, MaxErrorBody).With("origin", Origin)
	}
	var b body
	if err := json.Unmarshal(raw, &b); err != nil || b.Error.Code == "" {
		return errcode.New(errcode.Internal, "the machine answered %s with HTTP %d and no typed error: %s", what, resp.StatusCode, CleanText(string(raw), 200)).With("origin", Origin)
	}
	msg := CleanText(b.Error.Message, maxMessage)
	if msg == "" {
		msg = "the machine's agent gave no message"
	}
	code := errcode.Code(b.Error.Code)
	if !slices.Contains(allowed, code) {
		return errcode.New(errcode.Internal, "the machine's agent returned an unexpected error code %q to %s (its message: %s)",
			CleanText(b.Error.Code, 64), what, CleanText(msg, 256)).With("origin", Origin)
	}
	e := &errcode.Error{Code: code, Message: msg, Details: cleanDetails(b.Error.Details)}
	return e.With("origin", Origin)
}

// Malformed is the error of a reply from a machine that is not what the protocol says.
func Malformed(what string, format string, args ...any) error {
	return errcode.New(errcode.Internal, "the machine's agent sent a malformed reply to %s: %s", what, CleanText(fmt.Sprintf(format, args...), 300)).With("origin", Origin)
}

func cleanDetails(in map[string]any) map[string]any {
	keys := make([]string, 0, len(in))
	for k := range in {
		if k != "" && len(k) <= maxDetailKey && k != "origin" && strings.IndexFunc(k, func(r rune) bool {
			return !(r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9')
		}) < 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	out := map[string]any{}
	for _, k := range keys {
		if len(out) == maxDetails {
			break
		}
		switch v := in[k].(type) {
		case string:
			out[k] = CleanText(v, maxDetailVal)
		case float64, bool:
			out[k] = v
		}
	}
	return out
}

// CleanText is s made printable on one line (newlines and tabs as spaces, other control and
// format characters dropped, invalid UTF-8 as U+FFFD) and cut to at most max bytes.
func CleanText(s string, max int) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			r = ' '
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			continue
		}
		if b.Len()+utf8.RuneLen(r) > max {
			out := b.String()
			n := max - len("…")
			for n > 0 && n < len(out) && !utf8.RuneStart(out[n]) {
				n--
			}
			return out[:min(n, len(out))] + "…"
		}
		b.WriteRune(r)
	}
	return b.String()
}
