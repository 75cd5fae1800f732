package openapi

import (
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
)

func TestMatch(t *testing.T) {
	rs := []Route{{"GET", "/v1/batches/{id}"}, {"POST", "/v1/batches/matrix"}, {"GET", "/v1/sandboxes/{id}/jobs/{job_id}"}, {"GET", "/health"}}
	for _, c := range []struct{ method, path, want string }{
		{"GET", "/v1/batches/b-1", "GET /v1/batches/{id}"},
		{"POST", "/v1/batches/matrix", "POST /v1/batches/matrix"},
		{"GET", "/v1/batches/matrix", "GET /v1/batches/{id}"},
		{"get", "/v1/sandboxes/sb-1/jobs/job-2", "GET /v1/sandboxes/{id}/jobs/{job_id}"},
		{"GET", "/health", "GET /health"},
		{"GET", "/v1/batches/a%20b", "GET /v1/batches/{id}"},
	} {
		r, err := match(rs, c.method, c.path)
		if err != nil || r.String() != c.want {
			t.Errorf("%s %s: %v %v, want %s", c.method, c.path, r, err, c.want)
		}
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/batches"}, {"GET", "/v1/batches/"}, {"GET", "/v1/batches//"}, {"GET", "/v1/batches/.."}, {"GET", "/v1/batches/%2E%2e"},
		{"GET", "/v1/batches/a%2Fb"}, {"GET", "/v1/batches/a%5cb"}, {"GET", "/v1/batches/a\\b"}, {"GET", "v1/batches/x"}, {"GET", ""},
		{"GET", "/v1/batches/x?y=1"}, {"GET", "/v1/batches/x#f"}, {"GET", "/v1/batches/a\nb"}, {"GET", "/v1/batches/%zz"},
		{"DELETE", "/v1/batches/x"}, {"POST", "/v1/sandboxes/sb-1/jobs/j"}, {"GET", "/v1/sandboxes/sb-1/jobs/j/x"}, {"GET", "/health/x"},
	} {
		if _, err := match(rs, c.method, c.path); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("%s %q: %v, want INVALID_ARGUMENT", c.method, c.path, err)
		}
	}
	_, err := match(rs, "PUT", "/v1/batches/x")
	if e, ok := errcode.As(err); !ok || len(e.Details["allowed"].([]string)) != len(rs) {
		t.Fatalf("method mismatch: %v", err)
	}
	// The embedded document parses and lists the API.
	if len(Routes()) < 55 {
		t.Fatalf("%d routes", len(Routes()))
	}
}
