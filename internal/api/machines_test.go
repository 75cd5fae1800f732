package api_test

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/agent"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/wire"
)

// argsRecorder is a gate that keeps every call's recorded arguments.
type argsRecorder struct {
	mu   sync.Mutex
	args []string
}

func (g *argsRecorder) Enter(_ context.Context, c *gate.Call) (func(error), error) {
	g.mu.Lock()
	g.args = append(g.args, c.Tool+" "+string(c.Args))
	g.mu.Unlock()
	return func(error) {}, nil
}

// TestMachineRoutes: join goes without a bearer token (the join token is its credential) and
// its body never reaches the gate's record; reads need read, tokens and removal admin; the
// token's secret is returned once and never listed; aliases add and remove; an unknown
// machine is 404 MACHINE_NOT_FOUND, an offline one's probe 503 MACHINE_OFFLINE.
func TestMachineRoutes(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "m.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg := machine.New(st, machine.Options{})
	t.Cleanup(reg.Close)
	rec := &argsRecorder{}
	s := newImageServer(t, api.Options{Keys: auth.NewKeys(st, nil), Gate: gate.Chain{rec, auth.ScopeGate{}}, Machines: reg})
	ctx := t.Context()
	admin := s.c
	reader := mustKey(t, admin, "reader", auth.ScopeRead, "")
	operator := mustKey(t, admin, "operator", auth.ScopeOperate, "")
	rc, oc := client.New(s.url, reader.Secret), client.New(s.url, operator.Secret)

	_, err = oc.CreateJoinToken(ctx, wire.TokenRequest{})
	denied(t, "operate key creates a join token", err, auth.ScopeAdmin)
	tok, err := admin.CreateJoinToken(ctx, wire.TokenRequest{Uses: 1, Expires: "1h"})
	if err != nil || !strings.HasPrefix(tok.Secret, machine.TokenPrefix) || tok.Token.UsesLeft != 1 {
		t.Fatalf("create token: %+v %v", tok, err)
	}
	resp, err := http.Get(s.url + "/v1/machines/tokens")
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("tokens without a key: %v %v", resp.Status, err)
	}
	resp.Body.Close()
	// The list never holds the secret.
	req, _ := http.NewRequest("GET", s.url+"/v1/machines/tokens", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	resp.Body.Close()
	if strings.Contains(buf.String(), tok.Secret) || strings.Contains(buf.String(), "secret") || !strings.Contains(buf.String(), tok.Token.ID) {
		t.Fatalf("token list: %s", buf.String())
	}

	// Join with no bearer token: the agent sends none.
	stt, err := agent.Enroll(ctx, agent.Config{ServerURL: s.url, StateDir: t.TempDir(), GPUs: func(context.Context) ([]gpu.GPU, error) { return nil, nil }}, tok.Secret, "box")
	if err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	sawJoin := false
	for _, a := range rec.args {
		sawJoin = sawJoin || strings.HasPrefix(a, "POST /v1/machines/join ")
		if strings.Contains(a, tok.Secret) || strings.Contains(a, "public_key") {
			t.Errorf("the gate saw the join body: %s", a)
		}
	}
	rec.mu.Unlock()
	if !sawJoin {
		t.Fatal("the join never passed the gate")
	}
	bad, _ := http.Post(s.url+"/v1/machines/join", "application/json", strings.NewReader(`{"token": 1}`))
	if bad.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad join body: %s", bad.Status)
	}
	bad.Body.Close()

	ms, err := rc.ListMachines(ctx)
	if err != nil || len(ms) != 1 || ms[0].ID != stt.MachineID || ms[0].Online || ms[0].LastSeen != nil {
		t.Fatalf("read key lists: %+v %v", ms, err)
	}
	_, err = rc.RemoveMachine(ctx, "box")
	denied(t, "read key removes", err, auth.ScopeAdmin)
	_, err = oc.AddMachineAlias(ctx, "box", "b")
	denied(t, "operate key aliases", err, auth.ScopeAdmin)
	if m, err := admin.AddMachineAlias(ctx, "box", "trainer"); err != nil || len(m.Aliases) != 1 {
		t.Fatalf("alias: %+v %v", m, err)
	}
	if _, err := admin.AddMachineAlias(ctx, "box", "Bad Alias"); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("bad alias: %v", err)
	}
	if m, err := rc.GetMachine(ctx, "trainer"); err != nil || m.ID != stt.MachineID {
		t.Fatalf("get by alias: %+v %v", m, err)
	}
	if m, err := admin.RemoveMachineAlias(ctx, "box", "trainer"); err != nil || len(m.Aliases) != 0 {
		t.Fatalf("remove alias: %+v %v", m, err)
	}
	if _, err := rc.ProbeMachine(ctx, "box"); errcode.Of(err) != errcode.MachineOffline {
		t.Fatalf("probe offline: %v", err)
	}
	if _, err := rc.GetMachine(ctx, "nope"); errcode.Of(err) != errcode.MachineNotFound {
		t.Fatalf("unknown: %v", err)
	}
	if _, err := admin.RevokeJoinToken(ctx, tok.Token.ID); err != nil {
		t.Fatal(err)
	}
	if m, err := admin.RemoveMachine(ctx, "box"); err != nil || m.RemovedAt == nil {
		t.Fatalf("remove: %+v %v", m, err)
	}
	if ms, _ := rc.ListMachines(ctx); len(ms) != 0 {
		t.Fatalf("after remove: %+v", ms)
	}
}
