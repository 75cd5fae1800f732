package guest

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
)

const (
	// agentOrigin marks, in an error's details ("origin"), what a sandbox's agent said: its
	// code, message and details reach callers only as the sandbox's words, never the server's.
	agentOrigin = "sandbox_agent"
	// maxAgentMessage bounds an agent's error message as the host passes it on.
	maxAgentMessage = 1024
	maxAgentDetails = 8
	maxDetailKey    = 32
	maxDetailValue  = 256
)

// The error codes an agent may return, by endpoint: what the server in this package sends
// (TestAgentCodesCoverServer keeps the lists in step with it). Any other code is an agent that
// is not ours, or broken, and becomes INTERNAL.
var (
	baseCodes = []errcode.Code{errcode.InvalidArgument, errcode.Internal, errcode.UnsupportedOp}
	// execCodes: a command the sandbox has no processes or memory left to start.
	execCodes = append(slices.Clip(baseCodes), errcode.CapacityUnavailable)
	fileCodes = append(slices.Clip(baseCodes), errcode.FileNotFound, errcode.Conflict, errcode.FileTooLarge)
	// jobCodes: the jobs endpoints; starting one may also find the sandbox full of jobs,
	// processes or memory, or the job's id taken.
	jobCodes      = append(slices.Clip(baseCodes), errcode.JobNotFound)
	jobStartCodes = append(slices.Clip(baseCodes), errcode.JobLimitExceeded, errcode.CapacityUnavailable, errcode.Conflict)
	// netCodes: the net session (a listener's port in use, a second session with another
	// configuration) and POST /v1/tcp (nothing listens on the port).
	netCodes = append(slices.Clip(baseCodes), errcode.Conflict)
)

// agentError turns an agent's error body into the error the host passes on: a code the
// endpoint may return, a bounded printable message and a few short details, marked as the
// agent's.
func agentError(eb ErrorBody, allowed []errcode.Code) *errcode.Error {
	msg := cleanText(eb.Message, maxAgentMessage)
	if msg == "" {
		msg = "the sandbox's agent gave no message"
	}
	code := errcode.Code(eb.Code)
	if !slices.Contains(allowed, code) {
		return errcode.New(errcode.Internal, "the sandbox's agent returned an unexpected error code %q (its message: %s)",
			cleanText(eb.Code, 64), cleanText(msg, 256)).With("origin", agentOrigin)
	}
	e := &errcode.Error{Code: code, Message: msg, Details: cleanDetails(eb.Details)}
	return e.With("origin", agentOrigin)
}

// cleanDetails keeps at most maxAgentDetails details with short names and scalar values,
// strings bounded and printable; the rest is dropped.
func cleanDetails(in map[string]any) map[string]any {
	keys := make([]string, 0, len(in))
	for k := range in {
		if validDetailKey(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	out := map[string]any{}
	for _, k := range keys {
		if len(out) == maxAgentDetails {
			break
		}
		switch v := in[k].(type) {
		case string:
			out[k] = cleanText(v, maxDetailValue)
		case float64, bool:
			out[k] = v
		}
	}
	return out
}

func validDetailKey(k string) bool {
	if k == "" || len(k) > maxDetailKey || k == "origin" {
		return false
	}
	for _, r := range k {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}

// cleanText makes s safe to show as one line: valid UTF-8, line breaks and tabs as spaces, no
// control or formatting characters (bidi overrides, zero-width), at most max bytes ("…" ends
// a cut).
func cleanText(s string, max int) string {
	var b strings.Builder
	for _, r := range s { // an invalid byte reads as U+FFFD
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			r = ' '
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			continue
		}
		if b.Len()+utf8.RuneLen(r) > max {
			return cutTo(b.String(), max-len("…")) + "…"
		}
		b.WriteRune(r)
	}
	return b.String()
}

// cutTo shortens s to at most n bytes on a rune boundary.
func cutTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
