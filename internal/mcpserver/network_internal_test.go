package mcpserver

import (
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
)

// TestCreateNetworkSchema: sandbox_create's network is "none" or an {allow, deny} object, and
// the published schema (a oneOf) is what refuses anything else, naming the argument; secrets
// need from and hosts.
func TestCreateNetworkSchema(t *testing.T) {
	s := schemaFor[CreateIn]()
	tweakCreateNetwork(s)
	is := resolveInput("sandbox_create", s)
	for _, ok := range []string{
		`{}`,
		`{"network": "none"}`,
		`{"network": {}}`,
		`{"network": {"allow": []}}`,
		`{"network": {"allow": ["pypi.org", "*.github.com:443", "203.0.113.0/24"], "deny": ["evil.example"]}}`,
		`{"network": {"allow": ["api.openai.com"]}, "secrets": {"OPENAI_API_KEY": {"from": "env:OPENAI_API_KEY", "hosts": ["api.openai.com"], "body": true}}}`,
	} {
		var in CreateIn
		if err := decodeArgs("sandbox_create", is, []byte(ok), &in); err != nil {
			t.Errorf("%s: %v", ok, err)
			continue
		}
		nw, err := networkArg(in.Network)
		if err != nil {
			t.Errorf("%s: %v", ok, err)
		}
		if strings.Contains(ok, "allow") && (nw == nil || nw.Policy == nil) {
			t.Errorf("%s: no policy in %+v", ok, nw)
		}
		if !strings.Contains(ok, "{\"allow") && nw != nil && strings.Contains(ok, "none") {
			t.Errorf("%s: none gave %+v", ok, nw)
		}
	}
	var in CreateIn
	if err := decodeArgs("sandbox_create", is, []byte(`{"network": {"allow": ["a.example"], "deny": ["b.example"]}}`), &in); err != nil {
		t.Fatal(err)
	}
	if nw, _ := networkArg(in.Network); nw == nil || nw.Policy.Allow[0] != "a.example" || nw.Policy.Deny[0] != "b.example" || len(nw.Policy.Allow) != 1 {
		t.Fatalf("policy: %+v", nw)
	}
	if err := decodeArgs("sandbox_create", is, []byte(`{"network": {}}`), &in); err != nil {
		t.Fatal(err)
	}
	if nw, _ := networkArg(in.Network); nw == nil || nw.Policy == nil || nw.Policy.Allow == nil || len(nw.Policy.Allow) != 0 {
		t.Fatalf("an empty policy must stay a policy (allow nothing, changeable later): %+v", nw)
	}
	for _, tc := range []struct{ args, says string }{
		{`{"network": 5}`, `"network" must be a string (one of "none") or an object with allow, deny; got a number (5)`},
		{`{"network": "all"}`, `"network" must be a string (one of "none") or an object`},
		{`{"network": "host"}`, `got a string ("host")`},
		{`{"network": ["pypi.org"]}`, `"network" must be`},
		{`{"network": {"allow": "pypi.org"}}`, `"network"`},
		{`{"network": {"allow": [5]}}`, `"network"`},
		{`{"network": {"alow": ["pypi.org"]}}`, `"network"`},
		{`{"secrets": {"K": {"from": "env:K"}}}`, `"secrets.K.hosts"`},
		{`{"secrets": {"K": {"from": "env:K", "hosts": []}}}`, `"secrets.K.hosts" must not be empty`},
		{`{"secrets": {"K": {"from": "vault:K", "hosts": ["a.example"]}}}`, `"secrets.K.from"`},
		{`{"secrets": {"K": "env:K"}}`, `"secrets.K" must be an object`},
	} {
		err := decodeArgs("sandbox_create", is, []byte(tc.args), &in)
		if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), tc.says) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT saying %q", tc.args, err, tc.says)
		}
	}
}

// TestNetworkToolSchemas: the new tools' bounds are published and enforced.
func TestNetworkToolSchemas(t *testing.T) {
	page := schemaFor[PageIn]()
	tweakPage(page)
	port := schemaFor[ExposeIn]()
	tweakPort(port)
	for _, tc := range []struct {
		s          inputSchemaCase
		args, says string
	}{
		{inputSchemaCase{"sandbox_connections", resolveInput("sandbox_connections", page)}, `{"sandbox_id": "sb-0123456789ab", "limit": 1001}`, `"limit"`},
		{inputSchemaCase{"sandbox_connections", resolveInput("sandbox_connections", page)}, `{"sandbox_id": "sb-0123456789ab", "after": -1}`, `"after"`},
		{inputSchemaCase{"sandbox_connections", resolveInput("sandbox_connections", page)}, `{"limit": 5}`, `missing required argument "sandbox_id"`},
		{inputSchemaCase{"sandbox_expose", resolveInput("sandbox_expose", port)}, `{"sandbox_id": "sb-0123456789ab", "port": 0}`, `"port" must be an integer (at least 1, at most 65535)`},
		{inputSchemaCase{"sandbox_expose", resolveInput("sandbox_expose", port)}, `{"sandbox_id": "sb-0123456789ab", "port": 65536}`, `"port"`},
		{inputSchemaCase{"sandbox_expose", resolveInput("sandbox_expose", port)}, `{"sandbox_id": "sb-0123456789ab", "port": "3000"}`, `"port" must be an integer`},
	} {
		var v map[string]any
		err := decodeArgs(tc.s.tool, tc.s.is, []byte(tc.args), &v)
		if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), tc.says) {
			t.Errorf("%s %s: %v, want INVALID_ARGUMENT saying %q", tc.s.tool, tc.args, err, tc.says)
		}
	}
	var in ExposeIn
	if err := decodeArgs("sandbox_expose", resolveInput("sandbox_expose", port), []byte(`{"sandbox_id": "sb-0123456789ab", "port": 3000, "public": true}`), &in); err != nil || in.Port != 3000 || !in.Public {
		t.Fatalf("a valid expose: %v %+v", err, in)
	}
}

type inputSchemaCase struct {
	tool string
	is   inputSchema
}
