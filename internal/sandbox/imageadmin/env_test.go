package imageadmin_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/imageadmin"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// The image calls' tests run the lifecycle core on the fake runtime over SQLite, with the
// feature made over its Core handle as cmd/agentbox's wiring makes it.

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

type fakeEnv struct {
	st    *sqlite.Store
	rt    *fake.Runtime
	svc   *sandbox.Service
	imgs  *imageadmin.Service
	clock *clock
	cfg   sandbox.Config
}

func newFakeEnv(t *testing.T, cfg sandbox.Config) *fakeEnv {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Now().UTC().Truncate(time.Millisecond)}
	if cfg.Now == nil {
		cfg.Now = c.Now
	}
	e := &fakeEnv{st: st, rt: rt, clock: c, cfg: cfg}
	e.restart(t)
	t.Cleanup(func() {
		e.svc.Close()
		rt.SetFault(nil)
		rt.Shutdown(context.Background())
		st.Close()
	})
	return e
}

// restart replaces the service (and the feature over it) with a new one over the same store
// and runtime, as a restarted server, and reconciles it.
func (e *fakeEnv) restart(t *testing.T) {
	t.Helper()
	if e.svc != nil {
		e.svc.Close()
	}
	svc, err := sandbox.NewService(e.st, []runtime.Runtime{e.rt}, e.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	e.imgs = imageadmin.New(svc.Core(), e.st)
	if err := svc.Reconcile(t.Context()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
}

func (e *fakeEnv) create(t *testing.T, req sandbox.CreateRequest) sandbox.Sandbox {
	t.Helper()
	sb, err := e.svc.Create(t.Context(), req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return sb
}

func (e *fakeEnv) state(t *testing.T, id string) sandbox.State {
	t.Helper()
	sb, err := e.svc.Get(t.Context(), id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return sb.State
}

func (e *fakeEnv) eventsOf(t *testing.T, id, typ string) []sandbox.Event {
	t.Helper()
	evs, err := e.svc.Events(t.Context(), sandbox.EventFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	var out []sandbox.Event
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}
