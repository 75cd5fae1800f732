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
