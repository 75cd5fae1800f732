package tmpfs

import "testing"

func TestSizes(t *testing.T) {
	for _, tc := range []struct{ mem, tmp, shm int64 }{
		{0, 1024, 64}, {32, 16, 4}, {64, 16, 8}, {128, 32, 16}, {256, 64, 32}, {4096, 1024, 64},
	} {
		if got := TmpMiB(tc.mem); got != tc.tmp {
			t.Errorf("TmpMiB(%d) = %d, want %d", tc.mem, got, tc.tmp)
		}
		if got := ShmMiB(tc.mem); got != tc.shm {
			t.Errorf("ShmMiB(%d) = %d, want %d", tc.mem, got, tc.shm)
		}
	}
}
