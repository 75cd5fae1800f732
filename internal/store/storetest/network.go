package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// netTests cover sandbox.NetStore and the network fields of a sandbox's record.
var netTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"NetworkRoundTrip", testNetworkRoundTrip},
	{"NetRecordsRoundTripAndPaging", testNetRecordsPaging},
	{"NetRecordsRetention", testNetRecordsRetention},
	{"NetRecordsOfUnknownSandboxDropped", testNetRecordsUnknownSandbox},
	{"NetEventsAppendedWithoutVersionBump", testNetEvents},
	{"Exposures", testExposures},
	{"NetPruneCascade", testNetPruneCascade},
}

func conn(sb sandbox.Sandbox, i int, at time.Time) egress.Connection {
	return egress.Connection{SandboxID: sb.ID, Time: at.Add(time.Duration(i) * time.Millisecond), Kind: egress.KindTransparent,
		Host: fmt.Sprintf("h%d.example", i), Port: 443, Addr: "203.0.113.7:443", Decision: egress.Denied,
		Rule: "deny *.example", Reason: "denied by rule", BytesOut: int64(10 + i), BytesIn: int64(20 + i),
		DurationMS: int64(i), Intercepted: i%2 == 1}
}

func call(sb sandbox.Sandbox, i int, at time.Time) egress.SecretCall {
	return egress.SecretCall{SandboxID: sb.ID, Time: at.Add(time.Duration(i) * time.Millisecond), Secret: "API_KEY",
		Host: "api.example", Method: "POST", Path: fmt.Sprintf("/v1/%d", i), Replaced: i%2 == 0, Scrubbed: int64(i % 3), Reason: "r"}
}

func mustAppend(t *testing.T, s store.Store, conns []egress.Connection, calls []egress.SecretCall, evs []sandbox.Event, keep int) {
	t.Helper()
	if err := s.AppendNetRecords(t.Context(), conns, calls, evs, keep); err != nil {
		t.Fatalf("AppendNetRecords: %v", err)
	}
}

func testNetworkRoundTrip(t *testing.T, s store.Store) {
	sb := newSandbox(0, sandbox.StateRunning, base(), nil)
	none := mustCreate(t, s, sb)
	if got := mustGet(t, s, none.ID); got.Network.Policy != nil || got.Secrets != nil {
		t.Errorf("network none read back as %+v, secrets %+v", got.Network.Policy, got.Secrets)
	}
	sb = newSandbox(1, sandbox.StateRunning, base(), nil)
	sb.Network = sandbox.Network{Policy: &egress.Policy{Allow: []string{"pypi.org", "*.github.com:443"}, Deny: []string{}}}
	sb.Secrets = []egress.Secret{{Name: "API_KEY", Placeholder: "agentbox-secret-0123", From: "env:API_KEY", Hosts: []string{"api.example"}, Body: true}}
	mustCreate(t, s, sb)
	got := mustGet(t, s, sb.ID)
	if got.Network.Policy == nil || !slices.Equal(got.Network.Policy.Allow, sb.Network.Policy.Allow) || len(got.Network.Policy.Deny) != 0 {
		t.Errorf("network = %+v, want %+v", got.Network.Policy, sb.Network.Policy)
	}
	if len(got.Secrets) != 1 || got.Secrets[0].Name != "API_KEY" || got.Secrets[0].Placeholder != "agentbox-secret-0123" ||
		got.Secrets[0].From != "env:API_KEY" || !got.Secrets[0].Body || !slices.Equal(got.Secrets[0].Hosts, []string{"api.example"}) {
		t.Errorf("secrets = %+v", got.Secrets)
	}
	got.Network = sandbox.Network{Policy: &egress.Policy{Allow: []string{}, Deny: []string{"evil.example"}}}
	got.Version++
	if err := s.UpdateSandbox(t.Context(), got, sandbox.Event{}); err != nil {
		t.Fatal(err)
	}
	if again := mustGet(t, s, sb.ID); again.Network.Policy == nil || len(again.Network.Policy.Allow) != 0 ||
		!slices.Equal(again.Network.Policy.Deny, []string{"evil.example"}) || len(again.Secrets) != 1 {
		t.Errorf("after update: network %+v, secrets %+v", again.Network.Policy, again.Secrets)
	}
}

