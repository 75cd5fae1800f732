package machine_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/agent"
	"github.com/agentbox/agentbox/internal/machine/proto"
)

// dialRaw connects as st's machine by hand (the handshake the agent does) and returns the
// machine side of the yamux session, for tests that play a hostile machine.
func dialRaw(t *testing.T, url string, st agent.State) *yamux.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url+proto.ConnectPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, b, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ch proto.Challenge
	if err := json.Unmarshal(b, &ch); err != nil {
		t.Fatal(err)
	}
	sig := ed25519.Sign(ed25519.NewKeyFromSeed(st.PrivateKey), proto.SignedBytes(st.MachineID, ch.Nonce))
	pb, _ := json.Marshal(proto.Proof{MachineID: st.MachineID, Signature: sig})
	if err := c.Write(ctx, websocket.MessageText, pb); err != nil {
		t.Fatal(err)
	}
	if _, b, err = c.Read(ctx); err != nil || !strings.Contains(string(b), st.MachineID) {
		t.Fatalf("welcome: %s %v", b, err)
	}
	ys, err := yamux.Server(websocket.NetConn(context.Background(), c, websocket.MessageBinary), proto.YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ys.Close() })
	return ys
}

// TestHostileMachine: a heartbeat longer than the bound, one with too many GPUs, one that is
// not JSON, or none at all each end the session; a handler's oversized reply to the probe is
// an error, not a crash; nothing bad is recorded.
func TestHostileMachine(t *testing.T) {
	s := newServer(t) // heartbeat interval 200 ms: silence ends a session after 600 ms
	ctx := t.Context()
	tok, _ := s.reg.CreateToken(ctx, machine.TokenRequest{Uses: 2})
	st, err := agent.Enroll(ctx, agent.Config{ServerURL: s.srv.URL, StateDir: t.TempDir(), GPUs: twoGPUs}, tok.Secret, "evil")
	if err != nil {
		t.Fatal(err)
	}
	var many strings.Builder
	many.WriteString(`{"platform":"linux","arch":"amd64","agent_version":"1","sent_at":"2026-01-01T00:00:00Z","gpus":[`)
	for i := range 65 {
		if i > 0 {
			many.WriteString(",")
		}
		fmt.Fprintf(&many, `{"index":%d,"name":"g","memory_total_mb":1,"memory_used_mb":1,"utilization_pct":1}`, i)
	}
	many.WriteString("]}\n")
	for name, line := range map[string]string{
		"oversized":  strings.Repeat("x", proto.MaxHeartbeat+10) + "\n",
		"65 GPUs":    many.String(),
		"not JSON":   "hello\n",
		"bad field":  `{"platform":"plan9","arch":"amd64","agent_version":"1","gpus":[],"sent_at":"2026-01-01T00:00:00Z"}` + "\n",
		"long arch":  `{"platform":"linux","arch":"` + strings.Repeat("a", 65) + `","agent_version":"1","gpus":[],"sent_at":"2026-01-01T00:00:00Z"}` + "\n",
		"no newline": strings.Repeat("{", 1000),
		"silence":    "",
	} {
		t.Run(name, func(t *testing.T) {
			ys := dialRaw(t, s.srv.URL, st)
			waitFor(t, "online", func() bool { i, _ := s.reg.Get(ctx, "evil"); return i.Online })
			hb, err := ys.OpenStream()
			if err != nil {
				t.Fatal(err)
			}
			go hb.Write([]byte(line))
			select {
			case <-ys.CloseChan():
			case <-time.After(5 * time.Second):
				t.Fatal("the server kept the session")
			}
			waitFor(t, "offline", func() bool { i, _ := s.reg.Get(ctx, "evil"); return !i.Online })
			i, _ := s.reg.Get(ctx, "evil")
			if len(i.GPUs) != 2 || i.Platform != "linux" || i.LastSeen != nil {
				t.Fatalf("recorded from a hostile heartbeat: %+v", i)
			}
		})
	}
	// A handler that answers the probe with 1 MiB.
	ys := dialRaw(t, s.srv.URL, st)
	waitFor(t, "online", func() bool { i, _ := s.reg.Get(ctx, "evil"); return i.Online })
	go func() {
		hb, err := ys.OpenStream()
		if err != nil {
			return
		}
		for range 20 {
			hb.Write([]byte(`{"platform":"linux","arch":"amd64","agent_version":"1","gpus":[],"sent_at":"2026-01-01T00:00:00Z"}` + "\n"))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	go http.Serve(ys, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"hostname":"` + strings.Repeat("h", 1<<20) + `"}`))
	}))
	if _, err := s.reg.Probe(ctx, "evil"); err == nil || errcode.Of(err) != errcode.Internal || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("oversized probe reply: %v", err)
	}
}
