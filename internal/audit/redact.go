package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/text"
)

// Bounds of a summary.
const (
	// MaxArgvBytes bounds the argv (command, setup…) a summary keeps, all its strings together.
	MaxArgvBytes = 512
	// MaxStringBytes bounds any other string a summary keeps.
	MaxStringBytes = 256
	// MaxSummaryBytes bounds a summary; a larger one keeps only the arguments' names.
	MaxSummaryBytes = 8 << 10
	maxItems        = 32 // elements of an array kept
	maxKeys         = 64 // members of an object kept
	maxDepth        = 8
)

// Redacted is what a summary shows instead of a secret's or an environment variable's value.
const Redacted = "[redacted]"

// Digest returns the hex SHA-256 of args' canonical JSON: objects' keys sorted, no
// insignificant space, numbers as written, no HTML escaping. Absent or null arguments are {}.
// Arguments that are not JSON are digested as they are.
func Digest(args json.RawMessage) string {
	sum := sha256.Sum256(Canonical(args))
	return hex.EncodeToString(sum[:])
}

// Canonical returns args' canonical JSON (Digest).
func Canonical(args json.RawMessage) []byte {
	t := bytes.TrimSpace(args)
	if len(t) == 0 || string(t) == "null" || string(t) == "{}" {
		return []byte("{}")
	}
	v, err := decode(t)
	if err != nil {
		return args
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // maps' keys are sorted by encoding/json
		return args
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

func decode(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data")
	}
	return v, nil
}

// Summarize returns the redacted summary of a call's arguments, a JSON object: what was
// asked, never a file's content, stdin, a body's bytes, an environment variable's value or a
// secret.
//
//   - content, content_base64, stdin, data, body, code, script, input (and each value of
//     files): {"bytes": length, "sha256": hex} of the value as given;
//   - env, *_env, environment, headers: the names, each value "[redacted]";
//   - names like token, secret, password, credential, cookie, auth, key, *_key: "[redacted]";
//   - command, argv, setup and the other argvs: kept, MaxArgvBytes in all;
//   - other strings: the first MaxStringBytes; arrays the first 32 elements, objects 64 members.
//
// A REST call's arguments ({method, path, query, body, body_bytes}) keep method and path, the
// query with secret-named values redacted, the JSON body summarized as an MCP call's
// arguments are, and body_bytes (a streamed body's length; its bytes are never read).
func Summarize(surface string, args json.RawMessage) json.RawMessage {
	t := bytes.TrimSpace(args)
	if len(t) == 0 || string(t) == "null" || string(t) == "{}" {
		return json.RawMessage("{}")
	}
	v, err := decode(t)
	if err != nil {
		return mustJSON(map[string]any{"unparsed": blob(string(args))})
	}
	return summarize(surface, v)
}

// digestAndSummary is Digest and Summarize of args, decoding them once.
func digestAndSummary(surface string, args json.RawMessage) (string, json.RawMessage) {
	t := bytes.TrimSpace(args)
	if len(t) == 0 || string(t) == "null" || string(t) == "{}" {
		return emptyDigest, json.RawMessage("{}")
	}
	v, err := decode(t)
	if err != nil {
		return Digest(args), Summarize(surface, args)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return Digest(args), Summarize(surface, args)
	}
	sum := sha256.Sum256(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
	return hex.EncodeToString(sum[:]), summarize(surface, v)
}

var emptyDigest = Digest(nil)

func summarize(surface string, v any) json.RawMessage {
	var out any
	if m, ok := v.(map[string]any); ok && surface == gate.SurfaceREST {
		out = summarizeREST(m)
	} else {
		out = redact("", v, 0)
	}
	b := mustJSON(out)
	if len(b) > MaxSummaryBytes {
		var keys []string
		if m, ok := v.(map[string]any); ok {
			for k := range m {
				keys = append(keys, text.TruncateNoting(k, 64))
			}
			slices.Sort(keys)
			keys = keys[:min(len(keys), maxKeys)]
		}
		return mustJSON(map[string]any{"truncated": true, "bytes": len(b), "keys": keys})
	}
	return b
}

func summarizeREST(m map[string]any) map[string]any {
	out := map[string]any{}
	for _, k := range []string{"method", "path"} {
		if s, ok := m[k].(string); ok {
			out[k] = text.TruncateNoting(s, MaxStringBytes)
		}
	}
	if q, ok := m["query"].(map[string]any); ok {
		rq := map[string]any{}
		for k, v := range q {
			if len(rq) >= maxKeys {
				break
			}
			if secretName(k) {
				rq[text.TruncateNoting(k, 64)] = Redacted
				continue
			}
			rq[text.TruncateNoting(k, 64)] = redact("", v, 1)
		}
		out["query"] = rq
	}
	if b, ok := m["body"]; ok {
		out["body"] = redact("", b, 1)
	}
	if n, ok := m["body_bytes"]; ok {
		out["body_bytes"] = n
	}
	return out
}

var blobKeys = map[string]bool{"content": true, "content_base64": true, "stdin": true, "data": true, "data_base64": true,
	"body": true, "code": true, "script": true, "input": true}

var argvKeys = map[string]bool{"command": true, "argv": true, "cmd": true, "setup": true, "build_command": true,
	"setup_command": true, "agent_command": true, "validation_commands": true}

func envName(k string) bool {
	return k == "env" || k == "environment" || k == "headers" || strings.HasSuffix(k, "_env")
}

// secretName reports whether a key names a secret value.
func secretName(k string) bool {
	k = strings.ToLower(k)
	if k == "idempotency_key" {
		return false
	}
	for _, w := range []string{"token", "secret", "password", "passwd", "credential", "cookie", "auth", "apikey", "api_key", "private"} {
		if strings.Contains(k, w) {
			return true
		}
	}
	return k == "key" || strings.HasSuffix(k, "_key") || strings.HasSuffix(k, "-key")
}

// redact returns v, the value of key, redacted.
func redact(key string, v any, depth int) any {
	lk := strings.ToLower(key)
	switch {
	case lk == "":
	case secretName(lk):
		return Redacted
	case blobKeys[lk]:
		return blobOf(v)
	case lk == "files":
		if m, ok := v.(map[string]any); ok {
			out := map[string]any{}
			for _, k := range sortedKeys(m) {
				out[text.TruncateNoting(k, MaxStringBytes)] = blobOf(m[k])
			}
			return out
		}
		return blobOf(v)
	case envName(lk):
		return envNames(v)
	case argvKeys[lk]:
		budget := MaxArgvBytes
		return argv(v, &budget, depth)
	}
	if depth >= maxDepth {
		return "[…]"
	}
	switch x := v.(type) {
	case string:
		return text.TruncateNoting(x, MaxStringBytes)
	case map[string]any:
		out := map[string]any{}
		for _, k := range sortedKeys(x) {
			out[text.TruncateNoting(k, 64)] = redact(k, x[k], depth+1)
		}
		if len(x) > maxKeys {
			out["…"] = fmt.Sprintf("%d more members", len(x)-maxKeys)
		}
		return out
	case []any:
		out := make([]any, 0, min(len(x), maxItems+1))
		for i, e := range x {
			if i == maxItems {
				out = append(out, fmt.Sprintf("… %d more", len(x)-maxItems))
				break
			}
			out = append(out, redact("", e, depth+1))
		}
		return out
	default:
		return v // numbers, booleans, null
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[:min(len(keys), maxKeys)]
}

// blobOf is a value's length and SHA-256, never the value: a string's bytes as given, any
// other value's canonical JSON.
func blobOf(v any) any {
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		return blob(x)
	default:
		b, _ := json.Marshal(x)
		return blob(string(b))
	}
}

func blob(s string) map[string]any {
	sum := sha256.Sum256([]byte(s))
	return map[string]any{"bytes": len(s), "sha256": hex.EncodeToString(sum[:])}
}

// envNames keeps an environment's names: an object's keys or "NAME=" strings' names.
func envNames(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for _, k := range sortedKeys(x) {
			out[text.TruncateNoting(k, MaxStringBytes)] = Redacted
		}
		return out
	case []any:
		var out []any
		for i, e := range x {
			if i == maxItems {
				break
			}
			s, _ := e.(string)
			name, _, _ := strings.Cut(s, "=")
			out = append(out, text.TruncateNoting(name, MaxStringBytes)+"="+Redacted)
		}
		return out
	case nil:
		return nil
	default:
		return Redacted
	}
}

// argv keeps an argv (or argvs) up to *budget bytes of strings in all.
func argv(v any, budget *int, depth int) any {
	switch x := v.(type) {
	case string:
		if *budget <= 0 {
			return "…"
		}
		s := x
		if len(s) > *budget {
			s = text.TruncateNoting(s, *budget)
		}
		*budget -= len(x)
		return s
	case []any:
		var out []any
		for i, e := range x {
			if *budget <= 0 || i == maxItems || depth >= maxDepth {
				out = append(out, fmt.Sprintf("… %d more", len(x)-i))
				break
			}
			out = append(out, argv(e, budget, depth+1))
		}
		return out
	default:
		return redact("", v, depth+1)
	}
}

func mustJSON(v any) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return json.RawMessage(`{}`)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}
