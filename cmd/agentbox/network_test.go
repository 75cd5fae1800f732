package main

import (
	"github.com/agentbox/agentbox/internal/wire"
	"slices"
	"strings"
	"testing"
)

// TestParseSecret: --secret NAME=env:VAR@host1,host2 (or file:/path@host); every malformed
// form is refused naming what to write.
func TestParseSecret(t *testing.T) {
	name, spec, err := parseSecret("OPENAI_API_KEY=env:OPENAI_KEY@api.openai.com, api2.openai.com")
	if err != nil || name != "OPENAI_API_KEY" || spec.From != "env:OPENAI_KEY" || !slices.Equal(spec.Hosts, []string{"api.openai.com", "api2.openai.com"}) {
		t.Fatalf("%q %+v %v", name, spec, err)
	}
	if _, spec, err := parseSecret("K=file:/run/se@crets/k@api.example.com"); err != nil || spec.From != "file:/run/se@crets/k" || spec.Hosts[0] != "api.example.com" {
		t.Fatalf("a path with @: %+v %v", spec, err)
	}
	for _, tc := range []struct{ in, says string }{
		{"OPENAI_API_KEY", "must be NAME=env:VAR@host1,host2"},
		{"1K=env:K@a.example", "environment variable name"},
		{"K-X=env:K@a.example", "environment variable name"},
		{"=env:K@a.example", "environment variable name"},
		{"K=env:K", "names no hosts"},
		{"K=env:K@", "empty host"},
		{"K=env:K@a.example,,b.example", "empty host"},
		{"K=env:@a.example", "must be env:VAR or file:/absolute/path"},
		{"K=file:rel/path@a.example", "must be env:VAR or file:/absolute/path"},
		{"K=vault:k@a.example", "must be env:VAR or file:/absolute/path"},
	} {
		if _, _, err := parseSecret(tc.in); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%q: %v, want an error saying %q", tc.in, err, tc.says)
		}
	}
	f := secretFlag{}
	if err := f.Set("K=env:K@a.example"); err != nil {
		t.Fatal(err)
	}
	if err := f.Set("K=env:J@b.example"); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a secret given twice: %v", err)
	}
}

// TestCreateNetworkFlags: --allow-host/--deny-host/--egress/--secret give a create a policy;
// no flag leaves the default (none).
func TestCreateNetworkFlags(t *testing.T) {
	c := newClientCmd("sandbox create", "")
	var nw networkFlags
	nw.register(c)
	if _, err := parseInterleaved(c.fs, []string{"--allow-host", "pypi.org", "--allow-host", "*.github.com", "--deny-host", "evil.github.com", "--secret", "K=env:K@api.example.com"}); err != nil {
		t.Fatal(err)
	}
	r := createReq(nw)
	if r.Network == nil || !slices.Equal(r.Network.Policy.Allow, []string{"pypi.org", "*.github.com"}) || r.Network.Policy.Deny[0] != "evil.github.com" || r.Secrets["K"].From != "env:K" {
		t.Fatalf("%+v", r)
	}
	var none networkFlags
	c2 := newClientCmd("sandbox create", "")
	none.register(c2)
	if r := createReq(none); r.Network != nil || r.Secrets != nil {
		t.Fatalf("no flags: %+v", r)
	}
	var empty networkFlags
	c3 := newClientCmd("sandbox create", "")
	empty.register(c3)
	parseInterleaved(c3.fs, []string{"--egress"})
	if r := createReq(empty); r.Network == nil || r.Network.Policy == nil || r.Network.Policy.Allow == nil || len(r.Network.Policy.Allow) != 0 {
		t.Fatalf("--egress: %+v", r.Network)
	}
	c4 := newClientCmd("sandbox create", "")
	var bad networkFlags
	bad.register(c4)
	c4.fs.SetOutput(new(strings.Builder))
	if _, err := parseInterleaved(c4.fs, []string{"--secret", "K=env:K"}); err == nil || !strings.Contains(err.Error(), "names no hosts") {
		t.Fatalf("a bad --secret: %v", err)
	}
}

func createReq(n networkFlags) wire.CreateRequest {
	var r wire.CreateRequest
	n.apply(&r)
	return r
}
