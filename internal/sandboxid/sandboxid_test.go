package sandboxid_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

func TestValid(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]bool{
		"sb-0123456789ab": true, "sb-abcdefabcdef": true,
		"sb-0123456789AB": false, "sb-0123": false, "sb-0123456789abc": false, "sb-0123456789a": false,
		"SB-0123456789ab": false, "xb-0123456789ab": false, "sb_0123456789ab": false, "": false,
		"../etc": false, "sb-0123456789ab/..": false, "sb-0123456789a/": false, "sb-0123456789ag": false,
		"sb-01234567\x0089ab": false, " sb-0123456789ab": false, "sb-0123456789ab\n": false,
	} {
		if sandboxid.Valid(id) != want {
			t.Errorf("Valid(%q) != %v", id, want)
		}
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	shape := regexp.MustCompile(`^sb-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := sandboxid.New()
		if !shape.MatchString(id) || !sandboxid.Valid(id) {
			t.Fatalf("New() = %q, not of the form sb-<12 lowercase hex digits>", id)
		}
		if seen[id] {
			t.Fatalf("New() returned %q twice", id)
		}
		seen[id] = true
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	if err := sandboxid.Check("sb-0123456789ab"); err != nil {
		t.Fatalf("Check of a valid id: %v", err)
	}
	long := "sb-" + strings.Repeat("x", 200)
	for _, id := range []string{"", "sb-0123456789AB", "../etc/passwd", long} {
		err := sandboxid.Check(id)
		e, ok := errcode.As(err)
		if !ok || e.Code != errcode.InvalidArgument || e.Details["argument"] != "sandbox_id" {
			t.Fatalf("Check(%q) = %v, want INVALID_ARGUMENT on sandbox_id", id, err)
		}
		if !strings.Contains(e.Message, `"sb-" and 12 lowercase hex digits`) || len(e.Message) > 400 {
			t.Fatalf("Check(%q): message %q does not name the shape, or quotes too much", id, e.Message)
		}
	}
}