func testNetRecordsPaging(t *testing.T, s store.Store) {
	a := mustCreate(t, s, newSandbox(0, sandbox.StateRunning, base(), nil))
	b := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	var conns []egress.Connection
	var calls []egress.SecretCall
	for i := range 30 {
		conns = append(conns, conn(a, i, base()), conn(b, i, base()))
		calls = append(calls, call(a, i, base()))
	}
	mustAppend(t, s, conns, calls, nil, 1000)

	all, omitted, err := s.ListConnections(t.Context(), a.ID, 0, 1000)
	if err != nil || len(all) != 30 || omitted != 0 {
		t.Fatalf("ListConnections(all) = %d, omitted %d, %v", len(all), omitted, err)
	}
	for i, c := range all {
		want := conn(a, i, base())
		want.Seq = c.Seq
		checkTime(t, "connection time", want.Time, c.Time)
		want.Time = c.Time
		if c != want {
			t.Errorf("connection %d = %+v, want %+v", i, c, want)
		}
		if i > 0 && c.Seq <= all[i-1].Seq {
			t.Errorf("connections not ascending at %d", i)
		}
	}
	newest, omitted, err := s.ListConnections(t.Context(), a.ID, 0, 10)
	if err != nil || len(newest) != 10 || omitted != 20 || newest[0].Host != "h20.example" || newest[9].Host != "h29.example" {
		t.Errorf("newest 10 = %v, omitted %d, %v", hosts(newest), omitted, err)
	}
	after, omitted, err := s.ListConnections(t.Context(), a.ID, all[4].Seq, 3)
	if err != nil || len(after) != 3 || omitted != 0 || after[0].Seq != all[5].Seq || after[2].Seq != all[7].Seq {
		t.Errorf("after seq %d: %v, omitted %d, %v", all[4].Seq, hosts(after), omitted, err)
	}
	if rest, _, err := s.ListConnections(t.Context(), a.ID, all[29].Seq, 10); err != nil || len(rest) != 0 {
		t.Errorf("after the last: %v, %v", hosts(rest), err)
	}
	gotCalls, omitted, err := s.ListSecretCalls(t.Context(), a.ID, 0, 5)
	if err != nil || len(gotCalls) != 5 || omitted != 25 {
		t.Fatalf("ListSecretCalls = %d, omitted %d, %v", len(gotCalls), omitted, err)
	}
	want := call(a, 25, base())
	want.Seq = gotCalls[0].Seq
	checkTime(t, "secret call time", want.Time, gotCalls[0].Time)
	want.Time = gotCalls[0].Time
	if gotCalls[0] != want {
		t.Errorf("secret call = %+v, want %+v", gotCalls[0], want)
	}
	if none, omitted, err := s.ListSecretCalls(t.Context(), b.ID, 0, 5); err != nil || len(none) != 0 || omitted != 0 {
		t.Errorf("b's secret calls = %d, omitted %d, %v", len(none), omitted, err)
	}
}

func hosts(cs []egress.Connection) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Host)
	}
	return out
}

func testNetRecordsRetention(t *testing.T, s store.Store) {
	a := mustCreate(t, s, newSandbox(0, sandbox.StateRunning, base(), nil))
	b := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	for batch := range 3 {
		var conns []egress.Connection
		var calls []egress.SecretCall
		for i := range 4 {
			conns = append(conns, conn(a, batch*4+i, base()))
			calls = append(calls, call(a, batch*4+i, base()))
		}
		conns = append(conns, conn(b, batch, base()))
		mustAppend(t, s, conns, calls, nil, 5)
	}
	got, omitted, err := s.ListConnections(t.Context(), a.ID, 0, 100)
	if err != nil || omitted != 0 || !slices.Equal(hosts(got), []string{"h7.example", "h8.example", "h9.example", "h10.example", "h11.example"}) {
		t.Errorf("a's connections after trimming to 5: %v, omitted %d, %v", hosts(got), omitted, err)
	}
	calls, _, err := s.ListSecretCalls(t.Context(), a.ID, 0, 100)
	if err != nil || len(calls) != 5 || calls[0].Path != "/v1/7" {
		t.Errorf("a's secret calls after trimming: %d, %v", len(calls), err)
	}
	if got, _, err := s.ListConnections(t.Context(), b.ID, 0, 100); err != nil || len(got) != 3 {
		t.Errorf("b's connections = %d (another sandbox's trim took them?), %v", len(got), err)
	}
	if err := s.AppendNetRecords(t.Context(), nil, nil, nil, 0); errcode.Of(err) != errcode.InvalidArgument {
		t.Errorf("keep 0 = %v, want INVALID_ARGUMENT", err)
	}
}

