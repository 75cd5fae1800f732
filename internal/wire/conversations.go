package wire

import "time"

// Conversations of `agentbox chat`: REST /v1/conversations.

// Conversation is one conversation of `agentbox chat` with a model, kept by the server.
type Conversation struct {
	ID string `json:"id"`
	// Principal is the key that owns it ("key:<id>", or "admin").
	Principal string `json:"principal,omitempty"`
	Title     string `json:"title"`
	Model     string `json:"model"`
	// Endpoint is the model's base URL (never a key).
	Endpoint  string `json:"endpoint"`
	SandboxID string `json:"sandbox_id,omitempty"`
	// Tools are the tools offered to the model (empty: all of the server's).
	Tools []string `json:"tools,omitempty"`
	// Messages counts the messages kept; the token counts add up every model reply's usage.
	Messages         int       `json:"messages"`
	PromptTokens     int64     `json:"prompt_tokens"`
	CompletionTokens int64     `json:"completion_tokens"`
	CreatedAt        time.Time `json:"created_at"`
	UpdatedAt        time.Time `json:"updated_at"`
}

// ChatToolCall is one tool call an assistant message asks for.
type ChatToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"` // JSON text, as the model wrote it
}

// ChatMessage is one message of a conversation, in the order the model sees them (Seq from 1).
type ChatMessage struct {
	Seq int `json:"seq"`
	// Role is system, user, assistant or tool.
	Role    string `json:"role"`
	Content string `json:"content"`
	// ToolCalls: an assistant message's calls. ToolCallID and Tool: a tool message's call.
	ToolCalls  []ChatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	Tool       string         `json:"tool,omitempty"`
	// IsError: the tool call failed (its content says how). Truncated: the content fed back was
	// cut to the loop's bound (OutputBytes is the whole output's size).
	IsError     bool  `json:"is_error,omitempty"`
	Truncated   bool  `json:"truncated,omitempty"`
	OutputBytes int64 `json:"output_bytes,omitempty"`
	// An assistant message's usage, as the endpoint reported it.
	PromptTokens     int64 `json:"prompt_tokens,omitempty"`
	CompletionTokens int64 `json:"completion_tokens,omitempty"`
	// DurationMS: the model's reply time (assistant) or the tool call's (tool).
	DurationMS int64 `json:"duration_ms,omitempty"`
	// Model: the model that wrote an assistant message.
	Model     string    `json:"model,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// ConversationCreate is POST /v1/conversations's body.
type ConversationCreate struct {
	ID       string   `json:"id,omitempty"`
	Title    string   `json:"title"`
	Model    string   `json:"model"`
	Endpoint string   `json:"endpoint"`
	Tools    []string `json:"tools,omitempty"`
}

// ConversationUpdate is PATCH /v1/conversations/{id}'s body: the fields set change.
type ConversationUpdate struct {
	SandboxID *string `json:"sandbox_id,omitempty"`
	Model     *string `json:"model,omitempty"`
	Endpoint  *string `json:"endpoint,omitempty"`
}

// ConversationList is GET /v1/conversations's reply, newest first.
type ConversationList struct {
	Conversations []Conversation `json:"conversations"`
	Omitted       int            `json:"omitted"`
}

// ConversationDetail is GET /v1/conversations/{id}'s reply.
type ConversationDetail struct {
	Conversation
	Transcript []ChatMessage `json:"transcript"`
}

// ConversationMessages is POST /v1/conversations/{id}/messages's body: messages appended
// in order; a Seq already kept is CONFLICT and nothing of the call is written.
type ConversationMessages struct {
	Messages []ChatMessage `json:"messages"`
}

// DeletedConversation is DELETE /v1/conversations/{id}'s reply.
type DeletedConversation struct {
	ConversationID string `json:"conversation_id"`
	Deleted        bool   `json:"deleted"`
}
