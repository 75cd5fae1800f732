package peerreply

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
)

func TestErrorAllowList(t *testing.T) {
	allowed := []errcode.Code{errcode.JobNotFound, errcode.InvalidArgument}
	e := Machine.Error(ErrorBody{Code: "JOB_NOT_FOUND", Message: "no job"}, "remote job status", allowed)
	if e.Code != errcode.JobNotFound || e.Message != "no job" || e.Details["origin"] != "machine_agent" {
		t.Errorf("allowed code: %+v", e)
	}
	// A code the endpoint never returns (here one that would let a caller think it must log in
	// again) is the peer's fault: INTERNAL, its words quoted.
	e = Sandbox.Error(ErrorBody{Code: "AUTH_FAILED", Message: "log in again"}, "status", allowed)
	if e.Code != errcode.Internal || !strings.Contains(e.Message, "unexpected error code") || !strings.Contains(e.Message, "AUTH_FAILED") ||
		e.Details["origin"] != "sandbox_agent" {
		t.Errorf("forged code: %+v", e)
	}
	if e := Machine.Error(ErrorBody{Code: "JOB_NOT_FOUND"}, "", allowed); e.Message != "the machine's agent gave no message" {
		t.Errorf("no message: %q", e.Message)
	}
}

func TestErrorCleansText(t *testing.T) {
	in := ErrorBody{Code: "INVALID_ARGUMENT", Message: "bad\x1b[31m red\x1b[0m \u202Egnp.exe\u202C\nnext\xff" + strings.Repeat("é", 2000),
		Details: map[string]any{"path": "/x\x1b]0;title\x07\u2066y", "size": 12.0, "ok": true, "origin": "server", "Bad-Key": 1.0,
			"nested": map[string]any{"a": 1}, "long": strings.Repeat("日", 1000)}}
	e := Machine.Error(in, "", []errcode.Code{errcode.InvalidArgument})
	if !strings.HasPrefix(e.Message, "bad red gnp.exe next\uFFFDé") || len(e.Message) > MaxMessage || !utf8.ValidString(e.Message) {
		t.Errorf("message %q (%d bytes)", e.Message[:80], len(e.Message))
	}
	want := map[string]any{"path": "/xy", "size": 12.0, "ok": true, "origin": "machine_agent"}
	for k, v := range want {
		if e.Details[k] != v {
			t.Errorf("detail %s = %#v, want %#v", k, e.Details[k], v)
		}
	}
	for _, k := range []string{"Bad-Key", "nested"} {
		if _, ok := e.Details[k]; ok {
			t.Errorf("detail %q kept", k)
		}
	}
	if long := e.Details["long"].(string); len(long) > MaxDetailValue || !utf8.ValidString(long) {
		t.Errorf("long detail: %d bytes", len(long))
	}
}

func TestCleanDetailsBound(t *testing.T) {
	in := map[string]any{}
	for i := range 20 {
		in["k"+string(rune('a'+i))] = true
	}
	if out := CleanDetails(in); len(out) != MaxDetails {
		t.Errorf("%d details kept, want %d", len(out), MaxDetails)
	}
}

func reply(status int, body string) *http.Response {
	rec := httptest.NewRecorder()
	rec.WriteHeader(status)
	rec.WriteString(body)
	return rec.Result()
}

func TestReadError(t *testing.T) {
	allowed := []errcode.Code{errcode.JobNotFound}
	// Enveloped (a machine) and bare (a sandbox's agent).
	err := Machine.ReadError(reply(404, `{"error":{"code":"JOB_NOT_FOUND","message":"gone\u001b[2J"}}`), "status", allowed...)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.JobNotFound || e.Message != "gone" || e.Details["origin"] != Machine.Origin {
		t.Errorf("machine: %v", err)
	}
	err = Sandbox.ReadError(reply(404, `{"code":"JOB_NOT_FOUND","message":"gone"}`), "status", allowed...)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.JobNotFound || e.Details["origin"] != Sandbox.Origin {
		t.Errorf("sandbox: %v", err)
	}
	// Not a typed error; oversized.
	err = Machine.ReadError(reply(502, "<html>\x1b[31mbad gateway</html>"), "status", allowed...)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.Internal || !strings.Contains(e.Message, "no typed error") || strings.Contains(e.Message, "\x1b") {
		t.Errorf("untyped: %v", err)
	}
	err = Machine.ReadError(reply(500, `{"error":{"code":"INTERNAL","message":"`+strings.Repeat("x", MaxErrorBody)+`"}}`), "status", allowed...)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.Internal || !strings.Contains(e.Message, "oversized") {
		t.Errorf("oversized: %v", err)
	}
}

func TestWriteErrorRoundTrip(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, errcode.New(errcode.JobNotFound, "no job %s", "rjob-1").With("job_id", "rjob-1"))
	if rec.Code != http.StatusNotFound {
		t.Errorf("status %d", rec.Code)
	}
	err := Machine.ReadError(rec.Result(), "status", errcode.JobNotFound)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.JobNotFound || e.Details["job_id"] != "rjob-1" {
		t.Errorf("round trip: %v", err)
	}
	// An untyped error's text stays on the peer.
	rec = httptest.NewRecorder()
	WriteError(rec, errors.New("secret path /etc/x"))
	if strings.Contains(rec.Body.String(), "secret") || rec.Code != http.StatusInternalServerError {
		t.Errorf("untyped error written as %d %s", rec.Code, rec.Body)
	}
}

type brokenReader struct{}

func (brokenReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

func TestReadAndDecode(t *testing.T) {
	var v struct{ N int }
	if err := Decode(Machine, strings.NewReader(`{"N":3}`), "x", 100, &v, nil); err != nil || v.N != 3 {
		t.Errorf("decode: %v %v", v, err)
	}
	err := Decode(Machine, strings.NewReader(`{"N":-1}`), "x", 100, &v, func(p *struct{ N int }) error {
		if p.N < 0 {
			return errors.New("negative \x1b[1mN")
		}
		return nil
	})
	if e, ok := errcode.As(err); !ok || e.Code != errcode.Internal || !strings.Contains(e.Message, "malformed") || strings.Contains(e.Message, "\x1b") {
		t.Errorf("invalid: %v", err)
	}
	if err := Decode(Machine, strings.NewReader(strings.Repeat(" ", 101)), "x", 100, &v, nil); !strings.Contains(errcode.Message(err), "oversized") {
		t.Errorf("oversized: %v", err)
	}
	if _, err := Sandbox.Read(brokenReader{}, "x", 100); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Errorf("broken sandbox reply: %v", err)
	}
	if _, err := Machine.Read(brokenReader{}, "x", 100); !errcode.Is(err, errcode.Internal) {
		t.Errorf("broken machine reply: %v", err)
	}
}
