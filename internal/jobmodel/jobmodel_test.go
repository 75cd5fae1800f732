package jobmodel

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

func TestStates(t *testing.T) {
	for _, s := range States {
		if !s.Valid() || s.Active() == s.Final() {
			t.Errorf("%s: valid %v active %v final %v", s, s.Valid(), s.Active(), s.Final())
		}
	}
	if !Running.Active() || !Starting.Active() || !Exited.Final() || !Unknown.Final() {
		t.Error("active/final mixed up")
	}
	if State("succeeded").Valid() || State("succeeded").Final() || State("").Valid() {
		t.Error("an unknown state passes")
	}
}

// TestIDs: each kind keeps its prefix and length; ids stored before stay valid; nothing else is.
func TestIDs(t *testing.T) {
	for _, tc := range []struct {
		f      IDFormat
		stored string
		n      int
	}{{SandboxJobID, "job-0123456789ab", 16}, {MachineJobID, "rjob-0123456789abcdef", 21}} {
		seen := map[string]bool{}
		for range 100 {
			id := tc.f.New()
			if len(id) != tc.n || !strings.HasPrefix(id, tc.f.Prefix) || !tc.f.Valid(id) || seen[id] {
				t.Fatalf("New() = %q", id)
			}
			seen[id] = true
		}
		if !tc.f.Valid(tc.stored) || tc.f.Check(tc.stored) != nil {
			t.Errorf("stored id %q refused", tc.stored)
		}
		for _, bad := range []string{"", tc.f.Prefix, tc.stored + "0", tc.stored[:len(tc.stored)-1], strings.ToUpper(tc.stored),
			strings.Replace(tc.stored, "a", "g", 1), "x" + tc.stored, "../" + tc.stored} {
			if tc.f.Valid(bad) || tc.f.Check(bad) == nil {
				t.Errorf("%q accepted", bad)
			}
		}
	}
	if SandboxJobID.Valid(MachineJobID.New()) || MachineJobID.Valid(SandboxJobID.New()) {
		t.Error("one kind's id passes as the other's")
	}
	if err := SandboxJobID.Check("job-\xff" + strings.Repeat("x", 100)); err == nil || len(err.Error()) > 200 || !strings.Contains(err.Error(), "12 lowercase hex") {
		t.Errorf("Check: %v", err)
	}
}

func ptr(n int64) *int64 { return &n }

func TestLogPage(t *testing.T) {
	p := LogPage{}
	if err := p.Check(); err != nil || p.TailLines != DefaultTailLines || p.MaxBytes != MaxLogBytes {
		t.Errorf("default page: %+v %v", p, err)
	}
	p = LogPage{Offset: ptr(5)}
	if err := p.Check(); err != nil || p.MaxBytes != DefaultLogBytes {
		t.Errorf("offset page: %+v %v", p, err)
	}
	for name, p := range map[string]LogPage{
		"negative offset": {Offset: ptr(-1)},
		"max 0 bytes":     {Offset: ptr(0), MaxBytes: -1},
		"max too large":   {Offset: ptr(0), MaxBytes: MaxLogBytes + 1},
		"both":            {Offset: ptr(0), TailLines: 3},
		"max alone":       {MaxBytes: 10},
		"tail negative":   {TailLines: -1},
		"tail too many":   {TailLines: MaxTailLines + 1},
	} {
		if err := p.Check(); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestCheckSlice(t *testing.T) {
	ok := []struct {
		s      Slice
		n      int
		offset *int64
	}{
		{Slice{0, 10, 20}, 10, ptr(0)},
		{Slice{20, 20, 20}, 0, ptr(50)}, // past the end: an empty page at the end
		{Slice{15, 20, 20}, 5, nil},     // a tail
	}
	for _, c := range ok {
		if err := CheckSlice(c.s, c.n, 100, c.offset); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	bad := []struct {
		s      Slice
		n      int
		offset *int64
	}{
		{Slice{-1, 9, 20}, 10, nil},
		{Slice{0, 10, 5}, 10, nil},     // beyond the log
		{Slice{0, 11, 20}, 10, nil},    // next does not follow the data
		{Slice{0, 200, 300}, 200, nil}, // more than max
		{Slice{3, 13, 20}, 10, ptr(0)}, // not from the offset asked
	}
	for _, c := range bad {
		if err := CheckSlice(c.s, c.n, 100, c.offset); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestGrace(t *testing.T) {
	for _, s := range []float64{0, 0.5, 10, 600} {
		d, err := GraceSeconds(s)
		if err != nil || d != time.Duration(s*float64(time.Second)) {
			t.Errorf("GraceSeconds(%g) = %v %v", s, d, err)
		}
	}
	for _, s := range []float64{-1, 600.001, math.NaN(), math.Inf(1)} {
		if _, err := GraceSeconds(s); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("GraceSeconds(%g): %v", s, err)
		}
	}
	if CheckGrace(MaxGrace) != nil || CheckGrace(-time.Nanosecond) == nil || CheckGrace(MaxGrace+time.Nanosecond) == nil {
		t.Error("CheckGrace bounds")
	}
}
