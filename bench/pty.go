package main

import (
	"bytes"
	"context"
	"log"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/wire"
)

// benchPTY measures the keystroke echo round trip of a terminal over the REST WebSocket: one
// byte typed, the same byte back from `cat` in the sandbox (the terminal in raw mode, so the
// echo is the program's, not the line discipline's), n times.
func benchPTY(ctx context.Context, c *client.Client, id string, n int) Stat {
	p, err := c.PTY(ctx, id, wire.PTYRequest{Argv: []string{"sh", "-c", "stty raw -echo; echo ready; exec cat"}, Rows: 24, Cols: 80})
	if err != nil {
		log.Fatalf("pty: %v", err)
	}
	defer p.Close()
	var seen []byte
	for !bytes.Contains(seen, []byte("ready")) {
		b, x, err := p.Next()
		if err != nil || x != nil {
			log.Fatalf("pty: waiting for cat: %v %+v (output %q)", err, x, seen)
		}
		seen = append(seen, b...)
	}
	var rtts []float64
	for i := 0; i < n; i++ {
		key := []byte{byte('a' + i%26)}
		t0 := time.Now()
		if _, err := p.Write(key); err != nil {
			log.Fatalf("pty: write: %v", err)
		}
		for got := false; !got; {
			b, x, err := p.Next()
			if err != nil || x != nil {
				log.Fatalf("pty: echo: %v %+v", err, x)
			}
			got = bytes.Contains(b, key)
		}
		rtts = append(rtts, ms(time.Since(t0)))
	}
	s := summarize("PTY keystroke echo round trip (WebSocket)", "ms", rtts)
	s.Floor = "target p50 ≤ 5 ms"
	return s
}
