package store

import (
	"context"
	"time"
)

// Conversations of `agentbox chat` (internal/chat; REST /v1/conversations).

// MaxConversationMessageBytes bounds one message's content as kept (the loop feeds back at
// most its own bound of tool output; a longer content is refused, not cut).
const MaxConversationMessageBytes = 1 << 20

// Conversation is one conversation's record. Principal owns it (another principal is told it
// does not exist). Endpoint is the model's base URL: never a key.
type Conversation struct {
	ID               string
	Principal        string
	Title            string
	Model            string
	Endpoint         string
	SandboxID        string
	Tools            []string
	Messages         int
	PromptTokens     int64
	CompletionTokens int64
	CreatedAt        time.Time
	UpdatedAt        time.Time
}

// ConversationToolCall is one tool call of an assistant message.
type ConversationToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ConversationMessage is one message of a conversation, Seq 1, 2, 3, … in order.
type ConversationMessage struct {
	ConversationID   string
	Seq              int
	Role             string
	Content          string
	ToolCalls        []ConversationToolCall
	ToolCallID       string
	Tool             string
	IsError          bool
	Truncated        bool
	OutputBytes      int64
	PromptTokens     int64
	CompletionTokens int64
	DurationMS       int64
	Model            string
	CreatedAt        time.Time
}

// ConversationStore keeps conversations and their messages.
type ConversationStore interface {
	// CreateConversation inserts c (Messages and the token counts start at 0); CONFLICT when
	// its id exists.
	CreateConversation(ctx context.Context, c Conversation) error
	// GetConversation returns the conversation of id; CONVERSATION_NOT_FOUND when none.
	GetConversation(ctx context.Context, id string) (Conversation, error)
	// ConversationPrincipal returns the principal of the conversation of id (the
	// authorization gate's question); CONVERSATION_NOT_FOUND when none.
	ConversationPrincipal(ctx context.Context, id string) (string, error)
	// ListConversations returns the newest limit conversations of principal (all principals'
	// when principal is "") and how many older ones there are.
	ListConversations(ctx context.Context, principal string, limit int) ([]Conversation, int, error)
	// SetConversationSandbox records the conversation's sandbox; CONVERSATION_NOT_FOUND when none.
	SetConversationSandbox(ctx context.Context, id, sandboxID string, at time.Time) error
	// AppendConversationMessages appends msgs in one transaction: their Seq must continue the
	// conversation's (CONFLICT otherwise, and nothing is written); the conversation's message
	// count, token counts and UpdatedAt follow. CONVERSATION_NOT_FOUND when none.
	AppendConversationMessages(ctx context.Context, id string, msgs []ConversationMessage) error
	// ConversationMessages returns the conversation's messages by Seq.
	ConversationMessages(ctx context.Context, id string) ([]ConversationMessage, error)
	// DeleteConversation deletes the conversation and its messages; CONVERSATION_NOT_FOUND
	// when none.
	DeleteConversation(ctx context.Context, id string) error
}
