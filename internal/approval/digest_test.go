package approval_test

import (
	"encoding/json"
	"testing"

	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/errcode"
)

func digest(t *testing.T, tool, args string) string {
	t.Helper()
	d, err := approval.Digest(tool, json.RawMessage(args))
	if err != nil {
		t.Fatalf("Digest(%s, %s): %v", tool, args, err)
	}
	return d
}

// TestDigestEqualForIdenticalCalls: key order, whitespace and number spelling do not change it.
func TestDigestEqualForIdenticalCalls(t *testing.T) {
	t.Parallel()
	a := `{"sandbox_id":"sb-0123456789ab","command":["sh","-c","echo hi"],"env":{"A":"1","B":"2"},"timeout_seconds":30}`
	b := "{ \"timeout_seconds\": 3.0e1,\n \"env\": {\"B\":\"2\", \"A\":\"1\"}, \"command\": [\"sh\",\"-c\",\"echo hi\"], \"sandbox_id\": \"sb-0123456789ab\" }"
	if da, db := digest(t, "exec", a), digest(t, "exec", b); da != db || len(da) != 64 {
		t.Fatalf("identical calls: %s != %s", da, db)
	}
	if digest(t, "health", "") != digest(t, "health", "null") || digest(t, "health", "") != digest(t, "health", "{}") {
		t.Fatal("no arguments, null and {} must be one call")
	}
}

// TestDigestDiffersForEachArgumentChange: every single-argument change of exec's arguments,
// and the tool's name, gives another digest.
func TestDigestDiffersForEachArgumentChange(t *testing.T) {
	t.Parallel()
	base := map[string]any{"sandbox_id": "sb-0123456789ab", "command": []any{"sh", "-c", "echo hi"}, "env": map[string]any{"A": "1"},
		"cwd": "/workspace", "stdin": "input", "timeout_seconds": 30, "max_output_bytes": 1024, "user": "", "background": false}
	enc := func(m map[string]any) string { b, _ := json.Marshal(m); return string(b) }
	d0 := digest(t, "exec", enc(base))
	changes := map[string]any{
		"sandbox_id": "sb-0123456789ac", "command": []any{"sh", "-c", "echo hI"}, "env": map[string]any{"A": "2"},
		"cwd": "/tmp", "stdin": "input2", "timeout_seconds": 30.5, "max_output_bytes": 1025, "user": "root", "background": true,
	}
	if len(changes) != len(base) {
		t.Fatal("the table must change every argument")
	}
	seen := map[string]string{d0: "base"}
	for k, v := range changes {
		m := map[string]any{}
		for kk, vv := range base {
			m[kk] = vv
		}
		m[k] = v
		d := digest(t, "exec", enc(m))
		if prev, dup := seen[d]; dup {
			t.Errorf("changing %s gives the digest of %s", k, prev)
		}
		seen[d] = k
	}
	// Adding an argument, reordering argv, and another tool with the same arguments.
	m := map[string]any{}
	for k, v := range base {
		m[k] = v
	}
	m["extra"] = nil
	for what, d := range map[string]string{
		"added argument": digest(t, "exec", enc(m)),
		"argv order":     digest(t, "exec", `{"sandbox_id":"sb-0123456789ab","command":["-c","sh","echo hi"],"env":{"A":"1"},"cwd":"/workspace","stdin":"input","timeout_seconds":30,"max_output_bytes":1024,"user":"","background":false}`),
		"tool":           digest(t, "job_start", enc(base)),
	} {
		if _, dup := seen[d]; dup {
			t.Errorf("%s: same digest as another call", what)
		}
	}
}

// TestDigestFileWriteCoversContent: path and content together.
func TestDigestFileWriteCoversContent(t *testing.T) {
	t.Parallel()
	a := digest(t, "file_write", `{"sandbox_id":"sb-1","path":"/workspace/a","content":"one"}`)
	if a == digest(t, "file_write", `{"sandbox_id":"sb-1","path":"/workspace/a","content":"two"}`) ||
		a == digest(t, "file_write", `{"sandbox_id":"sb-1","path":"/workspace/b","content":"one"}`) ||
		a == digest(t, "file_write", `{"sandbox_id":"sb-1","path":"/workspace/a","content_base64":"b25l"}`) {
		t.Fatal("file_write's digest must cover path and content")
	}
}

// TestCanonicalForm pins the RFC 8785 form: sorted keys, no whitespace, ES6 numbers, minimal
// escapes (no HTML escaping).
func TestCanonicalForm(t *testing.T) {
	t.Parallel()
	c, err := approval.Canonical("t", json.RawMessage(`{"b":[1.0, 1e21, 1e-7, -0, 0.1, 100000000000000000000],"a":"<&>\u2028\n\u0001é","\ufb33":3,"\u20ac":1,"\ud83d\ude00":2}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"arguments":{"a":"<&>` + "\u2028" + `\n\u0001é","b":[1,1e+21,1e-7,0,0.1,100000000000000000000],"€":1,"😀":2,"דּ":3},"tool":"t"}` // UTF-16 order: 😀 (D83D…) before U+FB33
	if string(c) != want {
		t.Fatalf("canonical\n got %s\nwant %s", c, want)
	}
	for _, bad := range []string{`{"a":`, `{"a":1} {}`, `{"a":1e400}`} {
		if _, err := approval.Digest("t", json.RawMessage(bad)); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("Digest(%s): %v, want INVALID_ARGUMENT", bad, err)
		}
	}
}
