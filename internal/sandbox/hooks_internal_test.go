package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestHookSet: hooks run in registration order, a nil field is skipped, every Converge runs
// whatever an earlier one returned and the joined error names the feature, and registering
// while the core calls the hooks is safe (run under -race).
func TestHookSet(t *testing.T) {
	var hs hookSet
	var order []string
	hs.register(Hooks{Name: "a", Released: func(id string) { order = append(order, "a:"+id) },
		Converge: func(context.Context, bool) error { order = append(order, "a:converge"); return errors.New("boom") }})
	hs.register(Hooks{Name: "b"}) // no hooks at all
	hs.register(Hooks{Name: "c", Released: func(id string) { order = append(order, "c:"+id) },
		Converge: func(context.Context, bool) error { order = append(order, "c:converge"); return nil }})
	hs.released("sb-1")
	err := hs.converge(t.Context(), false)
	if got := strings.Join(order, ","); got != "a:sb-1,c:sb-1,a:converge,c:converge" {
		t.Fatalf("hooks ran as %s", got)
	}
	if err == nil || err.Error() != "a: boom" {
		t.Fatalf("converge error %v, want a: boom", err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { hs.register(Hooks{Name: "late", Prune: func(context.Context, time.Time) {}}) })
		wg.Go(func() { hs.prune(t.Context(), time.Now()) })
	}
	wg.Wait()
	if n := len(hs.list()); n != 7 {
		t.Fatalf("%d hooks registered, want 7", n)
	}
}

// TestLateStart: a feature registered while a term of the control loop runs has its Start hook
// started in that term, and the term's wait waits for it; one registered after the term ended
// is not started in it.
func TestLateStart(t *testing.T) {
	var hs hookSet
	ctx, cancel := context.WithCancel(t.Context())
	wait := hs.start(ctx)
	started, ended := make(chan context.Context, 1), make(chan struct{})
	hs.register(Hooks{Name: "late", Start: func(ctx context.Context) func() {
		started <- ctx
		return func() { <-ctx.Done(); close(ended) }
	}})
	select {
	case got := <-started:
		if got != ctx {
			t.Fatalf("late Start got another context")
		}
	default:
		t.Fatal("a feature registered during a term was not started in it")
	}
	cancel()
	wait()
	select {
	case <-ended:
	default:
		t.Fatal("the term's wait returned before the late feature's loop ended")
	}
	hs.register(Hooks{Name: "after", Start: func(context.Context) func() {
		t.Error("a feature registered after the term was started in it")
		return func() {}
	}})
}
