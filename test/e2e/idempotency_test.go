package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestIdempotentCreateOverREST: a create retried with the same Idempotency-Key (header or body)
// returns the same sandbox, owned by the token; a different request under the key is CONFLICT;
// the reply names env variables but never echoes their values; a SIGKILL and restart keep it.
func TestIdempotentCreateOverREST(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abe2e")
	s := startServer(t, dir)
	post := func(body, key string) (int, map[string]any) {
		req, _ := http.NewRequest("POST", s.URL+"/v1/sandboxes", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		var out map[string]any
		json.Unmarshal(buf.Bytes(), &out)
		if strings.Contains(buf.String(), "s3cret-value") {
			t.Fatalf("a reply echoed an env value: %s", buf.String())
		}
		return resp.StatusCode, out
	}
	body := `{"env": {"API_TOKEN": "s3cret-value"}, "labels": {"job": "a"}}`
	code, first := post(body, "retry-1")
	if code != 201 && code != 200 {
		t.Fatalf("first create: %d %v", code, first)
	}
	id, _ := first["sandbox_id"].(string)
	if owner, _ := first["owner"].(string); !strings.HasPrefix(owner, "token:") || strings.Contains(owner, token) {
		t.Fatalf("owner %q: want the token's name, never the token", owner)
	}
	if names, _ := first["env_names"].([]any); len(names) != 1 || names[0] != "API_TOKEN" {
		t.Fatalf("env_names %v", first["env_names"])
	}
	code, again := post(strings.Replace(body, "{", `{"idempotency_key": "retry-1", `, 1), "")
	if again["sandbox_id"] != id {
		t.Fatalf("retry (key in the body): %d %v, want sandbox %s", code, again, id)
	}
	code, other := post(`{"memory_mb": 64}`, "retry-1")
	if code != http.StatusConflict {
		t.Fatalf("same key, different request: %d %v, want 409", code, other)
	}
	s.kill()
	s2 := startServer(t, dir)
	s = s2
	code, afterRestart := post(body, "retry-1")
	if afterRestart["sandbox_id"] != id {
		t.Fatalf("retry after a restart: %d %v, want sandbox %s", code, afterRestart, id)
	}
	list, err := s2.client().List(context.Background(), nil, nil)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %d sandboxes, %v; want 1", len(list), err)
	}
	if _, err := s2.client().Destroy(context.Background(), id); err != nil && errcode.Of(err) != errcode.SandboxNotFound {
		t.Fatal(err)
	}
	s2.stop()
	assertHostClean(t, dir, []string{id})
}
