package storetest

import (
	"maps"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

var imageTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"ImagesInUse", testImagesInUse},
	{"ImageDigestSurvivesUpdate", testImageDigestSurvivesUpdate},
}

// testImagesInUse: only live records count, each digest with its number of live sandboxes; the
// host image ("") is never listed.
func testImagesInUse(t *testing.T, s store.Store) {
	ctx := t.Context()
	got, err := s.ImagesInUse(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("empty store: %v %v", got, err)
	}
	d1, d2 := "sha256:"+hex64('a'), "sha256:"+hex64('b')
	mk := func(n int, st sandbox.State, digest string) sandbox.Sandbox {
		sb := newSandbox(n, st, base().Add(time.Duration(n)*time.Second), nil)
		sb.ImageDigest = digest
		return mustCreate(t, s, sb)
	}
	mk(0, sandbox.StateRunning, d1)
	mk(1, sandbox.StateCreating, d1)
	stopping := mk(2, sandbox.StateStopping, d2)
	mk(3, sandbox.StateFailed, d2)    // not live
	mk(4, sandbox.StateDestroyed, d1) // not live
	mk(5, sandbox.StateRunning, "")   // host image
	got, err = s.ImagesInUse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{d1: 2, d2: 1}; !maps.Equal(got, want) {
		t.Fatalf("ImagesInUse = %v, want %v", got, want)
	}
	done, ev := next(stopping, sandbox.StateDestroyed, base().Add(time.Minute), "destroyed")
	if err := s.UpdateSandbox(ctx, done, ev); err != nil {
		t.Fatal(err)
	}
	got, err = s.ImagesInUse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{d1: 2}; !maps.Equal(got, want) {
		t.Fatalf("after the destroy: ImagesInUse = %v, want %v", got, want)
	}
}

// testImageDigestSurvivesUpdate: an update keeps (and writes) the pinned digest.
func testImageDigestSurvivesUpdate(t *testing.T, s store.Store) {
	sb := newSandbox(7, sandbox.StateCreating, base(), nil)
	sb.ImageDigest = "sha256:" + hex64('c')
	mustCreate(t, s, sb)
	up, ev := next(sb, sandbox.StateRunning, base().Add(time.Second), "agent ready")
	if err := s.UpdateSandbox(t.Context(), up, ev); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, sb.ID); got.ImageDigest != sb.ImageDigest {
		t.Fatalf("ImageDigest after update = %q, want %q", got.ImageDigest, sb.ImageDigest)
	}
}

func hex64(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}