func testNetRecordsUnknownSandbox(t *testing.T, s store.Store) {
	a := mustCreate(t, s, newSandbox(0, sandbox.StateRunning, base(), nil))
	ghost := newSandbox(1, sandbox.StateRunning, base(), nil) // never stored
	mustAppend(t, s, []egress.Connection{conn(ghost, 0, base()), conn(a, 1, base())}, []egress.SecretCall{call(ghost, 0, base())},
		[]sandbox.Event{{SandboxID: ghost.ID, Type: "egress_denied", From: sandbox.StateRunning, To: sandbox.StateRunning, At: base()}}, 10)
	if got, _, err := s.ListConnections(t.Context(), a.ID, 0, 10); err != nil || len(got) != 1 {
		t.Errorf("a's connections = %d, %v", len(got), err)
	}
	if got, _, err := s.ListConnections(t.Context(), ghost.ID, 0, 10); err != nil || len(got) != 0 {
		t.Errorf("a missing sandbox's connections = %d, %v", len(got), err)
	}
	if evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: ghost.ID}); len(evs) != 0 {
		t.Errorf("a missing sandbox got events %+v", evs)
	}
}

func testNetEvents(t *testing.T, s store.Store) {
	a := mustCreate(t, s, newSandbox(0, sandbox.StateRunning, base(), nil))
	ev := sandbox.Event{SandboxID: a.ID, Type: "egress_denied", From: sandbox.StateRunning, To: sandbox.StateRunning,
		Reason: "evil.example:443 refused", At: base().Add(time.Second)}
	mustAppend(t, s, nil, nil, []sandbox.Event{ev, ev}, 10)
	evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: a.ID})
	if len(evs) != 3 || evs[1].Type != "egress_denied" || evs[1].Reason != ev.Reason || evs[2].Seq <= evs[1].Seq {
		t.Errorf("events = %+v", evs)
	}
	checkTime(t, "event time", ev.At, evs[1].At)
	if got := mustGet(t, s, a.ID); got.Version != a.Version {
		t.Errorf("version %d → %d: events of the network must not bump the record", a.Version, got.Version)
	}
}

