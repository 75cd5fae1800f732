package e2b_test

import (
	"net/http"
	"testing"

	"github.com/agentbox/agentbox/internal/e2b"
)

func TestHostTarget(t *testing.T) {
	for _, c := range []struct {
		host, domain string
		id           string
		port         int
		ok           bool
	}{
		{"49983-sb-0123456789ab.e2b.example.com", "e2b.example.com", "sb-0123456789ab", 49983, true},
		{"49999-sb-0123456789ab.E2B.example.com:443", "e2b.example.com", "sb-0123456789ab", 49999, true},
		{"49983-sb-0123456789ab.e2b.example.com.", "e2b.example.com:8443", "sb-0123456789ab", 49983, true},
		{"49983-sb-0123456789ab.other.com", "e2b.example.com", "", 0, false},
		{"x.49983-sb-0123456789ab.e2b.example.com", "e2b.example.com", "", 0, false},
		{"049983-sb-1.e2b.example.com", "e2b.example.com", "", 0, false},
		{"70000-sb-1.e2b.example.com", "e2b.example.com", "", 0, false},
		{"49983-.e2b.example.com", "e2b.example.com", "", 0, false},
		{"49983-sb-0123456789ab.e2b.example.com", "", "", 0, false},
	} {
		id, port, ok := e2b.HostTarget(c.host, c.domain)
		if id != c.id || port != c.port || ok != c.ok {
			t.Errorf("HostTarget(%q, %q) = %q, %d, %v; want %q, %d, %v", c.host, c.domain, id, port, ok, c.id, c.port, c.ok)
		}
	}
}

func TestTargetAndRewrite(t *testing.T) {
	h := http.Header{}
	if _, _, ok := e2b.Target(h); ok {
		t.Error("a request without E2b-Sandbox-Id has a target")
	}
	h.Set("E2b-Sandbox-Id", "sb-0123456789ab")
	if id, port, ok := e2b.Target(h); !ok || id != "sb-0123456789ab" || port != "49983" {
		t.Errorf("Target without a port = %q %q %v, want envd's port", id, port, ok)
	}
	h.Set("E2b-Sandbox-Port", "49999")
	if _, port, _ := e2b.Target(h); port != "49999" {
		t.Errorf("port %q", port)
	}
	if p, ok := e2b.Rewrite("sb-0123456789ab", 49983, "/process.Process/Start"); !ok || p != "/e2b/envd/sb-0123456789ab/process.Process/Start" {
		t.Errorf("Rewrite envd = %q %v", p, ok)
	}
	if p, ok := e2b.Rewrite("sb-0123456789ab", 49999, "/execute"); !ok || p != "/e2b/code/sb-0123456789ab/execute" {
		t.Errorf("Rewrite interpreter = %q %v", p, ok)
	}
	if _, ok := e2b.Rewrite("sb-0123456789ab", 3000, "/"); ok {
		t.Error("another port is routed to the E2B surface")
	}
}
