package client_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestSubscribeRetriesAndEnds: Backend.Subscribe long-polls GET /v1/events from its cursor,
// retries a failed poll without losing or repeating an event, and when its context ends closes
// the channel and leaves no goroutine behind (TestMain's goleak check): the long poll in flight
// is abandoned, not waited out.
func TestSubscribeRetriesAndEnds(t *testing.T) {
	var polls atomic.Int32
	afters := make(chan string, 16)
	stop := make(chan struct{}) // ends held polls at the end, so that a client that never hangs up fails the test and does not hang it
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" {
			http.NotFound(w, r)
			return
		}
		n := polls.Add(1)
		afters <- r.URL.Query().Get("after")
		switch n {
		case 1: // the server fails once
			http.Error(w, `{"error":{"code":"INTERNAL","message":"boom"}}`, http.StatusInternalServerError)
		case 2:
			json.NewEncoder(w).Encode(api.EventList{Events: []sandbox.Event{{Seq: 8, SandboxID: "sb-000000000001", Type: "state", To: sandbox.StateRunning}}})
		default: // nothing happens: the poll is held until the caller goes
			select {
			case <-r.Context().Done():
			case <-stop:
			}
		}
	}))
	defer hs.Close()
	defer close(stop)
	be := client.NewBackend(client.New(hs.URL, ""))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := be.Subscribe(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-ch:
		if ev.Seq != 8 || ev.SandboxID != "sb-000000000001" {
			t.Fatalf("event %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10 s (the failed poll is retried after 1 s)")
	}
	for i, want := range []string{"7", "7", "8"} { // retried from the same cursor, then past the event
		select {
		case got := <-afters:
			if got != want {
				t.Fatalf("poll %d: after=%s, want %s", i+1, got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("poll %d never came", i+1)
		}
	}
	cancel()
	select {
	case ev, ok := <-ch:
		if ok {
			t.Fatalf("an event after the cancel: %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the channel did not close within 5 s of the cancel")
	}
	if _, err := be.Subscribe(context.Background(), -1); err == nil {
		t.Fatal("after=-1: no error")
	}
}
