package sameorigin_test

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/agentbox/agentbox/internal/sameorigin"
)

func TestSame(t *testing.T) {
	plain := httptest.NewRequest("GET", "/mcp", nil)
	plain.Host = "127.0.0.1:8080"
	secure := httptest.NewRequest("GET", "/mcp", nil)
	secure.Host = "LOCALHOST:8443"
	secure.TLS = &tls.ConnectionState{}
	noPort := httptest.NewRequest("GET", "/mcp", nil)
	noPort.Host = "localhost"
	v6 := httptest.NewRequest("GET", "/mcp", nil)
	v6.Host = "[::1]:8080"
	for _, c := range []struct {
		req    string
		origin string
		want   bool
	}{
		{"plain", "http://127.0.0.1:8080", true},
		{"plain", "HTTP://127.0.0.1:8080", true},
		{"plain", "https://127.0.0.1:8080", false}, // the scheme counts
		{"plain", "http://127.0.0.1:8081", false},  // the port counts
		{"plain", "http://127.0.0.1", false},       // port 80, not 8080
		{"plain", "http://localhost:8080", false},  // the name counts
		{"plain", "null", false},
		{"plain", "", false},
		{"plain", "ws://127.0.0.1:8080", false},
		{"plain", "http://127.0.0.1:8080/path", false},
		{"secure", "https://localhost:8443", true},
		{"secure", "http://localhost:8443", false},
		{"noPort", "http://localhost", true},
		{"noPort", "http://localhost:80", true},
		{"noPort", "https://localhost", false},
		{"v6", "http://[::1]:8080", true},
		{"v6", "https://[::1]:8080", false},
	} {
		r := map[string]*http.Request{"plain": plain, "secure": secure, "noPort": noPort, "v6": v6}[c.req]
		if got := sameorigin.Same(r, c.origin); got != c.want {
			t.Errorf("%s (%s): Same(%q) = %v, want %v", c.req, sameorigin.Of(r), c.origin, got, c.want)
		}
	}
}
