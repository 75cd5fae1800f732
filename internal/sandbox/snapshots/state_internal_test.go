package snapshots

import (
	"strings"
	"testing"
)

// TestSnapState: a pin holds a snapshot until its last unpin (an unpin called twice counts
// once), and taking says which snapshots this process is taking.
func TestSnapState(t *testing.T) {
	var p snapState
	a, b := p.pin("snap-000000000001"), p.pin("snap-000000000001")
	if !p.pinned("snap-000000000001") || p.pinned("snap-000000000002") {
		t.Fatal("pinned: want only the pinned snapshot")
	}
	a()
	a() // once only
	if !p.pinned("snap-000000000001") {
		t.Fatal("one unpin (called twice) of two pins let the snapshot go")
	}
	b()
	if p.pinned("snap-000000000001") || len(p.pins) != 0 {
		t.Fatalf("after the last unpin: pinned, pins %v", p.pins)
	}
	p.begin("snap-000000000003")
	if !p.taking("snap-000000000003") || p.taking("snap-000000000001") {
		t.Fatal("taking: want only the snapshot begun")
	}
	p.end("snap-000000000003")
	if p.taking("snap-000000000003") {
		t.Fatal("taking after end")
	}
}

// TestCheckSnapshotID: only snap- and 12 lowercase hex digits pass, and the error names the
// field.
func TestCheckSnapshotID(t *testing.T) {
	if err := checkSnapshotID("snapshot_id", "snap-0123456789ab"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "snap-0123456789AB", "snap-0123456789a", "sb-0123456789ab", "snap-0123456789abc"} {
		if err := checkSnapshotID("after", bad); err == nil {
			t.Errorf("%q accepted", bad)
		} else if !strings.Contains(err.Error(), "after") {
			t.Errorf("%q: %v; want the field named", bad, err)
		}
	}
}
