package main

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
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

// The bar needs stdout and stderr both terminals: `cp ID:PATH - | x` (stdout a pipe, stderr the
// terminal) and `cp … 2>log` stay quiet.
func TestProgressNeedsTerminals(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	defer tty.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	stdout, stderr := os.Stdout, os.Stderr
	defer func() { os.Stdout, os.Stderr = stdout, stderr }()
	for _, tc := range []struct {
		name           string
		stdout, stderr *os.File
		bar            bool
	}{
		{"both terminals", tty, tty, true},
		{"stdout a pipe", w, tty, false},
		{"stderr a pipe", tty, w, false},
		{"neither", w, w, false},
	} {
		os.Stdout, os.Stderr = tc.stdout, tc.stderr
		p := newProgress("x", 10)
		os.Stdout, os.Stderr = stdout, stderr
		if (p != nil) != tc.bar {
			t.Errorf("%s: a bar %v, want %v", tc.name, p != nil, tc.bar)
		}
		if p != nil && p.out != tc.stderr {
			t.Errorf("%s: the bar does not draw on stderr", tc.name)
		}
		p.finish()
	}
}
