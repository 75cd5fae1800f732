//go:build linux

package guest_test

import (
	"bytes"
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// collect reads a session to its end: stdout, stderr and the result.
func collect(t *testing.T, s *guest.StdinSession) (stdout, stderr string, res *guest.ExecResult) {
	t.Helper()
	var o, e bytes.Buffer
	for {
		stream, b, r, err := s.Next()
		if err != nil {
			t.Fatalf("Next: %v (stdout %q, stderr %q)", err, o.String(), e.String())
		}
		if r != nil {
			return o.String(), e.String(), r
		}
		if stream == "stderr" {
			e.Write(b)
		} else {
			o.Write(b)
		}
	}
}

// Input written while the command runs reaches it, in order, and closing stdin is its EOF;
// stdout and stderr stay apart.
func TestExecStdinWriteAndClose(t *testing.T) {
	a := startAgent(t)
	s, err := a.c.ExecStdin(ctxT(t, time.Minute), guest.ExecRequest{Argv: []string{"sh", "-c", "read a; echo got=$a; cat; echo done >&2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write([]byte("first\n")); err != nil {
		t.Fatal(err)
	}
	// The first line is answered before the rest is sent: the input is live, not collected.
	stream, b, _, err := s.Next()
	if err != nil || stream != "stdout" || string(b) != "got=first\n" {
		t.Fatalf("first output: %q %q %v", stream, b, err)
	}
	big := strings.Repeat("x", 3*guest.MaxPTYData+7) // more than one frame
	if _, err := s.Write([]byte(big)); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	out, errOut, res := collect(t, s)
	if out != big || errOut != "done\n" || res.ExitCode != 0 {
		t.Fatalf("stdout %d bytes (want %d), stderr %q, exit %d", len(out), len(big), errOut, res.ExitCode)
	}
}

// A dropped connection kills the command, whose stdin is still open.
func TestExecStdinDropKills(t *testing.T) {
	a := startAgent(t)
	s, err := a.c.ExecStdin(ctxT(t, time.Minute), guest.ExecRequest{Argv: []string{"sh", "-c", "echo pid=$$; cat"}})
	if err != nil {
		t.Fatal(err)
	}
	_, b, _, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`pid=(\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("output %q", b)
	}
	_ = s.Close()
	processGone(t, atoi(t, string(m[1])), 15*time.Second)
}

func TestExecStdinBadRequests(t *testing.T) {
	a := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := a.c.ExecStdin(ctx, guest.ExecRequest{Argv: []string{"true"}, User: "nobody"})
	wantCode(t, err, errcode.InvalidArgument, "nobody")
	_, err = a.c.ExecStdin(ctx, guest.ExecRequest{Argv: []string{"true"}, Stdin: []byte("x")})
	wantCode(t, err, errcode.InvalidArgument, "stdin")
	if code, eb := a.raw(t, http.MethodPost, "/exec/stdin", `{"argv":["true"]}`); code != http.StatusBadRequest || !strings.Contains(eb.Message, "Upgrade") {
		t.Fatalf("no upgrade: %d %+v", code, eb)
	}
	s, err := a.c.ExecStdin(ctx, guest.ExecRequest{Argv: []string{"no-such-command-xyz"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, errOut, res := collect(t, s); res.ExitCode != 127 || !strings.Contains(errOut, "no-such-command-xyz") {
		t.Fatalf("exit %d, stderr %q", res.ExitCode, errOut)
	}
}
