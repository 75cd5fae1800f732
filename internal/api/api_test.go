package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
)

// TestTokenOwner: the owner of REST callers names the token without revealing it.
func TestTokenOwner(t *testing.T) {
	tok := "s3cret-token-0123456789abcdef"
	o := api.TokenOwner(tok)
	if !strings.HasPrefix(o, "token:") || len(o) != len("token:")+12 || strings.Contains(o, tok[:8]) {
		t.Fatalf("owner %q", o)
	}
	if api.TokenOwner(tok) != o || api.TokenOwner(tok+"x") == o || api.TokenOwner("") != "" {
		t.Fatal("owner is not a stable function of the token")
	}
}

// TestRequestChecks: the idempotency key is given once (header or body, or both alike), and an
// events wait is bounded. Both are refused before the service is asked.
func TestRequestChecks(t *testing.T) {
	h := api.New(nil, api.Options{})
	for _, tc := range []struct {
		method, path, body, key string
		says                    string
	}{
		{"POST", "/v1/sandboxes", `{"idempotency_key": "a"}`, "b", "Idempotency-Key header and the body's idempotency_key differ"},
		{"GET", "/v1/events?wait=61s", "", "", "wait must be a duration between 0s and 1m0s"},
		{"GET", "/v1/events?wait=soon", "", "", "wait must be"},
	} {
		r := httptest.NewRequest(tc.method, "http://127.0.0.1"+tc.path, strings.NewReader(tc.body))
		if tc.key != "" {
			r.Header.Set(api.IdempotencyKeyHeader, tc.key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "INVALID_ARGUMENT") || !strings.Contains(w.Body.String(), tc.says) {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, w.Code, w.Body)
		}
	}
}
