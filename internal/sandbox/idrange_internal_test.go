package sandbox

import (
	"slices"
	"testing"
)

func TestIDPoolBases(t *testing.T) {
	t.Parallel()
	const size = 65536
	got, err := IDPool{Base: DefaultIDPoolBase, Size: size, Ranges: 3}.bases()
	if err != nil || !slices.Equal(got, []int64{200000, 200000 + size, 200000 + 2*size}) {
		t.Fatalf("default pool: %v %v", got, err)
	}
	// Blocks overlapping reserved ids are skipped; the pool never starts below 65536.
	reserved := []IDRange{{Base: 200000 + size + 5, Count: 1}, {Base: 200000 + 2*size - 10, Count: 20}}
	got, err = IDPool{Base: 200000, Size: size, Ranges: 2, Reserved: reserved}.bases()
	if err != nil || !slices.Equal(got, []int64{200000, 200000 + 3*size}) {
		t.Fatalf("with reserved ids: %v %v", got, err)
	}
	got, err = IDPool{Base: 1000, Size: size, Ranges: 1}.bases()
	if err != nil || !slices.Equal(got, []int64{65536}) {
		t.Fatalf("low base: %v %v", got, err)
	}
	// A pool that cannot fit below 2^32-1 is refused, as are empty ones.
	if _, err := (IDPool{Base: 200000, Size: size, Ranges: 70000}).bases(); err == nil {
		t.Error("a pool past 2^32 accepted")
	}
	if _, err := (IDPool{Base: 200000, Size: size, Ranges: 0}).bases(); err == nil {
		t.Error("an empty pool accepted")
	}
	for _, b := range got {
		if (IDRange{Base: b, Count: size}).End() > MaxHostID {
			t.Errorf("block at %d passes the last id", b)
		}
	}
}

func TestIDRangeOverlaps(t *testing.T) {
	t.Parallel()
	a := IDRange{Base: 100, Count: 10}
	for _, tc := range []struct {
		b    IDRange
		want bool
	}{
		{IDRange{Base: 90, Count: 10}, false}, {IDRange{Base: 110, Count: 5}, false},
		{IDRange{Base: 91, Count: 10}, true}, {IDRange{Base: 109, Count: 1}, true},
		{IDRange{Base: 0, Count: 1000}, true}, {IDRange{Base: 105, Count: 1}, true},
	} {
		if a.Overlaps(tc.b) != tc.want || tc.b.Overlaps(a) != tc.want {
			t.Errorf("%v overlaps %v: want %v", a, tc.b, tc.want)
		}
	}
	if !a.Contains(100) || !a.Contains(109) || a.Contains(110) || a.Contains(99) {
		t.Error("Contains")
	}
}
