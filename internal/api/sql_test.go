package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// TestSQLRoute: POST /v1/sql answers a query over the store's views, refuses a write, a bad
// max_rows and an unknown field with 400 INVALID_ARGUMENT, and without SQL says
// UNSUPPORTED_OPERATION.
func TestSQLRoute(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := httptest.NewServer(api.New(nil, api.Options{Token: "tok", SQL: st}))
	defer srv.Close()
	bare := httptest.NewServer(api.New(nil, api.Options{Token: "tok"}))
	defer bare.Close()
	post := func(url, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/sql", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	code, out := post(srv.URL, `{"query": "SELECT count(*) AS n, now_ms() > 0 AS ok FROM sandboxes", "max_rows": 5}`)
	b, _ := json.Marshal(out)
	var res sqlquery.Result
	json.Unmarshal(b, &res)
	if code != http.StatusOK || res.RowCount != 1 || len(res.Columns) != 2 || res.Rows[0][0] != float64(0) || res.Rows[0][1] != float64(1) {
		t.Fatalf("query: %d %s", code, b)
	}
	errCode := func(out map[string]any) string {
		e, _ := out["error"].(map[string]any)
		s, _ := e["code"].(string)
		return s
	}
	for _, body := range []string{`{"query": "DELETE FROM main.sandboxes"}`, `{"query": "SELECT 1", "max_rows": 10001}`, `{"query": "SELECT 1", "bogus": 1}`, `{}`} {
		if code, out := post(srv.URL, body); code != http.StatusBadRequest || errCode(out) != "INVALID_ARGUMENT" {
			t.Errorf("%s: %d %v, want 400 INVALID_ARGUMENT", body, code, out)
		}
	}
	if code, out := post(bare.URL, `{"query": "SELECT 1"}`); errCode(out) != "UNSUPPORTED_OPERATION" {
		t.Errorf("without SQL: %d %v", code, out)
	}
}
