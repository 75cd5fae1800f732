package sandbox_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestConnectionsChanged: a waiter on a sandbox's records is woken when its connection records
// are written, not by another sandbox's, and waits anew after that.
func TestConnectionsChanged(t *testing.T) {
	t.Parallel()
	port := upstream(t)
	e := newFakeEnv(t, netConfig(func(string) error { return nil }))
	a := e.create(t, sandbox.CreateRequest{Network: policy(fmt.Sprintf("allowed.test:%d", port))})
	b := e.create(t, sandbox.CreateRequest{Network: policy(fmt.Sprintf("allowed.test:%d", port))})
	ra, err := e.net.SessionReply(t.Context(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := e.net.SessionReply(t.Context(), b.ID)
	if err != nil {
		t.Fatal(err)
	}
	wa, release := e.net.ConnectionsChanged(a.ID)
	defer release()
	if code, _ := viaProxy(t, rb.ProxyAddr, "other.test", port); code != http.StatusForbidden {
		t.Fatalf("b's refused GET = %d", code)
	}
	if err := e.net.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wa:
		t.Fatal("a's waiter was woken by b's records")
	default:
	}
	if code, _ := viaProxy(t, ra.ProxyAddr, "allowed.test", port); code != http.StatusOK {
		t.Fatalf("a's allowed GET = %d", code)
	}
	select {
	case <-wa: // the flush (every 100 ms) woke it
	case <-time.After(5 * time.Second):
		t.Fatal("a's waiter was not woken when a's record was written")
	}
	wa2, release2 := e.net.ConnectionsChanged(a.ID)
	defer release2()
	select {
	case <-wa2:
		t.Fatal("a new wait is already woken")
	default:
	}
}
