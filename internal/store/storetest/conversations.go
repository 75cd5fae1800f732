package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

var conversationTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"ConversationRoundTrip", testConversationRoundTrip},
	{"ConversationAppendOrder", testConversationAppendOrder},
	{"ConversationListByPrincipal", testConversationListByPrincipal},
	{"ConversationConcurrentAppendsOneWins", testConversationConcurrentAppends},
}

func newConversation(id, principal string, at time.Time) store.Conversation {
	return store.Conversation{ID: id, Principal: principal, Title: "how many runs failed?", Model: "m-1",
		Endpoint: "http://127.0.0.1:9/v1", Tools: []string{"run_python", "execute_sql"}, CreatedAt: at, UpdatedAt: at}
}

func testConversationRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	at := time.Date(2026, 12, 7, 10, 0, 0, 123e6, time.UTC)
	c := newConversation("conv-a", "key:k1", at)
	if err := s.CreateConversation(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateConversation(ctx, c); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("second create: %v, want CONFLICT", err)
	}
	if p, err := s.ConversationPrincipal(ctx, "conv-a"); err != nil || p != "key:k1" {
		t.Fatalf("principal: %q %v", p, err)
	}
	if _, err := s.ConversationPrincipal(ctx, "conv-none"); !errcode.Is(err, errcode.ConversationNotFound) {
		t.Fatalf("principal of unknown: %v", err)
	}
	if _, err := s.GetConversation(ctx, "conv-none"); !errcode.Is(err, errcode.ConversationNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
	msgs := []store.ConversationMessage{
		{Seq: 1, Role: "system", Content: "be brief", CreatedAt: at},
		{Seq: 2, Role: "user", Content: "how many runs failed? ünïcode", CreatedAt: at},
		{Seq: 3, Role: "assistant", ToolCalls: []store.ConversationToolCall{{ID: "c1", Name: "execute_sql", Arguments: `{"sql":"select 1"}`}, {ID: "c2", Name: "run_python", Arguments: `{}`}},
			PromptTokens: 120, CompletionTokens: 7, DurationMS: 850, Model: "m-1", CreatedAt: at.Add(time.Second)},
		{Seq: 4, Role: "tool", ToolCallID: "c1", Tool: "execute_sql", Content: "3", IsError: true, Truncated: true, OutputBytes: 99999, DurationMS: 12, CreatedAt: at.Add(2 * time.Second)},
	}
	if err := s.AppendConversationMessages(ctx, "conv-a", msgs); err != nil {
		t.Fatal(err)
	}
	if err := s.SetConversationSandbox(ctx, "conv-a", "sb-1", at.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetConversation(ctx, "conv-a")
	if err != nil {
		t.Fatal(err)
	}
	if got.Messages != 4 || got.PromptTokens != 120 || got.CompletionTokens != 7 || got.SandboxID != "sb-1" || got.Principal != "key:k1" ||
		len(got.Tools) != 2 || got.Tools[1] != "execute_sql" || !got.CreatedAt.Equal(at) || !got.UpdatedAt.Equal(at.Add(3*time.Second)) || got.Endpoint != c.Endpoint {
		t.Fatalf("conversation %+v", got)
	}
	back, err := s.ConversationMessages(ctx, "conv-a")
	if err != nil || len(back) != 4 {
		t.Fatalf("messages %d, %v", len(back), err)
	}
	if m := back[2]; len(m.ToolCalls) != 2 || m.ToolCalls[0].Arguments != `{"sql":"select 1"}` || m.PromptTokens != 120 || m.DurationMS != 850 || m.Model != "m-1" {
		t.Fatalf("assistant message %+v", m)
	}
	if m := back[3]; !m.IsError || !m.Truncated || m.OutputBytes != 99999 || m.ToolCallID != "c1" || m.Tool != "execute_sql" || !m.CreatedAt.Equal(at.Add(2*time.Second)) {
		t.Fatalf("tool message %+v", m)
	}
	if back[1].Content != msgs[1].Content {
		t.Fatalf("content %q", back[1].Content)
	}
	big := store.ConversationMessage{Seq: 5, Role: "tool", Content: string(make([]byte, store.MaxConversationMessageBytes+1)), CreatedAt: at}
	if err := s.AppendConversationMessages(ctx, "conv-a", []store.ConversationMessage{big}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("oversized message: %v", err)
	}
	if err := s.DeleteConversation(ctx, "conv-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteConversation(ctx, "conv-a"); !errcode.Is(err, errcode.ConversationNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if m, _ := s.ConversationMessages(ctx, "conv-a"); len(m) != 0 {
		t.Fatalf("messages left after delete: %d", len(m))
	}
	if err := s.AppendConversationMessages(ctx, "conv-a", msgs[:1]); !errcode.Is(err, errcode.ConversationNotFound) {
		t.Fatalf("append to deleted: %v", err)
	}
	if err := s.SetConversationSandbox(ctx, "conv-a", "sb", at); !errcode.Is(err, errcode.ConversationNotFound) {
		t.Fatalf("set sandbox of deleted: %v", err)
	}
}

// A gap or a repeat in seq is CONFLICT and writes nothing of the call.
func testConversationAppendOrder(t *testing.T, s store.Store) {
	ctx := t.Context()
	at := time.Now()
	if err := s.CreateConversation(ctx, newConversation("conv-o", "admin", at)); err != nil {
		t.Fatal(err)
	}
	m := func(seq int) store.ConversationMessage {
		return store.ConversationMessage{Seq: seq, Role: "user", Content: fmt.Sprint(seq), PromptTokens: 1, CreatedAt: at}
	}
	if err := s.AppendConversationMessages(ctx, "conv-o", []store.ConversationMessage{m(1), m(2)}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]store.ConversationMessage{{m(2)}, {m(4)}, {m(3), m(5)}} {
		if err := s.AppendConversationMessages(ctx, "conv-o", bad); !errcode.Is(err, errcode.Conflict) {
			t.Fatalf("append %d…: %v, want CONFLICT", bad[0].Seq, err)
		}
	}
	c, _ := s.GetConversation(ctx, "conv-o")
	got, _ := s.ConversationMessages(ctx, "conv-o")
	if c.Messages != 2 || len(got) != 2 || c.PromptTokens != 2 {
		t.Fatalf("after refused appends: %d messages, %d rows, %d tokens", c.Messages, len(got), c.PromptTokens)
	}
}

func testConversationListByPrincipal(t *testing.T, s store.Store) {
	ctx := t.Context()
	base := time.Now().Add(-time.Hour)
	for i := range 5 {
		p := "key:a"
		if i%2 == 1 {
			p = "key:b"
		}
		if err := s.CreateConversation(ctx, newConversation(fmt.Sprintf("conv-%d", i), p, base.Add(time.Duration(i)*time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	l, omitted, err := s.ListConversations(ctx, "key:a", 2)
	if err != nil || len(l) != 2 || omitted != 1 || l[0].ID != "conv-4" || l[1].ID != "conv-2" {
		t.Fatalf("key:a's: %v omitted %d, %v", l, omitted, err)
	}
	l, omitted, err = s.ListConversations(ctx, "", 100)
	if err != nil || len(l) != 5 || omitted != 0 || l[0].ID != "conv-4" {
		t.Fatalf("all: %d omitted %d, %v", len(l), omitted, err)
	}
	if l, _, _ := s.ListConversations(ctx, "key:c", 10); len(l) != 0 {
		t.Fatalf("key:c has %d", len(l))
	}
}

// Two writers appending the same next seq: one wins, the other is CONFLICT.
func testConversationConcurrentAppends(t *testing.T, s store.Store) {
	ctx := t.Context()
	at := time.Now()
	if err := s.CreateConversation(ctx, newConversation("conv-c", "admin", at)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.AppendConversationMessages(ctx, "conv-c", []store.ConversationMessage{{Seq: 1, Role: "user", Content: fmt.Sprint(i), CreatedAt: at}})
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errcode.Is(err, errcode.Conflict):
			t.Fatalf("append: %v", err)
		}
	}
	if got, _ := s.ConversationMessages(ctx, "conv-c"); ok != 1 || len(got) != 1 {
		t.Fatalf("%d appends won, %d rows", ok, len(got))
	}
}
