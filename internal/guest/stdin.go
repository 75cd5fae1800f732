//go:build unix

package guest

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// handleExecStdin runs a command as POST /v1/exec does, but with its stdin a pipe the host
// writes to while it runs (see StdinUpgrade): the request switches the connection to frames.
func (s *server) handleExecStdin(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), StdinUpgrade) {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "POST /v1/exec/stdin needs \"Connection: Upgrade\" and \"Upgrade: %s\"", StdinUpgrade))
		return
	}
	var req ExecRequest
	if err := decodeJSON(w, r, maxSmallBody, &req); err != nil {
		s.writeError(w, err)
		return
	}
	if len(req.Stdin) > 0 {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "stdin must be empty here: the command's input is sent as frames once the connection is upgraded"))
		return
	}
	sp, err := s.prepareExec(&req)
	if err != nil {
		s.writeError(w, err)
		return
	}
	sp.maxOut = 0 // output is streamed, not kept
	inR, inW, err := os.Pipe()
	if err != nil {
		s.writeError(w, errcode.Wrap(errcode.Internal, err, "cannot create the stdin pipe: %v", err))
		return
	}
	defer inR.Close()
	closeIn := sync.OnceFunc(func() { _ = inW.Close() })
	defer closeIn()
	sp.stdinFile = inR

	rc := http.NewResponseController(w)
	w.Header().Set("Connection", "Upgrade")
	w.Header().Set("Upgrade", StdinUpgrade)
	w.WriteHeader(http.StatusSwitchingProtocols)
	if err := rc.Flush(); err != nil {
		return
	}
	conn, brw, err := rc.Hijack()
	if err != nil {
		s.log.Warn("guest: cannot take over the connection for a command's stdin", "err", err)
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Time{})

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var wmu sync.Mutex
	send := func(typ byte, payload []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		_ = conn.SetWriteDeadline(time.Now().Add(frameWriteTimeout))
		return writeFrame(conn, typ, payload)
	}
	// Input: connection → stdin. Its end (EOF, error, a bad frame) is the host leaving, which
	// kills the command as a dropped exec does.
	go func() {
		defer cancel()
		buf := make([]byte, MaxPTYData+maxPTYControl)
		for {
			typ, p, err := readFrame(brw.Reader, buf)
			if err != nil {
				return
			}
			switch typ {
			case ptyData:
				_, _ = inW.Write(p) // a command that closed its stdin loses the input, as with a pipe
			case pipeCloseIn:
				closeIn()
			default:
				return
			}
		}
	}()

	frames, done := s.startExec(ctx, sp)
	alive := true
	for f := range frames { // always drained, so the output readers never block for good
		typ := byte(ptyData)
		if f.Stream == "stderr" {
			typ = pipeStderr
		}
		for b := f.Data; alive && len(b) > 0; b = b[min(len(b), MaxPTYData):] {
			if send(typ, b[:min(len(b), MaxPTYData)]) != nil {
				alive = false
				cancel() // nobody is listening: kill the command
			}
		}
	}
	o := <-done
	closeIn()
	if o.err != nil {
		b, _ := json.Marshal(errorBody(o.err))
		_ = send(ptyError, b)
		return
	}
	o.res.Truncated = false
	b, _ := json.Marshal(o.res)
	_ = send(ptyExit, b)
}
