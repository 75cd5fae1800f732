package guest

import (
	"bytes"
	"strings"
	"testing"
)

func TestPTYFrameBounds(t *testing.T) {
	buf := make([]byte, MaxPTYData+maxPTYControl)
	var b bytes.Buffer
	_ = writeFrame(&b, ptyData, bytes.Repeat([]byte("x"), MaxPTYData))
	if typ, p, err := readFrame(&b, buf); err != nil || typ != ptyData || len(p) != MaxPTYData {
		t.Fatalf("largest data frame: %q %d %v", typ, len(p), err)
	}
	for _, c := range []struct {
		typ  byte
		size int
		want string
	}{
		{ptyData, MaxPTYData + 1, "at most 32768"},
		{ptyResize, 5, "at most 4"},
		{ptyExit, maxPTYControl + 1, "at most 8192"},
		{'z', 1, "unknown PTY frame type"},
	} {
		b.Reset()
		_ = writeFrame(&b, c.typ, make([]byte, c.size))
		if _, _, err := readFrame(&b, buf); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("frame %q of %d bytes: %v, want %q", c.typ, c.size, err, c.want)
		}
	}
}