func testExposures(t *testing.T, s store.Store) {
	a := mustCreate(t, s, newSandbox(0, sandbox.StateRunning, base(), nil))
	b := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	put := func(e sandbox.Exposure) {
		t.Helper()
		if err := s.PutExposure(t.Context(), e); err != nil {
			t.Fatalf("PutExposure(%+v): %v", e, err)
		}
	}
	put(sandbox.Exposure{SandboxID: a.ID, Port: 8080, TokenHash: "aa", CreatedAt: base(), URL: "not stored", AccessToken: "not stored"})
	put(sandbox.Exposure{SandboxID: a.ID, Port: 3000, Public: true, CreatedAt: base()})
	put(sandbox.Exposure{SandboxID: b.ID, Port: 8080, TokenHash: "bb", CreatedAt: base()})
	got, err := s.GetExposure(t.Context(), a.ID, 8080)
	if err != nil || got.SandboxID != a.ID || got.Port != 8080 || got.Public || got.TokenHash != "aa" || got.URL != "" || got.AccessToken != "" {
		t.Errorf("GetExposure = %+v, %v", got, err)
	}
	checkTime(t, "exposure created_at", base(), got.CreatedAt)
	put(sandbox.Exposure{SandboxID: a.ID, Port: 8080, TokenHash: "cc", CreatedAt: base().Add(time.Minute)})
	if got, _ := s.GetExposure(t.Context(), a.ID, 8080); got.TokenHash != "cc" {
		t.Errorf("replaced exposure's token hash = %q", got.TokenHash)
	}
	list, err := s.ListExposures(t.Context(), a.ID)
	if err != nil || len(list) != 2 || list[0].Port != 3000 || !list[0].Public || list[1].Port != 8080 {
		t.Errorf("ListExposures = %+v, %v", list, err)
	}
	if _, err := s.GetExposure(t.Context(), a.ID, 9999); errcode.Of(err) != errcode.SandboxNotFound {
		t.Errorf("GetExposure of a port not exposed = %v, want SANDBOX_NOT_FOUND", err)
	}
	ghost := newSandbox(2, sandbox.StateRunning, base(), nil)
	if err := s.PutExposure(t.Context(), sandbox.Exposure{SandboxID: ghost.ID, Port: 1, CreatedAt: base()}); errcode.Of(err) != errcode.SandboxNotFound {
		t.Errorf("PutExposure of a missing sandbox = %v, want SANDBOX_NOT_FOUND", err)
	}
	if err := s.DeleteExposure(t.Context(), a.ID, 3000); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteExposure(t.Context(), a.ID, 3000); errcode.Of(err) != errcode.SandboxNotFound {
		t.Errorf("second DeleteExposure = %v, want SANDBOX_NOT_FOUND", err)
	}
	if err := s.DeleteExposures(t.Context(), a.ID); err != nil {
		t.Fatal(err)
	}
	if list, err := s.ListExposures(t.Context(), a.ID); err != nil || len(list) != 0 {
		t.Errorf("after DeleteExposures: %+v, %v", list, err)
	}
	if list, err := s.ListExposures(t.Context(), b.ID); err != nil || len(list) != 1 {
		t.Errorf("b's exposures = %+v, %v (another sandbox's delete took them?)", list, err)
	}
}

func testNetPruneCascade(t *testing.T, s store.Store) {
	old := newSandbox(0, sandbox.StateRunning, base(), nil)
	mustCreate(t, s, old)
	keep := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	mustAppend(t, s, []egress.Connection{conn(old, 0, base()), conn(keep, 0, base())}, []egress.SecretCall{call(old, 0, base())}, nil, 10)
	if err := s.PutExposure(t.Context(), sandbox.Exposure{SandboxID: old.ID, Port: 80, CreatedAt: base()}); err != nil {
		t.Fatal(err)
	}
	dead, ev := next(old, sandbox.StateStopping, base().Add(time.Minute), "destroy")
	if err := s.UpdateSandbox(t.Context(), dead, ev); err != nil {
		t.Fatal(err)
	}
	dead, ev = next(dead, sandbox.StateDestroyed, base().Add(time.Minute), "destroyed")
	if err := s.UpdateSandbox(t.Context(), dead, ev); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneSandboxes(t.Context(), base().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("PruneSandboxes = %d, %v", n, err)
	}
	if got, omitted, err := s.ListConnections(t.Context(), old.ID, 0, 10); err != nil || len(got) != 0 || omitted != 0 {
		t.Errorf("a pruned sandbox's connections = %d, %v", len(got), err)
	}
	if got, _, err := s.ListSecretCalls(t.Context(), old.ID, 0, 10); err != nil || len(got) != 0 {
		t.Errorf("a pruned sandbox's secret calls = %d, %v", len(got), err)
	}
	if _, err := s.GetExposure(t.Context(), old.ID, 80); errcode.Of(err) != errcode.SandboxNotFound {
		t.Errorf("a pruned sandbox's exposure: %v", err)
	}
	if got, _, err := s.ListConnections(t.Context(), keep.ID, 0, 10); err != nil || len(got) != 1 {
		t.Errorf("the kept sandbox's connections = %d, %v", len(got), err)
	}
}
