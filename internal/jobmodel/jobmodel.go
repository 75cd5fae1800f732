// Package jobmodel is what the two kinds of detached jobs share: jobs inside a sandbox (run by
// the sandbox's agent, recorded by the control plane) and jobs on a joined machine (run by the
// machine's agent, recorded by the server). It names their states and which are final, the
// shape of their ids (one generator and one validator, each kind keeping its prefix and
// length), the bounds of a log page and of a cancel's grace, with their checks and
// conversions, so both sides of both wires agree.
//
// It imports only the standard library and errcode: the machine agent (Linux, macOS, Windows)
// and the in-sandbox agent use it.
package jobmodel

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// State is where a job is.
type State string

// The states. A job in a final state (anything but Starting and Running) never changes again.
const (
	// Starting: recorded, and its agent has not yet said it runs it.
	Starting State = "starting"
	Running  State = "running"
	// Exited: the job's process ended by itself; its exit code says how.
	Exited State = "exited"
	// Killed: a signal ended it.
	Killed State = "killed"
	// Canceled: a cancel (or its sandbox's end) stopped it.
	Canceled State = "canceled"
	// Failed: it never started.
	Failed State = "failed"
	// Unknown: nothing says how it ended (its agent lost its record, or SIGKILL from outside).
	// Never a success.
	Unknown State = "unknown"
)

// States are all the states, in the order a job moves through them.
var States = []State{Starting, Running, Exited, Killed, Canceled, Failed, Unknown}

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	switch s {
	case Starting, Running, Exited, Killed, Canceled, Failed, Unknown:
		return true
	}
	return false
}

// Active reports whether a job in state s may still be running.
func (s State) Active() bool { return s == Starting || s == Running }

// Final reports whether s is a known state a job never leaves.
func (s State) Final() bool { return s.Valid() && !s.Active() }

// IDFormat is the shape of one kind of job id: Prefix and Hex lowercase hex digits. The server
// chooses the id (so its record exists before the agent is asked); the agent checks it (it
// names a directory there).
type IDFormat struct {
	Prefix string
	Hex    int
}

// The id formats. Ids already stored keep validating: these are the shapes they were made in.
var (
	// SandboxJobID: a job inside a sandbox, "job-" and 12 hex digits.
	SandboxJobID = IDFormat{Prefix: "job-", Hex: 12}
	// MachineJobID: a job on a joined machine, "rjob-" and 16 hex digits.
	MachineJobID = IDFormat{Prefix: "rjob-", Hex: 16}
)

// New returns a fresh random id.
func (f IDFormat) New() string {
	b := make([]byte, (f.Hex+1)/2)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on the platforms Go supports
	}
	return f.Prefix + hex.EncodeToString(b)[:f.Hex]
}

// Valid reports whether id has the format.
func (f IDFormat) Valid(id string) bool {
	h, ok := strings.CutPrefix(id, f.Prefix)
	return ok && len(h) == f.Hex && strings.IndexFunc(h, func(r rune) bool { return (r < '0' || r > '9') && (r < 'a' || r > 'f') }) < 0
}

// Check is Valid as an error that says what a job id looks like.
func (f IDFormat) Check(id string) error {
	if f.Valid(id) {
		return nil
	}
	if len(id) > 64 {
		id = id[:64] + "…"
	}
	return fmt.Errorf("job_id %q is not a job id: it must be %q followed by %d lowercase hex digits", strings.ToValidUTF8(id, "\uFFFD"), f.Prefix, f.Hex)
}

// Bounds of a log read, the same for every kind of job.
const (
	// MaxLogBytes is the most one page of a log returns; DefaultLogBytes a page's default.
	MaxLogBytes     = 256 << 10
	DefaultLogBytes = 64 << 10
	// MaxTailLines is the most lines a tail may ask for; DefaultTailLines a tail's default.
	MaxTailLines     = 10000
	DefaultTailLines = 200
)

// LogPage selects part of a job's output: with Offset, MaxBytes bytes from it (0: the
// default); without, the last TailLines lines (0: the default) of the last MaxLogBytes.
type LogPage struct {
	Offset    *int64
	MaxBytes  int
	TailLines int
}

