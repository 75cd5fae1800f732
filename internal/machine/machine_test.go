package machine_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/agent"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// server is a registry over a real SQLite store behind a real HTTP server on loopback, serving
// only the two machine routes (the REST layer adds auth and the rest).
type server struct {
	reg *machine.Registry
	st  *sqlite.Store
	srv *httptest.Server
}

func newServer(t *testing.T) *server {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	reg := machine.New(st, machine.Options{HeartbeatInterval: 200 * time.Millisecond})
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+proto.JoinPath, func(w http.ResponseWriter, r *http.Request) {
		var req proto.JoinRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, proto.MaxJoinBody)).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		rep, err := reg.Enroll(r.Context(), req)
		if err != nil {
			w.WriteHeader(errcode.HTTPStatus(errcode.Of(err)))
			_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": string(errcode.Of(err)), "message": errcode.Message(err)}})
			return
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("GET "+proto.ConnectPath, reg.ServeConnect)
	s := &server{reg: reg, st: st, srv: httptest.NewServer(mux)}
	t.Cleanup(func() {
		s.srv.CloseClientConnections()
		reg.Close()
		s.srv.Close()
		st.Close()
	})
	return s
}

// testHandler answers /echo with the machine's name, proving which agent a stream reached.
func testHandler(name string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", agent.Handler(agent.HandlerOptions{}))
	mux.HandleFunc("GET /echo", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from "+name) })
	return mux
}

type runningAgent struct {
	cancel    context.CancelFunc
	done      chan error
	connected chan struct{}
}

func startAgent(t *testing.T, cfg agent.Config, st agent.State) *runningAgent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := &runningAgent{cancel: cancel, done: make(chan error, 1), connected: make(chan struct{}, 16)}
	cfg.Connected = func() { a.connected <- struct{}{} }
	go func() { a.done <- agent.Run(ctx, cfg, st) }()
	t.Cleanup(func() { cancel(); <-a.done })
	return a
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func twoGPUs(context.Context) ([]gpu.GPU, error) {
	return gpu.Parse([]byte("0, NVIDIA GeForce RTX 3090, 24576, 1234, 7\n1, NVIDIA A100-SXM4-80GB, 81920, 0, 0\n"))
}

// TestJoinConnectClient: a machine joins with a token, connects, heartbeats (last_seen and
// GPUs recorded), and a stream opened through Registry.Client reaches its handler; it is
// addressed by id, name and alias; an unknown machine is MACHINE_NOT_FOUND.
func TestJoinConnectClient(t *testing.T) {
	s := newServer(t)
	ctx := t.Context()
	tok, err := s.reg.CreateToken(ctx, machine.TokenRequest{Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{ServerURL: s.srv.URL, StateDir: t.TempDir(), Handler: testHandler("box1"), GPUs: twoGPUs,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	st, err := agent.Enroll(ctx, cfg, tok.Secret, "box1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Enroll(ctx, cfg, tok.Secret, "box1"); err == nil {
		t.Fatal("a second enrollment into the same state dir was accepted")
	}
	before, _ := s.reg.Get(ctx, "box1")
	if before.Online || before.LastSeen != nil {
		t.Fatalf("before connecting: %+v", before)
	}
	startAgent(t, cfg, st)
	waitFor(t, "online with a heartbeat", func() bool {
		i, err := s.reg.Get(ctx, st.MachineID)
		return err == nil && i.Online && i.LastSeen != nil
	})
	i, _ := s.reg.Get(ctx, "box1")
	if len(i.GPUs) != 2 || i.GPUs[1].Name != "NVIDIA A100-SXM4-80GB" || i.Platform == "" || i.AgentVersion == "" {
		t.Fatalf("facts: %+v", i)
	}
	if time.Since(*i.LastSeen) > 5*time.Second {
		t.Fatalf("last_seen %v is not recent", i.LastSeen)
	}
	if _, err := s.reg.AddAlias(ctx, "box1", "trainer"); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{st.MachineID, "box1", "trainer"} {
		hc, m, err := s.reg.Client(ctx, ref)
		if err != nil || m.ID != st.MachineID {
			t.Fatalf("Client(%q): %v", ref, err)
		}
		resp, err := hc.Get("http://machine/echo")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "hello from box1" {
			t.Fatalf("echo via %q: %q", ref, b)
		}
	}
	if info, err := s.reg.Probe(ctx, "trainer"); err != nil || info.PID != os.Getpid() || info.AgentVersion == "" {
		t.Fatalf("probe: %+v %v", info, err)
	}
	// Concurrent streams over the one session.
	hc, _, _ := s.reg.Client(ctx, "box1")
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := hc.Get("http://machine/agent/info")
			if err != nil {
				t.Error(err)
				return
			}
			var info agent.Info
			if err := json.NewDecoder(resp.Body).Decode(&info); err != nil || info.PID == 0 {
				t.Errorf("info: %+v %v", info, err)
			}
			resp.Body.Close()
		}()
	}
	wg.Wait()
	if _, _, err := s.reg.Client(ctx, "nope"); errcode.Of(err) != errcode.MachineNotFound {
		t.Fatalf("unknown: %v", err)
	}
}

// TestTokenRefusals: a used-up, expired or revoked token, and bad input, enroll nothing.
func TestTokenRefusals(t *testing.T) {
	s := newServer(t)
	ctx := t.Context()
	tok, err := s.reg.CreateToken(ctx, machine.TokenRequest{Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{ServerURL: s.srv.URL, GPUs: twoGPUs}
	cfg.StateDir = t.TempDir()
	if _, err := agent.Enroll(ctx, cfg, tok.Secret, "a"); err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = t.TempDir()
	if _, err := agent.Enroll(ctx, cfg, tok.Secret, "b"); errcode.Of(err) != errcode.AuthFailed {
		t.Fatalf("used up: %v", err)
	}
	rev, _ := s.reg.CreateToken(ctx, machine.TokenRequest{Uses: 5})
	if _, err := s.reg.RevokeToken(ctx, rev.Token.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Enroll(ctx, cfg, rev.Secret, "b"); errcode.Of(err) != errcode.AuthFailed {
		t.Fatalf("revoked: %v", err)
	}
	ok, _ := s.reg.CreateToken(ctx, machine.TokenRequest{Uses: 5})
	for _, name := range []string{"UPPER", "mc-123", "tokens", "-x", string(make([]byte, 64))} {
		if _, err := agent.Enroll(ctx, cfg, ok.Secret, name); errcode.Of(err) != errcode.InvalidArgument {
			t.Fatalf("name %q: %v", name, err)
		}
	}
	for _, req := range []machine.TokenRequest{{Uses: -1}, {Uses: machine.MaxTokenUses + 1}, {Expires: "1s"}, {Expires: "721h"}, {Expires: "soon"}} {
		if _, err := s.reg.CreateToken(ctx, req); errcode.Of(err) != errcode.InvalidArgument {
			t.Fatalf("token %+v: %v", req, err)
		}
	}
	l, _ := s.reg.ListTokens(ctx)
	if len(l) != 3 {
		t.Fatalf("tokens: %+v", l)
	}
	ms, _ := s.reg.List(ctx)
	if len(ms) != 1 {
		t.Fatalf("machines: %+v", ms)
	}
}

// TestReconnectReplacesAndRemoveCutsOff: a second connection of the same machine replaces the
// first; removing the machine cuts its session at once, its agent is refused (Run returns
// ErrRemoved) and Client says MACHINE_NOT_FOUND.
func TestReconnectReplacesAndRemoveCutsOff(t *testing.T) {
	s := newServer(t)
	ctx := t.Context()
	tok, _ := s.reg.CreateToken(ctx, machine.TokenRequest{Uses: 1})
	cfg := agent.Config{ServerURL: s.srv.URL, StateDir: t.TempDir(), Handler: testHandler("one"), GPUs: twoGPUs,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	st, err := agent.Enroll(ctx, cfg, tok.Secret, "m1")
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, cfg, st)
	<-a.connected
	waitFor(t, "online", func() bool { i, _ := s.reg.Get(ctx, "m1"); return i.Online })
	// The same identity from a second agent (a restarted one): the newer session wins.
	cfg2 := cfg
	cfg2.Handler = testHandler("two")
	b := startAgent(t, cfg2, st)
	<-b.connected
	waitFor(t, "the newer session answers", func() bool {
		hc, _, err := s.reg.Client(ctx, "m1")
		if err != nil {
			return false
		}
		resp, err := hc.Get("http://machine/echo")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body) == "hello from two"
	})
	b.cancel()
	<-b.done
	b.done <- nil // for the cleanup
	// The first agent reconnects (backoff) once the second is gone.
	waitFor(t, "first agent back", func() bool { i, _ := s.reg.Get(ctx, "m1"); return i.Online })
	if _, err := s.reg.Remove(ctx, "m1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a.done:
		if !errors.Is(err, agent.ErrRemoved) {
			t.Fatalf("agent after remove: %v", err)
		}
		a.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("agent kept running after its machine was removed")
	}
	if s.reg.Online() != 0 {
		t.Fatalf("%d sessions after remove", s.reg.Online())
	}
	if _, _, err := s.reg.Client(ctx, st.MachineID); errcode.Of(err) != errcode.MachineNotFound {
		t.Fatalf("client after remove: %v", err)
	}
}

// TestOfflineAndForgedProof: a joined machine without a session is MACHINE_OFFLINE; a
// connection signing with another key is refused.
func TestOfflineAndForgedProof(t *testing.T) {
	s := newServer(t)
	ctx := t.Context()
	tok, _ := s.reg.CreateToken(ctx, machine.TokenRequest{Uses: 2})
	cfg := agent.Config{ServerURL: s.srv.URL, StateDir: t.TempDir(), GPUs: twoGPUs}
	st, err := agent.Enroll(ctx, cfg, tok.Secret, "m1")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.reg.Client(ctx, "m1"); errcode.Of(err) != errcode.MachineOffline {
		t.Fatalf("offline: %v", err)
	}
	other := cfg
	other.StateDir = t.TempDir()
	st2, err := agent.Enroll(ctx, other, tok.Secret, "m2")
	if err != nil {
		t.Fatal(err)
	}
	forged := st
	forged.PrivateKey = st2.PrivateKey // m1's id, m2's key
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 100*time.Millisecond
	if err := agent.Run(rctx, cfg, forged); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("forged run: %v", err)
	}
	if s.reg.Online() != 0 {
		t.Fatal("a forged proof got a session")
	}
}
