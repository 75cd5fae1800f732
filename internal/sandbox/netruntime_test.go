package sandbox_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/netsession"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// noEgress is the fake runtime declaring network mode none only (a runtime that cannot carry
// a sandbox's egress).
type noEgress struct{ *fake.Runtime }

func (r noEgress) Capabilities() runtime.Capabilities {
	c := r.Runtime.Capabilities()
	c.NetworkModes = []string{runtime.NetworkNone}
	return c
}

// TestCreatePicksEgressRuntime: on a server whose default runtime (runc) offers no egress, a
// create with a network policy or requirements.network "egress" lands on the runtime that
// does (crun), "none" on the default; asking for runc with a policy, and an unknown mode, are
// refused before anything is created.
func TestCreatePicksEgressRuntime(t *testing.T) {
	t.Parallel()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	runc, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	crun, err := fake.New(fake.Config{Name: "crun"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := netConfig(func(string) error { return nil })
	svc, err := sandbox.NewService(st, []runtime.Runtime{noEgress{runc}, crun}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	netsession.New(svc.Core(), st) // the network feature checks and sets a create's policy
	t.Cleanup(func() {
		svc.Close()
		runc.Shutdown(context.Background())
		crun.Shutdown(context.Background())
		st.Close()
	})
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		req  sandbox.CreateRequest
		want string
	}{
		{"Default", sandbox.CreateRequest{}, "runc"},
		{"RequiresNone", sandbox.CreateRequest{Requirements: sandbox.Requirements{Network: "none"}}, "runc"},
		{"Policy", sandbox.CreateRequest{Network: policy("example.com")}, "crun"},
		{"RequiresEgress", sandbox.CreateRequest{Requirements: sandbox.Requirements{Network: "egress"}}, "crun"},
	} {
		sb, err := svc.Create(ctx, tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if sb.Runtime != tc.want {
			t.Errorf("%s: created on %s, want %s", tc.name, sb.Runtime, tc.want)
		}
	}
	before, _ := svc.List(ctx, sandbox.ListFilter{})
	_, err = svc.Create(ctx, sandbox.CreateRequest{Runtime: "runc", Network: policy("example.com")})
	wantCode(t, err, errcode.RuntimeUnavailable, "runtime runc offers network modes none, not egress, and the sandbox has a network policy; ask for runtime crun")
	_, err = svc.Create(ctx, sandbox.CreateRequest{Requirements: sandbox.Requirements{Network: "bridge"}})
	wantCode(t, err, errcode.InvalidArgument, `requirements.network "bridge" must be one of none, egress`)
	after, _ := svc.List(ctx, sandbox.ListFilter{})
	if len(after) != len(before) {
		t.Errorf("refused creates left %d sandboxes", len(after)-len(before))
	}
	if caps := svc.Runtimes(); !slices.ContainsFunc(caps, func(c runtime.Capabilities) bool {
		return c.Name == "runc" && slices.Equal(c.NetworkModes, []string{runtime.NetworkNone})
	}) {
		t.Errorf("runtimes = %+v", caps)
	}
}
