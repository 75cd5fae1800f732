package remoteexec

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
	"github.com/agentbox/agentbox/internal/shell"
	"github.com/agentbox/agentbox/internal/text"
)

// errorCodes are the codes /exec may answer with (TestHandlerCodes keeps them in step with the
// handler); any other is INTERNAL.
var errorCodes = []errcode.Code{errcode.InvalidArgument, errcode.UnsupportedOp, errcode.Internal}

// Client calls a machine's /exec over an *http.Client whose transport reaches the machine (the
// host part of the URL is ignored by that transport).
type Client struct {
	hc   *http.Client
	base string
}

// NewClient returns a Client over hc, at base URL "http://machine".
func NewClient(hc *http.Client) *Client { return &Client{hc: hc, base: "http://machine"} }

// Exec runs req on the machine and returns its result. A typed error means nothing ran (the
// request was refused); once the command started, a broken stream or ctx ending returns the
// output received so far with Partial set, ExitCode nil and Reason "disconnected".
func (c *Client) Exec(ctx context.Context, req Request) (*Result, error) {
	if err := req.Validate(""); err != nil {
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "encoding the exec request")
	}
	began := time.Now()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/exec", bytes.NewReader(body))
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "building the exec request")
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(hr)
	if err != nil {
		if typed, ok := errcode.As(err); ok { // the transport's MACHINE_OFFLINE and friends
			return nil, typed
		}
		return nil, errcode.Wrap(errcode.MachineOffline, err, "could not reach the machine: %s", text.Clean(err.Error(), 200))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, peerreply.Machine.ReadError(resp, "exec", errorCodes...)
	}
	return readFrames(resp.Body, began)
}

// readFrames reads the start frame, the out frames and the result frame, checking each.
func readFrames(body io.Reader, began time.Time) (*Result, error) {
	br := bufio.NewReaderSize(body, 64<<10)
	var stdout, stderr bytes.Buffer
	res := &Result{}
	sawStart := false
	cutShort := func() (*Result, error) {
		if !sawStart {
			return nil, errcode.New(errcode.MachineOffline, "the connection to the machine broke before the command was known to start; it may or may not have run").
				With("origin", peerreply.Machine.Origin)
		}
		res.Partial, res.Reason, res.ExitCode = true, ReasonDisconnected, nil
		res.TotalBytes = int64(stdout.Len() + stderr.Len())
		res.DurationMS = time.Since(began).Milliseconds()
		return finish(res, &stdout, &stderr), nil
	}
	for {
		line, err := readLine(br)
		if errors.Is(err, errLineTooLong) {
			return nil, peerreply.Machine.Malformedf("exec", "a frame longer than %d bytes", maxFrameLine)
		}
		if err != nil {
			return cutShort()
		}
		var f frame
		if err := json.Unmarshal(line, &f); err != nil {
			return nil, peerreply.Machine.Malformedf("exec", "a frame that is not JSON: %v", err)
		}
		switch {
		case f.Type == "start" && !sawStart:
			switch shell.Dialect(f.Shell) {
			case shell.Sh, shell.Bash, shell.Cmd, shell.PowerShell:
			default:
				return nil, peerreply.Machine.Malformedf("exec", "start frame names shell %q", f.Shell)
			}
			sawStart, res.Shell = true, f.Shell
		case f.Type == "out" && sawStart:
			var dst *bytes.Buffer
			switch f.Stream {
			case "stdout":
				dst = &stdout
			case "stderr":
				dst = &stderr
			default:
				return nil, peerreply.Machine.Malformedf("exec", "an out frame of stream %q", f.Stream)
			}
			if len(f.Data) == 0 || len(f.Data) > MaxFrameData {
				return nil, peerreply.Machine.Malformedf("exec", "an out frame of %d bytes (1–%d)", len(f.Data), MaxFrameData)
			}
			if stdout.Len()+stderr.Len()+len(f.Data) > MaxOutputBytes {
				return nil, peerreply.Machine.Malformedf("exec", "more than %d bytes of output", MaxOutputBytes)
			}
			dst.Write(f.Data)
		case f.Type == "result" && sawStart:
			got := int64(stdout.Len() + stderr.Len())
			switch {
			case f.TotalBytes < got:
				return nil, peerreply.Machine.Malformedf("exec", "total_bytes %d is less than the %d bytes sent", f.TotalBytes, got)
			case f.Truncated != (f.TotalBytes > got) || (f.Truncated && got != MaxOutputBytes):
				return nil, peerreply.Machine.Malformedf("exec", "truncated=%v with %d of %d bytes sent", f.Truncated, got, f.TotalBytes)
			case f.DurationMS < 0 || f.DurationMS > 2*MaxTimeoutMS:
				return nil, peerreply.Machine.Malformedf("exec", "duration_ms %d", f.DurationMS)
			case f.Partial != (f.Reason != "") || (f.Reason != "" && f.Reason != ReasonTimeout):
				return nil, peerreply.Machine.Malformedf("exec", "partial=%v with reason %q", f.Partial, f.Reason)
			case f.Partial && f.ExitCode != nil:
				return nil, peerreply.Machine.Malformedf("exec", "a partial result with an exit code")
			case f.ExitCode != nil && (*f.ExitCode < -1<<31 || *f.ExitCode > 1<<32-1):
				return nil, peerreply.Machine.Malformedf("exec", "exit_code %d", *f.ExitCode)
			}
			res.ExitCode, res.Partial, res.Reason = f.ExitCode, f.Partial, f.Reason
			res.Truncated, res.TotalBytes, res.DurationMS = f.Truncated, f.TotalBytes, f.DurationMS
			return finish(res, &stdout, &stderr), nil
		default:
			return nil, peerreply.Machine.Malformedf("exec", "an unexpected %q frame", text.Clean(f.Type, 32))
		}
	}
}

// finish sets the output, PowerShell's CLIXML stderr turned back into text.
func finish(res *Result, stdout, stderr *bytes.Buffer) *Result {
	res.Stdout = stdout.String()
	errText := stderr.Bytes()
	if res.Shell == string(shell.PowerShell) {
		errText, _ = shell.DecodeCLIXML(errText)
	}
	res.Stderr = string(errText)
	return res
}

var errLineTooLong = errors.New("line too long")

// readLine reads one NDJSON line of at most maxFrameLine bytes (without its newline).
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > maxFrameLine+1 {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err // a line without its newline is a cut stream
		}
	}
}
