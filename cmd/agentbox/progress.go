package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// progress draws a one-line progress bar (bytes, rate, ETA) on a terminal while a copy runs.
// It draws nothing unless stdout and stderr are both terminals, and nothing for a copy that ends
// within progressDelay, so small copies stay quiet.
type progress struct {
	out   io.Writer
	label string
	total int64 // 0: unknown
	start time.Time

	mu    sync.Mutex
	done  int64
	drawn bool
	stop  chan struct{}
	ended chan struct{}
}

const (
	progressDelay    = 500 * time.Millisecond
	progressInterval = 200 * time.Millisecond
)

// newProgress returns a progress bar on stderr if stdout and stderr are both terminals, else nil
// (a nil *progress counts nothing and draws nothing). The bar draws on stderr, but a copy whose
// stdout is a pipe or a file (`agentbox cp ID:PATH - | x`, a script's redirect) stays quiet.
func newProgress(label string, total int64) *progress {
	if !terminals(os.Stdout, os.Stderr) {
		return nil
	}
	return startProgress(os.Stderr, label, total)
}

// terminals reports whether every one of files is a terminal.
func terminals(files ...*os.File) bool {
	for _, f := range files {
		if f == nil || !term.IsTerminal(int(f.Fd())) {
			return false
		}
	}
	return true
}

func startProgress(out io.Writer, label string, total int64) *progress {
	p := &progress{out: out, label: label, total: total, start: time.Now(), stop: make(chan struct{}), ended: make(chan struct{})}
	go p.loop()
	return p
}

func (p *progress) loop() {
	defer close(p.ended)
	t := time.NewTicker(progressInterval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			if time.Since(p.start) >= progressDelay {
				p.draw(false)
			}
		}
	}
}

// reader counts what is read through r.
func (p *progress) reader(r io.Reader) io.Reader {
	if p == nil {
		return r
	}
	return &countingReader{r: r, p: p}
}

type countingReader struct {
	r io.Reader
	p *progress
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.p.mu.Lock()
	c.p.done += int64(n)
	c.p.mu.Unlock()
	return n, err
}

// finish stops the bar; a bar that was drawn gets its final state and a newline.
func (p *progress) finish() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.ended
	p.mu.Lock()
	drawn := p.drawn
	p.mu.Unlock()
	if drawn {
		p.draw(true)
		fmt.Fprintln(p.out)
	}
}

func (p *progress) draw(final bool) {
	p.mu.Lock()
	done := p.done
	p.drawn = true
	p.mu.Unlock()
	fmt.Fprint(p.out, "\r"+renderProgress(p.label, done, p.total, time.Since(p.start), final)+"\x1b[K")
}

// renderProgress is one line: label, bar and percent (when the total is known), bytes, rate and
// ETA.
func renderProgress(label string, done, total int64, elapsed time.Duration, final bool) string {
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(done) / s
	}
	var b strings.Builder
	b.WriteString(label)
	if total > 0 {
		frac := min(float64(done)/float64(total), 1)
		const width = 24
		fill := int(frac * width)
		fmt.Fprintf(&b, " [%s%s] %3.0f%%", strings.Repeat("=", fill), strings.Repeat(" ", width-fill), frac*100)
		fmt.Fprintf(&b, " %s/%s", humanBytes(done), humanBytes(total))
	} else {
		fmt.Fprintf(&b, " %s", humanBytes(done))
	}
	fmt.Fprintf(&b, " %s/s", humanBytes(int64(rate)))
	switch {
	case final:
		fmt.Fprintf(&b, " in %s", elapsed.Round(100*time.Millisecond))
	case total > 0 && rate > 0 && done < total:
		eta := time.Duration(float64(total-done) / rate * float64(time.Second))
		fmt.Fprintf(&b, " ETA %s", eta.Round(time.Second))
	}
	return b.String()
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
