package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// Conversations over REST: recorded by the chat process as it goes, in order (a repeated seq
// is CONFLICT), owned by the key that made them: another principal gets the same 404 as for a
// missing one and its list is empty of them; an admin sees every one.
func TestConversationsAcrossPrincipals(t *testing.T) {
	e := newAuthzEnv(t)
	ctx := t.Context()
	alice, _ := e.key(t, "alice", auth.ScopeOperate)
	bob, bobKey := e.key(t, "bob", auth.ScopeOperate)

	c, err := alice.CreateConversation(ctx, wire.ConversationCreate{Title: "how many?", Model: "m", Endpoint: "http://127.0.0.1:1/v1", Tools: []string{"execute_sql"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.ID, "conv-") || !strings.HasPrefix(c.Principal, "key:") {
		t.Fatalf("created %+v", c)
	}
	msgs := []wire.ChatMessage{{Seq: 1, Role: "system", Content: "s"}, {Seq: 2, Role: "user", Content: "how many?"},
		{Seq: 3, Role: "assistant", ToolCalls: []wire.ChatToolCall{{ID: "c1", Name: "execute_sql", Arguments: `{"sql":"select 1"}`}}, PromptTokens: 9, CompletionTokens: 2}}
	if got, err := alice.AppendConversation(ctx, c.ID, msgs); err != nil || got.Messages != 3 || got.PromptTokens != 9 {
		t.Fatalf("append: %+v %v", got, err)
	}
	if _, err := alice.AppendConversation(ctx, c.ID, msgs[2:]); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("append seq 3 again: %v", err)
	}
	if _, err := alice.AppendConversation(ctx, c.ID, []wire.ChatMessage{{Seq: 4, Role: "wizard"}}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("bad role: %v", err)
	}
	sbx, err := alice.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sb := sbx.ID
	// Only one's own sandbox can be recorded: bob's body naming alice's is 404 (by the gate).
	if st, body := e.rest(t, bobKey, http.MethodPost, "/v1/conversations", `{"title":"t","model":"m","endpoint":"e"}`); st != http.StatusCreated {
		t.Fatalf("bob's create: %d %s", st, body)
	}
	if got, err := alice.UpdateConversation(ctx, c.ID, wire.ConversationUpdate{SandboxID: &sb}); err != nil || got.SandboxID != sb {
		t.Fatalf("update: %+v %v", got, err)
	}
	d, err := alice.GetConversation(ctx, c.ID)
	if err != nil || len(d.Transcript) != 3 || d.Transcript[2].ToolCalls[0].Name != "execute_sql" || d.SandboxID != sb {
		t.Fatalf("get: %+v %v", d, err)
	}

	// Bob: 404 as for a missing one, on every route naming it; an empty list.
	st, body := e.rest(t, bobKey, http.MethodGet, "/v1/conversations/conv-00000000ffff", "")
	if st != http.StatusNotFound || errcodeOf(t, body) != string(errcode.ConversationNotFound) {
		t.Fatalf("missing: %d %s", st, body)
	}
	for _, f := range []struct{ method, path, body string }{
		{"GET", "/v1/conversations/" + c.ID, ""},
		{"PATCH", "/v1/conversations/" + c.ID, `{"sandbox_id":""}`},
		{"POST", "/v1/conversations/" + c.ID + "/messages", `{"messages":[{"seq":4,"role":"user","content":"x"}]}`},
		{"DELETE", "/v1/conversations/" + c.ID, ""},
	} {
		if st, body := e.rest(t, bobKey, f.method, f.path, f.body); st != http.StatusNotFound || errcodeOf(t, body) != string(errcode.ConversationNotFound) {
			t.Errorf("%s %s by bob: %d %s", f.method, f.path, st, body)
		}
	}
	if l, err := bob.ListConversations(ctx, 0); err != nil || len(l.Conversations) != 1 || l.Conversations[0].ID == c.ID {
		t.Fatalf("bob's list: %+v %v", l, err)
	}
	if l, err := alice.ListConversations(ctx, 0); err != nil || len(l.Conversations) != 1 || l.Conversations[0].Messages != 3 {
		t.Fatalf("alice's list: %+v %v", l, err)
	}
	if l, err := e.admin.ListConversations(ctx, 0); err != nil || len(l.Conversations) != 2 {
		t.Fatalf("admin's list: %+v %v", l, err)
	}
	// Nothing of bob's attempts changed it; alice deletes it.
	if d, _ := alice.GetConversation(ctx, c.ID); len(d.Transcript) != 3 {
		t.Fatalf("after bob: %d messages", len(d.Transcript))
	}
	if err := alice.DeleteConversation(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.GetConversation(ctx, c.ID); !errcode.Is(err, errcode.ConversationNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}
