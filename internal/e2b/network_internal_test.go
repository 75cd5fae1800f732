package e2b

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
)

func TestEgressPolicy(t *testing.T) {
	for _, c := range []struct {
		body string
		want string // the policy as agentbox writes it, or the error code
	}{
		{`{}`, `"none"`},
		{`{"allow_internet_access": false}`, `"none"`},
		{`{"allow_internet_access": true}`, `{"allow":["*"],"deny":[]}`},
		{`{"network": {"denyOut": ["0.0.0.0/0"]}}`, `"none"`},
		{`{"network": {"denyOut": ["0.0.0.0/0", "10.0.0.0/8"], "allowOut": ["pypi.org", "1.1.1.1"]}}`, `{"allow":["pypi.org","1.1.1.1"],"deny":[]}`},
		{`{"allow_internet_access": false, "network": {"allowOut": ["pypi.org"]}}`, `{"allow":["pypi.org"],"deny":[]}`},
		{`{"network": {"denyOut": ["8.8.8.8"]}}`, `{"allow":["*"],"deny":["8.8.8.8"]}`},
		{`{"allow_internet_access": true, "network": {"allowOut": ["10.1.2.3"]}}`, `{"allow":["*","10.1.2.3"],"deny":[]}`},
		{`{"network": {"allowOut": ["pypi.org"], "denyOut": ["8.8.8.8"]}}`, string(errcode.InvalidArgument)},
		{`{"network": {"rules": {"x": 1}}}`, string(errcode.UnsupportedOp)},
		{`{"network": {"egressProxy": {"address": "p:1"}}}`, string(errcode.UnsupportedOp)},
		{`{"network": {"allowPublicTraffic": false, "maskRequestHost": "x"}}`, `"none"`},
	} {
		var b newSandbox
		if err := json.Unmarshal([]byte(c.body), &b); err != nil {
			t.Fatal(err)
		}
		n, err := egressPolicy(b)
		var got string
		switch {
		case err != nil:
			got = string(errcode.Of(err))
		case n == nil:
			got = `"none"`
		default:
			j, _ := json.Marshal(n)
			got = string(j)
		}
		if got != c.want {
			t.Errorf("%s → %s, want %s", c.body, got, c.want)
		}
		if err != nil && !strings.Contains(errcode.Message(err), "network") {
			t.Errorf("%s: error %q does not name the field", c.body, errcode.Message(err))
		}
	}
}