// Check refuses a page outside the bounds (INVALID_ARGUMENT naming the argument: offset_bytes,
// max_bytes, tail_lines) and fills its defaults; a tail's MaxBytes becomes MaxLogBytes.
func (p *LogPage) Check() error {
	bad := func(arg, f string, a ...any) error {
		return errcode.New(errcode.InvalidArgument, f, a...).With("argument", arg)
	}
	if p.Offset != nil {
		switch {
		case p.TailLines != 0:
			return bad("tail_lines", "tail_lines and offset_bytes together: pass one")
		case *p.Offset < 0:
			return bad("offset_bytes", "offset_bytes must be ≥ 0, not %d", *p.Offset)
		}
		if p.MaxBytes == 0 {
			p.MaxBytes = DefaultLogBytes
		}
		if p.MaxBytes < 1 || p.MaxBytes > MaxLogBytes {
			return bad("max_bytes", "max_bytes must be 1–%d, not %d", MaxLogBytes, p.MaxBytes)
		}
		return nil
	}
	if p.MaxBytes != 0 {
		return bad("max_bytes", "max_bytes goes with offset_bytes")
	}
	if p.TailLines == 0 {
		p.TailLines = DefaultTailLines
	}
	if p.TailLines < 1 || p.TailLines > MaxTailLines {
		return bad("tail_lines", "tail_lines must be 1–%d, not %d", MaxTailLines, p.TailLines)
	}
	p.MaxBytes = MaxLogBytes
	return nil
}

// Slice is where a page of a log lies: Data's bytes from Offset to NextOffset of a log of
// TotalBytes so far. Pass NextOffset as the next page's offset.
type Slice struct {
	Offset     int64 `json:"offset"`
	NextOffset int64 `json:"next_offset"`
	TotalBytes int64 `json:"total_bytes"`
}

// CheckSlice checks what an agent says a page is: n bytes (at most max) from Offset, within
// the log, and, for a read from an offset (offset not nil), from that offset (or the end of a
// shorter log).
func CheckSlice(s Slice, n int, max int, offset *int64) error {
	switch {
	case s.Offset < 0 || s.TotalBytes < 0:
		return fmt.Errorf("negative offset or size")
	case n > max:
		return fmt.Errorf("%d bytes of log for a slice of at most %d", n, max)
	case s.NextOffset != s.Offset+int64(n) || s.NextOffset > s.TotalBytes:
		return fmt.Errorf("slice %d+%d, next %d, of a log of %d bytes", s.Offset, n, s.NextOffset, s.TotalBytes)
	case offset != nil && s.Offset != min(*offset, s.TotalBytes):
		return fmt.Errorf("slice at %d for offset %d", s.Offset, *offset)
	}
	return nil
}

// Bounds of a cancel's grace: the time between SIGTERM and SIGKILL (in whole seconds too, for
// the surfaces that take them).
const (
	DefaultGraceSeconds = 10
	MaxGraceSeconds     = 600
	DefaultGrace        = DefaultGraceSeconds * time.Second
	MaxGrace            = MaxGraceSeconds * time.Second
)

// CheckGrace refuses a grace outside 0..MaxGrace (INVALID_ARGUMENT naming grace_seconds).
func CheckGrace(d time.Duration) error {
	if d < 0 || d > MaxGrace {
		return errcode.New(errcode.InvalidArgument, "grace_seconds must be between 0 and %d; got %g", MaxGraceSeconds, d.Seconds()).
			With("argument", "grace_seconds")
	}
	return nil
}

// GraceSeconds converts a grace given in seconds (a fraction allowed) and checks it.
func GraceSeconds(s float64) (time.Duration, error) {
	if math.IsNaN(s) || s < 0 || s > MaxGrace.Seconds() {
		return 0, errcode.New(errcode.InvalidArgument, "grace_seconds must be between 0 and %d; got %g", MaxGraceSeconds, s).
			With("argument", "grace_seconds")
	}
	d := time.Duration(s * float64(time.Second))
	return d, CheckGrace(d)
}
