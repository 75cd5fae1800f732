package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

func TestRenderProgress(t *testing.T) {
	got := renderProgress("sb-0123456789ab:/f", 25<<20, 100<<20, 5*time.Second, false)
	for _, want := range []string{"[======                  ]", " 25%", "25.0 MiB/100.0 MiB", "5.0 MiB/s", "ETA 15s"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	got = renderProgress("x", 100<<20, 100<<20, 4*time.Second, true)
	if !strings.Contains(got, "100%") || !strings.Contains(got, "25.0 MiB/s in 4s") || strings.Contains(got, "ETA") {
		t.Errorf("final: %q", got)
	}
	if got := renderProgress("x", 3<<10, 0, time.Second, false); !strings.Contains(got, "x 3.0 KiB 3.0 KiB/s") || strings.Contains(got, "%") {
		t.Errorf("unknown total: %q", got)
	}
}

// A copy that ends before progressDelay draws nothing; a slow one draws and ends its line.
func TestProgressQuietWhenFast(t *testing.T) {
	var out bytes.Buffer
	p := startProgress(&out, "f", 10)
	_, _ = io.Copy(io.Discard, p.reader(strings.NewReader("0123456789")))
	p.finish()
	if out.Len() != 0 {
		t.Fatalf("a fast copy drew %q", out.String())
	}
	var slow bytes.Buffer // written by the bar's goroutine, read after finish waited for it
	p = startProgress(&slow, "f", 10)
	_, _ = io.Copy(io.Discard, p.reader(strings.NewReader("01234")))
	time.Sleep(progressDelay + 2*progressInterval)
	p.finish()
	if s := slow.String(); !strings.Contains(s, "\r") || !strings.HasSuffix(s, "\n") || !strings.Contains(s, " 50%") {
		t.Fatalf("slow copy drew %q", s)
	}
}
