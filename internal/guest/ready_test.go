package guest_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// TestWaitReadyKeepsTheDialersReason: a dialer that blocks until the health call's context ends
// (a pod still pulling its image) fails WaitReady with the dialer's own reason, not the bare
// context error net/http reports for a dial it cut short.
func TestWaitReadyKeepsTheDialersReason(t *testing.T) {
	c := guest.NewClient(func(ctx context.Context) (net.Conn, error) {
		<-ctx.Done()
		return nil, errors.New("its pod is Pending, container sandbox: ContainerCreating: " + ctx.Err().Error())
	})
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	err := c.WaitReady(ctx)
	if err == nil || !strings.Contains(err.Error(), "ContainerCreating") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReady: %v; want the dialer's reason and the deadline", err)
	}
}

// TestWaitReadyPermanentDialError: a dial error marked permanent ends WaitReady at once, with
// its code kept; any other error is retried until the deadline.
func TestWaitReadyPermanentDialError(t *testing.T) {
	var dials atomic.Int32
	c := guest.NewClient(func(ctx context.Context) (net.Conn, error) {
		if dials.Add(1) < 3 {
			return nil, errors.New("connection refused")
		}
		return nil, guest.Permanent(errcode.New(errcode.SandboxNotRunning, "sandbox x's pod cannot start: ErrImagePull"))
	})
	began := time.Now()
	err := c.WaitReady(context.Background())
	if err == nil || !errcode.Is(err, errcode.SandboxNotRunning) || !strings.Contains(err.Error(), "ErrImagePull") {
		t.Fatalf("WaitReady: %v; want the permanent error", err)
	}
	if dials.Load() != 3 || time.Since(began) > 2*time.Second {
		t.Fatalf("WaitReady dialed %d times over %v; want 3, at once", dials.Load(), time.Since(began))
	}
	if guest.Permanent(nil) != nil {
		t.Fatal("Permanent(nil) is not nil")
	}
}
