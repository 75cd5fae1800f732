package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
)

// TestNetworkRequestChecks: the network routes refuse bad input with INVALID_ARGUMENT naming
// the argument and its range, before the service is asked (there is none here).
func TestNetworkRequestChecks(t *testing.T) {
	h := api.New(nil, api.Options{})
	const sb = "/v1/sandboxes/sb-0123456789ab"
	for _, tc := range []struct {
		method, path, body string
		says               []string
	}{
		{"POST", "/v1/sandboxes", `{"network": 5}`, []string{`network must be "none" or`}},
		{"POST", "/v1/sandboxes", `{"network": ["pypi.org"]}`, []string{`network must be "none" or`}},
		{"POST", "/v1/sandboxes", `{"network": "all"}`, []string{`network must be "none" or`, `"all"`}},
		{"POST", "/v1/sandboxes", `{"network": {"allow": [], "block": []}}`, []string{`network must be "none" or`, "block"}},
		{"POST", "/v1/sandboxes", `{"secrets": {"K": "env:K"}}`, []string{`"secrets`}},
		{"PATCH", sb + "/network", `{"allow": "pypi.org"}`, []string{`"allow" must be an array`}},
		{"PATCH", sb + "/network", `{"allow": [], "block": []}`, []string{`unknown field "block"`}},
		{"PATCH", sb + "/network", ``, []string{"request body is empty"}},
		{"GET", sb + "/connections?limit=1001", "", []string{"limit must be an integer between 1 and 1000"}},
		{"GET", sb + "/connections?limit=0", "", []string{"limit must be an integer between 1 and 1000"}},
		{"GET", sb + "/connections?after=-1", "", []string{"after must be a non-negative integer"}},
		{"GET", sb + "/secret-calls?limit=x", "", []string{"limit must be an integer between 1 and 1000"}},
		{"POST", sb + "/expose", `{"port": 0}`, []string{"port must be between 1 and 65535", "got 0"}},
		{"POST", sb + "/expose", `{"port": 65536, "public": true}`, []string{"port must be between 1 and 65535"}},
		{"POST", sb + "/expose", `{"port": "3000"}`, []string{`"port" must be a number`}},
		{"POST", sb + "/expose", `{"port": 3000, "private": true}`, []string{`unknown field "private"`}},
		{"DELETE", sb + "/expose/abc", "", []string{`port must be an integer between 1 and 65535; got "abc"`}},
		{"DELETE", sb + "/expose/70000", "", []string{"port must be between 1 and 65535"}},
	} {
		r := httptest.NewRequest(tc.method, "http://127.0.0.1"+tc.path, strings.NewReader(tc.body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "INVALID_ARGUMENT") {
			t.Errorf("%s %s %s: %d %s", tc.method, tc.path, tc.body, w.Code, w.Body)
			continue
		}
		var eb struct {
			Error struct{ Message string } `json:"error"`
		}
		_ = json.Unmarshal(w.Body.Bytes(), &eb)
		for _, s := range tc.says {
			if !strings.Contains(eb.Error.Message, s) {
				t.Errorf("%s %s %s: %q lacks %q", tc.method, tc.path, tc.body, eb.Error.Message, s)
			}
		}
	}
}
