package api

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/wire"
)

// Conversations of agentbox chat: /v1/conversations over Options.Conversations. The chat
// process records each message as it happens (POST …/messages); another principal's
// conversation is CONVERSATION_NOT_FOUND (the authorization gate, gate.ObjectConversation).

// Bounds of the conversation routes.
const (
	DefaultConversationPage = 50
	MaxConversationPage     = 1000
	// MaxConversationAppend bounds the messages of one append.
	MaxConversationAppend = 256
	maxConversationField  = 4096 // title, model, endpoint, a tool name
)

var conversationRoles = map[string]bool{"system": true, "user": true, "assistant": true, "tool": true}

func (s *Server) conversations(w http.ResponseWriter, r *http.Request) (store.ConversationStore, bool) {
	if s.opts.Conversations == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this server does not keep conversations"))
		return nil, false
	}
	return s.opts.Conversations, true
}

func checkConversationField(name, v string) error {
	if len(v) > maxConversationField || !utf8.ValidString(v) {
		return errcode.New(errcode.InvalidArgument, "%s must be UTF-8 text of at most %d bytes", name, maxConversationField)
	}
	return nil
}

func (s *Server) createConversation(w http.ResponseWriter, r *http.Request) {
	cs, ok := s.conversations(w, r)
	if !ok {
		return
	}
	var body wire.ConversationCreate
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	for name, v := range map[string]string{"title": body.Title, "model": body.Model, "endpoint": body.Endpoint} {
		if err := checkConversationField(name, v); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	if len(body.Tools) > 256 {
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "tools names at most 256 tools"))
		return
	}
	if body.ID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		body.ID = "conv-" + hex.EncodeToString(b[:])
	} else if err := checkIDArg("id", body.ID); err != nil {
		s.fail(w, r, err)
		return
	}
	if strings.Contains(body.Endpoint, "@") {
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "endpoint must not hold credentials (user:password@): send the base URL alone"))
		return
	}
	principal := gate.AdminPrincipal
	if c, ok := gate.CallerFrom(r.Context()); ok && c.Principal != "" {
		principal = c.Principal
	}
	now := time.Now().UTC()
	c := store.Conversation{ID: body.ID, Principal: principal, Title: body.Title, Model: body.Model, Endpoint: body.Endpoint,
		Tools: body.Tools, CreatedAt: now, UpdatedAt: now}
	if err := cs.CreateConversation(r.Context(), c); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wireConversation(c))
}

func (s *Server) listConversations(w http.ResponseWriter, r *http.Request) {
	cs, ok := s.conversations(w, r)
	if !ok {
		return
	}
	lim, err := boundedParam(r.URL.Query(), "limit", 1, MaxConversationPage)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	principal, _ := authz.ListPrincipal(r.Context()) // an admin's list shows every conversation
	list, omitted, err := cs.ListConversations(r.Context(), principal, int(ptrOr(lim, DefaultConversationPage)))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := wire.ConversationList{Conversations: convSlice(list, wireConversation), Omitted: omitted}
	if out.Conversations == nil {
		out.Conversations = []wire.Conversation{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getConversation(w http.ResponseWriter, r *http.Request) {
	cs, ok := s.conversations(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	c, err := cs.GetConversation(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	msgs, err := cs.ConversationMessages(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := wire.ConversationDetail{Conversation: wireConversation(c), Transcript: convSlice(msgs, wireChatMessage)}
	if out.Transcript == nil {
		out.Transcript = []wire.ChatMessage{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) updateConversation(w http.ResponseWriter, r *http.Request) {
	cs, ok := s.conversations(w, r)
	if !ok {
		return
	}
	var body wire.ConversationUpdate
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	if body.SandboxID != nil {
		if *body.SandboxID != "" {
			if err := checkIDArg("sandbox_id", *body.SandboxID); err != nil {
				s.fail(w, r, err)
				return
			}
		}
		if err := cs.SetConversationSandbox(r.Context(), id, *body.SandboxID, time.Now().UTC()); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	c, err := cs.GetConversation(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireConversation(c))
}

func (s *Server) appendConversation(w http.ResponseWriter, r *http.Request) {
	cs, ok := s.conversations(w, r)
	if !ok {
		return
	}
	var body wire.ConversationMessages
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if len(body.Messages) == 0 || len(body.Messages) > MaxConversationAppend {
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "messages must hold 1 to %d messages", MaxConversationAppend))
		return
	}
	id := r.PathValue("id")
	msgs := make([]store.ConversationMessage, 0, len(body.Messages))
	for _, m := range body.Messages {
		if !conversationRoles[m.Role] {
			s.fail(w, r, errcode.New(errcode.InvalidArgument, "message %d: role must be system, user, assistant or tool, not %q", m.Seq, m.Role))
			return
		}
		if !utf8.ValidString(m.Content) {
			s.fail(w, r, errcode.New(errcode.InvalidArgument, "message %d: content must be UTF-8 text", m.Seq))
			return
		}
		sm := store.ConversationMessage{ConversationID: id, Seq: m.Seq, Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Tool: m.Tool,
			IsError: m.IsError, Truncated: m.Truncated, OutputBytes: m.OutputBytes, PromptTokens: m.PromptTokens, CompletionTokens: m.CompletionTokens,
			DurationMS: m.DurationMS, Model: m.Model, CreatedAt: m.CreatedAt}
		if sm.CreatedAt.IsZero() {
			sm.CreatedAt = time.Now().UTC()
		}
		for _, tc := range m.ToolCalls {
			sm.ToolCalls = append(sm.ToolCalls, store.ConversationToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
		}
		msgs = append(msgs, sm)
	}
	if err := cs.AppendConversationMessages(r.Context(), id, msgs); err != nil {
		s.fail(w, r, err)
		return
	}
	c, err := cs.GetConversation(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireConversation(c))
}

func (s *Server) deleteConversation(w http.ResponseWriter, r *http.Request) {
	cs, ok := s.conversations(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if err := cs.DeleteConversation(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.DeletedConversation{ConversationID: id, Deleted: true})
}

func wireConversation(c store.Conversation) wire.Conversation {
	return wire.Conversation{ID: c.ID, Principal: c.Principal, Title: c.Title, Model: c.Model, Endpoint: c.Endpoint, SandboxID: c.SandboxID,
		Tools: c.Tools, Messages: c.Messages, PromptTokens: c.PromptTokens, CompletionTokens: c.CompletionTokens, CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt}
}

func wireChatMessage(m store.ConversationMessage) wire.ChatMessage {
	out := wire.ChatMessage{Seq: m.Seq, Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Tool: m.Tool, IsError: m.IsError,
		Truncated: m.Truncated, OutputBytes: m.OutputBytes, PromptTokens: m.PromptTokens, CompletionTokens: m.CompletionTokens,
		DurationMS: m.DurationMS, Model: m.Model, CreatedAt: m.CreatedAt}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, wire.ChatToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
	}
	return out
}
