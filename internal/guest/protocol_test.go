//go:build linux

package guest_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
)

// TestExecResultWire: the agent sends output as base64 of the exact bytes under
// "output_encoding": "base64", and the host still reads an older agent's strings.
func TestExecResultWire(t *testing.T) {
	t.Parallel()
	in := guest.ExecResult{ExitCode: 3, Stdout: []byte{0xff, 0xfe, 'a'}, Stderr: []byte("é\n"), StdoutBytes: 3, StderrBytes: 3}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"stdout":"//5h"`)) || !bytes.Contains(b, []byte(`"output_encoding":"base64"`)) {
		t.Fatalf("wire form %s", b)
	}
	var out guest.ExecResult
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Stdout, in.Stdout) || !bytes.Equal(out.Stderr, in.Stderr) || out.ExitCode != 3 || out.StdoutBytes != 3 {
		t.Fatalf("round trip %+v", out)
	}

	// An agent from before output_encoding: strings. "abcd" is also valid base64, so the shape,
	// not the content, must decide.
	old := `{"exit_code":0,"stdout":"abcd","stderr":"h\u00e9\ufffd\n","truncated":false,"stdout_bytes":4,"stderr_bytes":6,"duration_ms":1,"timed_out":false}`
	out = guest.ExecResult{}
	if err := json.Unmarshal([]byte(old), &out); err != nil {
		t.Fatalf("an old agent's reply does not decode: %v", err)
	}
	if string(out.Stdout) != "abcd" || string(out.Stderr) != "hé\uFFFD\n" || out.StderrBytes != 6 {
		t.Fatalf("old shape decoded as %+v", out)
	}
	// In a streamed result frame too.
	var f guest.Frame
	if err := json.Unmarshal([]byte(`{"result":`+old+`}`), &f); err != nil || f.Result == nil || string(f.Result.Stdout) != "abcd" {
		t.Fatalf("old result frame: %v %+v", err, f.Result)
	}

	// An encoding this build does not know is an error that names it.
	err = json.Unmarshal([]byte(`{"exit_code":0,"stdout":"x","stderr":"","output_encoding":"zstd"}`), &out)
	if err == nil || !strings.Contains(err.Error(), `"zstd"`) {
		t.Fatalf("unknown encoding: %v", err)
	}
}

// TestExecNonUTF8Output: output that is not UTF-8 comes back byte for byte, streamed or not.
func TestExecNonUTF8Output(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	want := []byte{0xff, 0xfe, 'o', 'k', 0xc3}
	req := guest.ExecRequest{Argv: []string{"sh", "-c", `printf '\377\376ok\303'; printf '\200' >&2`}}
	res, err := a.c.Exec(ctxT(t, 10*time.Second), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Stdout, want) || !bytes.Equal(res.Stderr, []byte{0x80}) || res.StdoutBytes != 5 {
		t.Fatalf("not streamed: stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	var streamed []byte
	res, err = a.c.Exec(ctxT(t, 10*time.Second), req, func(stream string, d []byte) {
		if stream == "stdout" {
			streamed = append(streamed, d...)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Stdout, want) || !bytes.Equal(streamed, want) {
		t.Fatalf("streamed: result %q, frames %q", res.Stdout, streamed)
	}
}
