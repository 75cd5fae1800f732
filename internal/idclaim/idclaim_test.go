package idclaim_test

import (
	"os"
	"testing"

	"github.com/agentbox/agentbox/internal/idclaim"
)

// TestTwoServersNeverShareARange: a range one server claims (or overlaps) is refused to another;
// Sync adopts the held ranges, drops the others, and names the held ranges another server claims.
func TestTwoServersNeverShareARange(t *testing.T) {
	dir := t.TempDir()
	stateA, stateB := t.TempDir(), t.TempDir()
	a, err := idclaim.New(dir, "agentbox-aaaa", stateA)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := idclaim.New(dir, "agentbox-bbbb", stateB)
	claim := func(c *idclaim.Claims, base int64) bool {
		t.Helper()
		ok, err := c.Claim(base, 65536)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !claim(a, 200000) || !claim(a, 200000) {
		t.Fatal("a server's first claim, or its own again, refused")
	}
	if claim(b, 200000) || claim(b, 200000+1000) {
		t.Fatal("another server got a range the first claims (or one overlapping it)")
	}
	if !claim(b, 265536) {
		t.Fatal("the next range, free, refused")
	}
	// a's store holds 331072 only (an installation from before the claims): adopted; 200000 dropped.
	conflicts, err := a.Sync(map[int64]int64{331072: 65536})
	if err != nil || len(conflicts) != 0 {
		t.Fatalf("sync: %v %v", conflicts, err)
	}
	if !claim(b, 200000) || claim(b, 331072) {
		t.Fatal("after a's sync: its dropped range should be free and its adopted one held")
	}
	// a's store also holds one b claims: named.
	if conflicts, err = a.Sync(map[int64]int64{331072: 65536, 265536: 65536}); err != nil || len(conflicts) != 1 {
		t.Fatalf("sync over b's range: %v %v; want one conflict", conflicts, err)
	}
	// b's state dir removed (b gone for good): its claims are stale, a takes its range.
	if err := os.RemoveAll(stateB); err != nil {
		t.Fatal(err)
	}
	if !claim(a, 200000) {
		t.Fatal("a range of a server whose state dir is gone stays claimed")
	}
}
