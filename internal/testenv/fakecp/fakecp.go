// Package fakecp builds the control plane that tests of the surfaces use where no real sandbox
// is needed: real SQLite in the test's temp dir, the fake runtime (real in-process agents, no
// containers, no root) named "runc", and a sandbox.Service over them, all closed at the test's
// end (after whatever the test registers later, such as its servers).
package fakecp

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// CP is a test's control plane.
type CP struct {
	Store   *sqlite.Store
	Runtime *fake.Runtime
	Service *sandbox.Service
}

// New returns a control plane with cfg.
func New(t testing.TB, cfg sandbox.Config) *CP {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, cfg, nil)
	if err != nil {
		rt.Shutdown(context.Background())
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		svc.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return &CP{Store: st, Runtime: rt, Service: svc}
}

// Service is New's service with the default configuration.
func Service(t testing.TB) *sandbox.Service { return New(t, sandbox.Config{}).Service }
