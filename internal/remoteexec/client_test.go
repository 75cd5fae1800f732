package remoteexec_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/remoteexec"
)

// fakeMachine answers /exec with body (and status), as a broken or hostile agent might.
func fakeMachine(t *testing.T, status int, body string) *remoteexec.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return remoteexec.NewClient(clientTo(srv))
}

func out(stream string, data []byte) string {
	return fmt.Sprintf(`{"type":"out","stream":%q,"data":%q}`+"\n", stream, base64.StdEncoding.EncodeToString(data))
}

const start = `{"type":"start","shell":"sh","pid":7}` + "\n"

func TestClientChecksTheMachine(t *testing.T) {
	big := strings.Repeat("a", remoteexec.MaxFrameData)
	var overCap strings.Builder
	overCap.WriteString(start)
	for range remoteexec.MaxOutputBytes/remoteexec.MaxFrameData + 1 {
		overCap.WriteString(out("stdout", []byte(big)))
	}
	for name, body := range map[string]string{
		"frame too big":      start + out("stdout", []byte(big+"a")),
		"line too long":      start + `{"type":"out","pad":"` + strings.Repeat("x", 64<<10) + `"}` + "\n",
		"over the cap":       overCap.String(),
		"bad stream":         start + out("stdin", []byte("x")),
		"not json":           start + "hello\n",
		"out before start":   out("stdout", []byte("x")),
		"total below sent":   start + out("stdout", []byte("abc")) + `{"type":"result","exit_code":0,"total_bytes":2}` + "\n",
		"truncated lie":      start + out("stdout", []byte("abc")) + `{"type":"result","exit_code":0,"total_bytes":9,"truncated":true}` + "\n",
		"partial with code":  start + `{"type":"result","exit_code":0,"partial":true,"reason":"timeout"}` + "\n",
		"unknown reason":     start + `{"type":"result","partial":true,"reason":"bored"}` + "\n",
		"negative duration":  start + `{"type":"result","exit_code":0,"duration_ms":-5}` + "\n",
		"bad shell in start": `{"type":"start","shell":"zsh"}` + "\n",
	} {
		_, err := fakeMachine(t, 200, body).Exec(context.Background(), remoteexec.Request{Command: "true"})
		if e, ok := errcode.As(err); !ok || e.Code != errcode.Internal || e.Details["origin"] != "machine_agent" {
			t.Errorf("%s: %v, want INTERNAL from the machine", name, err)
		}
	}
	// An error code /exec never returns becomes INTERNAL; a known one passes, cleaned (its ANSI
	// escape sequence dropped whole).
	_, err := fakeMachine(t, 404, `{"error":{"code":"SANDBOX_NOT_FOUND","message":"x"}}`).Exec(context.Background(), remoteexec.Request{Command: "true"})
	if errcode.Of(err) != errcode.Internal {
		t.Errorf("foreign code: %v", err)
	}
	_, err = fakeMachine(t, 400, `{"error":{"code":"INVALID_ARGUMENT","message":"bad\n\u001b[31mthing"}}`).Exec(context.Background(), remoteexec.Request{Command: "true"})
	if errcode.Of(err) != errcode.InvalidArgument || errcode.Message(err) != "bad thing" {
		t.Errorf("known code: %v", err)
	}
	// A stream that breaks after the start returns what arrived, partial.
	res, err := fakeMachine(t, 200, start+out("stdout", []byte("half"))+`{"type":"out","str`).Exec(context.Background(), remoteexec.Request{Command: "true"})
	if err != nil || !res.Partial || res.Reason != "disconnected" || res.Stdout != "half" || res.ExitCode != nil || res.TotalBytes != 4 {
		t.Errorf("cut stream: %+v %v", res, err)
	}
	// Before the start frame, nothing is known: the call fails rather than claim it ran.
	if _, err := fakeMachine(t, 200, "").Exec(context.Background(), remoteexec.Request{Command: "true"}); errcode.Of(err) != errcode.MachineOffline {
		t.Errorf("empty stream: %v", err)
	}
}

// TestClientDecodesCLIXML: a powershell run's stderr framing comes back as text; another
// shell's stderr that happens to look like it is left alone.
func TestClientDecodesCLIXML(t *testing.T) {
	raw, err := os.ReadFile("../shell/testdata/ps51_write_error.clixml")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile("../shell/testdata/ps51_write_error.txt")
	result := fmt.Sprintf(`{"type":"result","exit_code":1,"total_bytes":%d}`+"\n", len(raw))
	res, err := fakeMachine(t, 200, `{"type":"start","shell":"powershell","pid":7}`+"\n"+out("stderr", raw)+result).
		Exec(context.Background(), remoteexec.Request{Command: "Write-Error boom", Shell: "powershell"})
	if err != nil || res.Stderr != string(want) || *res.ExitCode != 1 || res.TotalBytes != int64(len(raw)) {
		t.Errorf("powershell: %+v %v", res, err)
	}
	res, err = fakeMachine(t, 200, start+out("stderr", raw)+result).Exec(context.Background(), remoteexec.Request{Command: "true"})
	if err != nil || res.Stderr != string(raw) {
		t.Errorf("sh: %+v %v", res, err)
	}
}
