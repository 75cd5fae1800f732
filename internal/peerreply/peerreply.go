// Package peerreply reads what an agent the server does not control sends back: the agent inside
// each sandbox (root in the sandbox can replace it) and the agent of a joined machine. Nothing
// such a peer replies is trusted unchecked: a reply is read within a bound, decoded, and an
// error reply becomes an errcode.Error only with a code the endpoint may return (any other is
// INTERNAL), its message and a few scalar details cleaned (one printable line: no control, ANSI
// escape or bidi/format characters, valid UTF-8, cut on a character boundary) and marked with
// the peer's origin (details.origin), so a caller never takes the peer's words for the
// server's.
//
// The handler half (WriteError) is here too: a joined machine's handlers write their typed
// errors with it. It builds for every platform the machine agent runs on.
package peerreply

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/text"
)

// Bounds of what an error reply carries once cleaned.
const (
	// MaxErrorBody bounds an error reply's body.
	MaxErrorBody = 64 << 10
	// MaxMessage bounds an error's message.
	MaxMessage = 1024
	// MaxDetails bounds how many details an error keeps; MaxDetailKey the length of their
	// names, MaxDetailValue that of string values.
	MaxDetails     = 8
	MaxDetailKey   = 32
	MaxDetailValue = 256
)

// Peer is one kind of agent, as its replies' errors name it.
type Peer struct {
	// Origin marks the peer's words in an error's details ("origin").
	Origin string
	// Name is how messages name it ("the sandbox's agent").
	Name string
	// Enveloped: its error replies are {"error":{code,message,details}}; otherwise the body is
	// {code,message,details} itself.
	Enveloped bool
	// BrokenOff is the code of a reply that broke off midway, and BrokenHint what that
	// suggests (appended to the message).
	BrokenOff  errcode.Code
	BrokenHint string
}

// The peers.
var (
	// Sandbox is the agent inside a sandbox: a reply cut off usually means the sandbox stopped.
	Sandbox = Peer{Origin: "sandbox_agent", Name: "the sandbox's agent", BrokenOff: errcode.SandboxNotRunning,
		BrokenHint: " (the sandbox may have stopped)"}
	// Machine is a joined machine's agent.
	Machine = Peer{Origin: "machine_agent", Name: "the machine's agent", Enveloped: true, BrokenOff: errcode.Internal}
)

// ErrorBody is the wire form of an errcode.Error.
type ErrorBody struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// Envelope is an enveloped error reply.
type Envelope struct {
	Error ErrorBody `json:"error"`
}

// Body is the wire form of err: its code, message and details (an untyped error becomes
// INTERNAL with a generic message; its text stays where it happened).
func Body(err error) ErrorBody {
	eb := ErrorBody{Code: string(errcode.Of(err)), Message: errcode.Message(err)}
	if e, ok := errcode.As(err); ok {
		eb.Details = e.Details
	}
	return eb
}

// WriteError writes err as an enveloped typed error reply with its HTTP status.
func WriteError(w http.ResponseWriter, err error) {
	env := Envelope{Error: Body(err)}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(errcode.HTTPStatus(errcode.Code(env.Error.Code)))
	_ = json.NewEncoder(w).Encode(env)
}

// Error turns the peer's error body into the error the server passes on: one of allowed codes
// (any other is INTERNAL: a peer that is not ours, or broken), a bounded printable message and
// at most MaxDetails short scalar details, marked with the peer's origin. what names the call
// ("" when the caller's message says it).
func (p Peer) Error(eb ErrorBody, what string, allowed []errcode.Code) *errcode.Error {
	msg := text.Clean(eb.Message, MaxMessage)
	if msg == "" {
		msg = p.Name + " gave no message"
	}
	code := errcode.Code(eb.Code)
	if !slices.Contains(allowed, code) {
		return errcode.New(errcode.Internal, "%s returned an unexpected error code %q%s (its message: %s)",
			p.Name, text.Clean(eb.Code, 64), to(what), text.Clean(msg, 256)).With("origin", p.Origin)
	}
	e := &errcode.Error{Code: code, Message: msg, Details: CleanDetails(eb.Details)}
	return e.With("origin", p.Origin)
}

