package sandbox_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestPoolEgress: a pool of network egress holds sandboxes whose egress is up and allows
// nothing; a create with a network policy and a secret claims one, and from its first call the
// proxy applies the claimant's policy, its commands see the secret's placeholder, and the record
// says both (a restarted server keeps them). A create without a network never claims from it.
func TestPoolEgress(t *testing.T) {
	t.Parallel()
	port := upstream(t)
	e := newFakeEnv(t, netConfig(func(string) error { return nil }))
	e.setPool(t, sandbox.Pool{Name: "net", Size: 1, Network: sandbox.PoolNetworkEgress})
	e.pools.Refill(t.Context())
	members, _ := e.svc.List(t.Context(), sandbox.ListFilter{Pool: "net", States: []sandbox.State{sandbox.StateRunning}})
	if len(members) != 1 || members[0].Network.Policy == nil || len(members[0].Network.Policy.Allow) != 0 {
		t.Fatalf("egress pool members: %+v; want one with a policy allowing nothing", members)
	}
	pooled, err := e.net.SessionReply(t.Context(), members[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := viaProxy(t, pooled.ProxyAddr, "allowed.test", port); code != http.StatusForbidden {
		t.Fatalf("a pooled egress sandbox reached allowed.test: %d; want 403 before any claim", code)
	}

	// Without a network: not this pool's shape.
	plain := e.create(t, sandbox.CreateRequest{})
	if plain.FromPool {
		t.Fatalf("a create with network none claimed from an egress pool: %+v", plain)
	}

	sb := e.create(t, sandbox.CreateRequest{Network: policy(fmt.Sprintf("allowed.test:%d", port)),
		Env:     map[string]string{"MINE": "1"},
		Secrets: map[string]sandbox.SecretSpec{"API_KEY": {From: "env:API_KEY_SRC", Hosts: []string{"allowed.test"}}}})
	if !sb.FromPool || sb.ID != members[0].ID {
		t.Fatalf("create with a network policy: %s from_pool=%v; want the pooled %s", sb.ID, sb.FromPool, members[0].ID)
	}
	if sb.Network.Policy == nil || len(sb.Network.Policy.Allow) != 1 || len(sb.Secrets) != 1 || sb.Secrets[0].Name != "API_KEY" {
		t.Fatalf("claimed record: network %+v secrets %+v; want the claimant's", sb.Network.Policy, sb.Secrets)
	}
	placeholder := sb.Secrets[0].Placeholder
	if code, body := viaProxy(t, pooled.ProxyAddr, "allowed.test", port); code != 200 || body != "hello from upstream" {
		t.Errorf("after the claim, allowed.test = %d %q; want the claimant's policy to allow it", code, body)
	}
	if code, _ := viaProxy(t, pooled.ProxyAddr, "other.test", port); code != http.StatusForbidden {
		t.Errorf("after the claim, other.test = %d; want 403", code)
	}
	res, err := e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"env"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"HTTP_PROXY=http://127.0.0.1:", "SSL_CERT_FILE=", "API_KEY=" + placeholder, "MINE=1"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("the claimed sandbox's env lacks %q:\n%s", want, res.Stdout)
		}
	}
	if evs := e.eventsOf(t, sb.ID, "claim"); len(evs) != 1 {
		t.Errorf("claim events: %+v", evs)
	}

	// A restarted server keeps the claimant's policy and secrets.
	e.restart(t)
	got, err := e.svc.Get(t.Context(), sb.ID)
	if err != nil || got.Network.Policy == nil || len(got.Network.Policy.Allow) != 1 || len(got.Secrets) != 1 || got.Secrets[0].Placeholder != placeholder {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	again, err := e.net.SessionReply(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := viaProxy(t, again.ProxyAddr, "allowed.test", port); code != 200 {
		t.Errorf("after restart, allowed.test = %d", code)
	}
	if code, _ := viaProxy(t, again.ProxyAddr, "other.test", port); code != http.StatusForbidden {
		t.Errorf("after restart, other.test = %d; want 403", code)
	}
	for _, id := range []string{sb.ID, plain.ID} {
		if _, err := e.svc.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.pools.DeletePool(t.Context(), "net"); err != nil {
		t.Fatal(err)
	}
	e.pools.Refill(t.Context())
	if r := e.rt.Resources(); len(r) != 0 {
		t.Fatalf("host resources left: %v", r)
	}
}

// TestPoolEgressNeedsTheProxy: a server without an egress proxy refuses an egress pool, saying
// why; an unknown network names the two there are.
func TestPoolEgressNeedsTheProxy(t *testing.T) {
	t.Parallel()
	e := newFakeEnv(t, sandbox.Config{})
	_, err := e.pools.SetPool(t.Context(), sandbox.Pool{Name: "net", Size: 1, Network: sandbox.PoolNetworkEgress})
	wantCode(t, err, errcode.UnsupportedOp, "no egress proxy")
	_, err = e.pools.SetPool(t.Context(), sandbox.Pool{Name: "net", Size: 1, Network: "allow"})
	wantCode(t, err, errcode.InvalidArgument, `"none" or "egress"`)
}

// TestPoolEgressRunc: an egress pool on real runc sandboxes: a pooled sandbox's curl reaches
// nothing before a claim (deny-all), the claimant's policy lets curl reach its allowed host
// through HTTP_PROXY from its first command, a host it does not allow gets the proxy's 403, and
// its secret's placeholder is in its commands' env.
func TestPoolEgressRunc(t *testing.T) {
	cfg := netConfig(func(string) error { return nil })
	cfg.Egress.ProxyPort, cfg.Egress.DNSPort = 0, 0 // 3128 and 53 in the sandbox's own netns
	e := newEnv(t, cfg)
	port := upstream(t)
	if _, err := e.pools.SetPool(t.Context(), sandbox.Pool{Name: "net", Size: 1, MemoryMB: 128, DiskMB: 64, Network: sandbox.PoolNetworkEgress}); err != nil {
		t.Fatal(err)
	}
	e.pools.Refill(t.Context())
	members, _ := e.svc.List(t.Context(), sandbox.ListFilter{Pool: "net", States: []sandbox.State{sandbox.StateRunning}})
	if len(members) != 1 {
		t.Fatalf("pool members: %+v", members)
	}
	run := func(id string, argv ...string) sandbox.ExecResult {
		t.Helper()
		res, err := e.svc.Exec(t.Context(), id, sandbox.ExecRequest{Argv: argv, Timeout: 30 * time.Second}, nil)
		if err != nil {
			t.Fatalf("%v: %v", argv, err)
		}
		return res
	}
	url := fmt.Sprintf("http://allowed.test:%d/", port)
	if res := run(members[0].ID, "curl", "-sS", "--max-time", "10", url); res.Stdout == "hello from upstream" {
		t.Fatalf("a pooled sandbox reached allowed.test before any claim: %+v", res)
	}
	sb, err := e.svc.Create(t.Context(), sandbox.CreateRequest{MemoryMB: 128, DiskMB: 64, Network: policy(fmt.Sprintf("allowed.test:%d", port)),
		Secrets: map[string]sandbox.SecretSpec{"API_KEY": {From: "env:API_KEY_SRC", Hosts: []string{"allowed.test"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.FromPool || sb.ID != members[0].ID {
		t.Fatalf("create with a policy: %s from_pool=%v; want the pooled %s", sb.ID, sb.FromPool, members[0].ID)
	}
	if res := run(sb.ID, "curl", "-sS", "--max-time", "10", url); res.ExitCode != 0 || res.Stdout != "hello from upstream" {
		t.Errorf("curl to the claimant's allowed host: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := run(sb.ID, "curl", "-sS", "--max-time", "10", fmt.Sprintf("http://other.test:%d/", port)); !strings.Contains(res.Stdout, "refused") {
		t.Errorf("curl to a host the claimant did not allow: exit %d, %q %q; want the proxy's 403", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := run(sb.ID, "sh", "-c", "echo $API_KEY"); strings.TrimSpace(res.Stdout) != sb.Secrets[0].Placeholder {
		t.Errorf("the secret's variable: %q; want its placeholder %q", res.Stdout, sb.Secrets[0].Placeholder)
	}
	if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.pools.DeletePool(t.Context(), "net"); err != nil {
		t.Fatal(err)
	}
	e.pools.Refill(t.Context())
}
