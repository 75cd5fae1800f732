package api_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
)

// TestImportCutKeepsTheConnectionSound: an import refused part way (over the bound, streamed
// without a length, so the reply is written while the body is still coming: full duplex)
// leaves the rest of the body unread when its handler returns. The next request on the same
// kept-alive connection is answered, and the server recovers no panic (net/http's "invalid
// concurrent Body.Read call" when the leftover body is drained after the handler returned).
func TestImportCutKeepsTheConnectionSound(t *testing.T) {
	s := newImageServer(t, api.Options{MaxImportBytes: 1000})
	hc := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer hc.CloseIdleConnections()
	for i := range 50 {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.url+"/v1/images/import",
			io.MultiReader(bytes.NewReader(make([]byte, 5000)))) // no length: chunked
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("import %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("import %d over the bound: %d %s, want 413", i, resp.StatusCode, b)
		}
		req, _ = http.NewRequestWithContext(t.Context(), http.MethodGet, s.url+"/v1/images", nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		if resp, err = hc.Do(req); err != nil {
			t.Fatalf("list after import %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("list after import %d: %d", i, resp.StatusCode)
		}
	}
}