// ReadError reads the peer's non-2xx reply (within MaxErrorBody) and returns it as Error does;
// a reply that is not a typed error is INTERNAL.
func (p Peer) ReadError(resp *http.Response, what string, allowed ...errcode.Code) error {
	raw, err := p.Read(resp.Body, what, MaxErrorBody)
	if err != nil {
		return err
	}
	var eb ErrorBody
	if p.Enveloped {
		var env Envelope
		err = json.Unmarshal(raw, &env)
		eb = env.Error
	} else {
		err = json.Unmarshal(raw, &eb)
	}
	if err != nil || eb.Code == "" {
		return errcode.New(errcode.Internal, "%s answered%s with HTTP %d and no typed error: %s", p.Name, to(what), resp.StatusCode,
			text.Clean(strings.TrimSpace(string(raw)), 200)).With("origin", p.Origin)
	}
	return p.Error(eb, what, allowed)
}

// Read reads a whole reply body of at most limit bytes: more is Oversized; a body that breaks
// off is BrokenOff.
func (p Peer) Read(body io.Reader, what string, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(body, limit+1))
	if int64(len(b)) > limit {
		return nil, p.Oversized(what, limit)
	}
	if err != nil {
		// What the connection did, not what the peer said: no origin mark.
		return nil, errcode.Wrap(p.BrokenOff, err, "%s broke off its reply%s%s: %s", p.Name, to(what), p.BrokenHint,
			text.Clean(err.Error(), 200))
	}
	return b, nil
}

// Decode reads a JSON reply of at most limit bytes into out and checks it with valid (if not
// nil); a reply that does not decode or check is Malformed.
func Decode[T any](p Peer, body io.Reader, what string, limit int64, out *T, valid func(*T) error) error {
	b, err := p.Read(body, what, limit)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return p.Malformed(what, err)
	}
	if valid != nil {
		if err := valid(out); err != nil {
			return p.Malformed(what, err)
		}
	}
	return nil
}

// Oversized is the error of a reply larger than its bound.
func (p Peer) Oversized(what string, limit int64) *errcode.Error {
	return errcode.New(errcode.Internal, "%s sent an oversized reply%s (more than %d bytes)", p.Name, to(what), limit).With("origin", p.Origin)
}

// Malformed is the error of a reply that is not what the protocol says (cause says how).
func (p Peer) Malformed(what string, cause error) *errcode.Error {
	if cause == nil {
		cause = errors.New("nothing")
	}
	return errcode.Wrap(errcode.Internal, cause, "%s sent a malformed reply%s: %s", p.Name, to(what), text.Clean(cause.Error(), 300)).
		With("origin", p.Origin)
}

// Malformedf is Malformed with the cause given as a format.
func (p Peer) Malformedf(what, format string, args ...any) *errcode.Error {
	return p.Malformed(what, fmt.Errorf(format, args...))
}

// CleanDetails keeps at most MaxDetails details whose names are short snake_case (never
// "origin", which the server sets) and whose values are numbers, booleans or strings (cleaned,
// at most MaxDetailValue bytes); the rest is dropped.
func CleanDetails(in map[string]any) map[string]any {
	keys := make([]string, 0, len(in))
	for k := range in {
		if validDetailKey(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	out := map[string]any{}
	for _, k := range keys {
		if len(out) == MaxDetails {
			break
		}
		switch v := in[k].(type) {
		case string:
			out[k] = text.Clean(v, MaxDetailValue)
		case float64, bool:
			out[k] = v
		}
	}
	return out
}

func validDetailKey(k string) bool {
	if k == "" || len(k) > MaxDetailKey || k == "origin" {
		return false
	}
	return strings.IndexFunc(k, func(r rune) bool { return (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' }) < 0
}

func to(what string) string {
	if what == "" {
		return ""
	}
	return " to " + what
}
