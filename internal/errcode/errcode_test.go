package errcode

import (
	"errors"
	"fmt"
	"testing"
)

func TestOfAndMessage(t *testing.T) {
	t.Parallel()
	base := New(SandboxNotFound, "sandbox %q does not exist", "sb-1").With("sandbox_id", "sb-1")
	wrapped := fmt.Errorf("get: %w", base)
	if got := Of(wrapped); got != SandboxNotFound {
		t.Fatalf("Of = %q", got)
	}
	if got := Message(wrapped); got != `sandbox "sb-1" does not exist` {
		t.Fatalf("Message = %q", got)
	}
	if Of(errors.New("boom")) != Internal || Message(errors.New("secret detail")) == "secret detail" {
		t.Fatal("untyped errors must be Internal and not leak their text")
	}
	if Of(nil) != "" || Is(nil, Internal) {
		t.Fatal("nil error has no code")
	}
	cause := errors.New("disk on fire")
	w := Wrap(RuntimeUnavailable, cause, "runc failed")
	if !errors.Is(w, cause) || !Is(w, RuntimeUnavailable) {
		t.Fatal("Wrap must keep the cause")
	}
}
