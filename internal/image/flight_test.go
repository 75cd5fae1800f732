package image

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestFlightLastCallerWaitsForTheWork: when the only caller of a flight gives up, the work is
// cancelled and the caller returns after it has ended (TestDigestMismatch's cleanup raced an
// abandoned layer's unpack that was still writing its temporary directory); a caller that is
// not the last returns at once and the work goes on for the others.
func TestFlightLastCallerWaitsForTheWork(t *testing.T) {
	var g flights
	var ended atomic.Bool
	work := func(ctx context.Context, _ ProgressFunc) (any, error) {
		<-ctx.Done()
		time.Sleep(200 * time.Millisecond) // the cleanup after a cancel
		ended.Store(true)
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := g.do(ctx, "k", nil, work); !errors.Is(err, context.Canceled) {
		t.Fatalf("do = %v, want context.Canceled", err)
	}
	if !ended.Load() {
		t.Fatal("the last caller returned while the abandoned work still ran")
	}

	// Two callers: the first leaves, the work goes on and the second gets its value.
	release := make(chan struct{})
	shared := func(ctx context.Context, _ ProgressFunc) (any, error) {
		select {
		case <-release:
			return 42, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	second := make(chan any, 1)
	go func() { v, _ := g.do(context.Background(), "s", nil, shared); second <- v }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		f := g.m["s"]
		started := f != nil && f.waiters == 1
		g.mu.Unlock()
		if started {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second caller's flight never started")
		}
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	began := time.Now()
	if _, err := g.do(ctx, "s", nil, shared); !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller: %v", err)
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Fatalf("a caller that was not the last waited %v for the work", d)
	}
	close(release)
	select {
	case v := <-second:
		if v != 42 {
			t.Fatalf("second caller got %v, want 42", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second caller never got the work's value")
	}
}
