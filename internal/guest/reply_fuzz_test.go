package guest

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
)

var frameSeeds = []string{
	`{"stream":"stdout","data":"aGVsbG8K"}` + "\n" + `{"result":{"exit_code":0,"stdout":"hello\n","stdout_bytes":6}}` + "\n",
	`{"stream":"stderr","data":"eA=="}` + "\n" + `{"error":{"code":"CAPACITY_UNAVAILABLE","message":"out of pids","details":{"x":1}}}` + "\n",
	`{"error":{"code":"AUTH_FAILED","message":"\u202elog in\n"}}` + "\n",
	`{"result":{"exit_code":137,"signal":"SIGKILL","duration_ms":-1}}` + "\n",
	`{"stream":"stdout","data":"` + strings.Repeat("QUFB", 11000) + `"}` + "\n",
	`{"stream":"stdin","data":"eA=="}` + "\n",
	"{}\n", "\n", `{"stream":"stdout","da`, "[1,2]\n", `{"result":null}` + "\n",
}

// FuzzFrames: any byte stream read as exec frames yields typed errors, never a panic, and no
// output frame past its bound.
func FuzzFrames(f *testing.F) {
	for _, s := range frameSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr := newFrameReader(bytes.NewReader(data), 1024)
		fr.limit = 4 << 10 // small, so that the fuzzer reaches it
		for {
			res, err := readFrames(fr, func(stream string, d []byte) {
				if (stream != "stdout" && stream != "stderr") || len(d) > MaxFrameData {
					t.Fatalf("delivered %q with %d bytes", stream, len(d))
				}
			})
			if err == nil {
				if res.StdoutBytes < 0 || res.StderrBytes < 0 || res.DurationMs < 0 {
					t.Fatalf("result %+v accepted", res)
				}
				continue // more frames may follow in the fuzzer's input
			}
			checkTyped(t, err)
			return
		}
	})
}

// FuzzDirList: any reply read as a listing yields a valid listing or a typed error.
func FuzzDirList(f *testing.F) {
	for _, s := range []string{
		`{"path":"/w","entries":[{"path":"/w/a","name":"a","type":"file","size":3,"mode":"0644","mod_time":"2024-01-01T00:00:00Z"}],"truncated":false,"total":1}`,
		`{"path":"/w","entries":null,"truncated":false,"total":0}`,
		`{"path":"/w","entries":[],"truncated":true,"total":5,"extra":{"a":[1,2]}}`,
		`{"path":"/w","entries":[{"type":"dir","size":-1}],"total":1}`,
		`{"entries":[{"type":"symlink","link_target":"` + strings.Repeat("\\u0001", 100) + `"}],"total":1}`,
		`{"path":1}`, `[]`, `{"path":"/w"}{}`, `{"path":"/w","total":0`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dl, err := decodeDirList(bytes.NewReader(data))
		if err != nil {
			checkTyped(t, err)
			return
		}
		if len(dl.Entries) > MaxListEntries || dl.Total < len(dl.Entries) {
			t.Fatalf("listing %+v accepted", dl)
		}
		for _, e := range dl.Entries {
			if validFileInfo(&e) != nil {
				t.Fatalf("entry %+v accepted", e)
			}
		}
	})
}

// FuzzAgentError: whatever an agent says in an error, the host passes on an allowed code, a
// bounded printable message and bounded details, marked as the agent's.
func FuzzAgentError(f *testing.F) {
	f.Add("AUTH_FAILED", "invalid token", "k", "v")
	f.Add("FILE_NOT_FOUND", "/x\x1b[2J does not exist\u202e", "path", strings.Repeat("\xff", 300))
	f.Add("CAPACITY_UNAVAILABLE", strings.Repeat("é", 2000), "origin", "server")
	f.Fuzz(func(t *testing.T, code, msg, key, val string) {
		e := agent.Error(ErrorBody{Code: code, Message: msg, Details: map[string]any{key: val}}, "", fileCodes)
		if e.Code != errcode.Internal && !slices.Contains(fileCodes, e.Code) {
			t.Fatalf("code %s passed on", e.Code)
		}
		if e.Details["origin"] != agent.Origin || len(e.Details) > peerreply.MaxDetails+1 {
			t.Fatalf("details %v", e.Details)
		}
		if v, ok := e.Details[key].(string); ok && key != "origin" && len(v) > peerreply.MaxDetailValue {
			t.Fatalf("detail of %d bytes", len(v))
		}
		if len(e.Message) > peerreply.MaxMessage+200 || !utf8.ValidString(e.Message) || strings.IndexFunc(e.Message, func(r rune) bool {
			return unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
		}) >= 0 {
			t.Fatalf("message %q", e.Message)
		}
	})
}

func checkTyped(t *testing.T, err error) {
	t.Helper()
	e, ok := errcode.As(err)
	if !ok {
		t.Fatalf("untyped error %v", err)
	}
	if errors.Is(err, errEndOfStream) || (e.Code == errcode.Internal && e.Details["origin"] != agent.Origin) {
		t.Fatalf("error %v (%v)", err, e.Details)
	}
}
