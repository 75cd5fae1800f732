package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

// Conversations of agentbox chat (migration 0021_conversations.sql).

var _ store.ConversationStore = (*Store)(nil)

// maxConversationRows bounds every list whatever the tables hold.
const maxConversationRows = 1000

const conversationCols = `id, principal, title, model, endpoint, sandbox_id, tools, messages, prompt_tokens, completion_tokens, created_at, updated_at`

const conversationMessageCols = `conversation_id, seq, role, content, tool_calls, tool_call_id, tool, is_error, truncated, output_bytes, prompt_tokens, completion_tokens, duration_ms, model, created_at`

func conversationNotFound(id string) error {
	return errcode.New(errcode.ConversationNotFound, "no conversation %s (agentbox chat ls lists the conversations kept)", id).With("conversation_id", id)
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// CreateConversation inserts c.
func (s *Store) CreateConversation(ctx context.Context, c store.Conversation) error {
	tools, _ := json.Marshal(c.Tools)
	if c.Tools == nil {
		tools = []byte("[]")
	}
	if c.Principal == "" {
		c.Principal = "admin"
	}
	err := s.inTx(ctx, func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO conversations (`+conversationCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, 0, 0, 0, ?, ?)`,
			c.ID, c.Principal, c.Title, c.Model, c.Endpoint, c.SandboxID, string(tools), millis(c.CreatedAt), millis(c.UpdatedAt))
		return err
	})
	switch {
	case isPrimaryKeyViolation(err) || isUniqueViolation(err):
		return errcode.Wrap(errcode.Conflict, err, "conversation %s exists", c.ID)
	case err != nil:
		return fmt.Errorf("%s: create conversation %s: %w", s.name, c.ID, err)
	}
	return nil
}

func scanConversation(sc interface{ Scan(...any) error }) (store.Conversation, error) {
	var c store.Conversation
	var tools string
	var created, updated int64
	if err := sc.Scan(&c.ID, &c.Principal, &c.Title, &c.Model, &c.Endpoint, &c.SandboxID, &tools, &c.Messages,
		&c.PromptTokens, &c.CompletionTokens, &created, &updated); err != nil {
		return c, err
	}
	_ = json.Unmarshal([]byte(tools), &c.Tools)
	c.CreatedAt, c.UpdatedAt = fromMillis(created), fromMillis(updated)
	return c, nil
}

// GetConversation returns the conversation of id.
func (s *Store) GetConversation(ctx context.Context, id string) (store.Conversation, error) {
	c, err := scanConversation(s.read.QueryRowContext(ctx, `SELECT `+conversationCols+` FROM conversations WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return c, conversationNotFound(id)
	}
	if err != nil {
		return c, fmt.Errorf("%s: get conversation %s: %w", s.name, id, err)
	}
	return c, nil
}

// ListConversations returns the newest limit conversations of principal ("" = all).
func (s *Store) ListConversations(ctx context.Context, principal string, limit int) ([]store.Conversation, int, error) {
	limit = max(min(limit, maxConversationRows), 1)
	where, args := "", []any{}
	if principal != "" {
		where, args = " WHERE principal = ?", []any{principal}
	}
	var total int
	if err := s.read.QueryRowContext(ctx, `SELECT count(*) FROM conversations`+where, args...).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("%s: list conversations: %w", s.name, err)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+conversationCols+` FROM conversations`+where+` ORDER BY created_at DESC, id DESC LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: list conversations: %w", s.name, err)
	}
	defer rows.Close()
	var out []store.Conversation
	for rows.Next() {
		c, err := scanConversation(rows)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: list conversations: %w", s.name, err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("%s: list conversations: %w", s.name, err)
	}
	return out, max(total-len(out), 0), nil
}

// SetConversationSandbox records the conversation's sandbox.
func (s *Store) SetConversationSandbox(ctx context.Context, id, sandboxID string, at time.Time) error {
	var n int64
	err := s.inTx(ctx, func(tx *Tx) error {
		r, err := tx.ExecContext(ctx, `UPDATE conversations SET sandbox_id = ?, updated_at = ? WHERE id = ?`, sandboxID, millis(at), id)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: set conversation %s's sandbox: %w", s.name, id, err)
	}
	if n == 0 {
		return conversationNotFound(id)
	}
	return nil
}

// AppendConversationMessages appends msgs after the conversation's last message.
func (s *Store) AppendConversationMessages(ctx context.Context, id string, msgs []store.ConversationMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	err := s.inTx(ctx, func(tx *Tx) error {
		var count int
		err := tx.QueryRowContext(ctx, `SELECT messages FROM conversations WHERE id = ?`, id).Scan(&count)
		if errors.Is(err, sql.ErrNoRows) {
			return conversationNotFound(id)
		}
		if err != nil {
			return err
		}
		var pt, ct int64
		last := msgs[0].CreatedAt
		for i, m := range msgs {
			if m.Seq != count+i+1 {
				return errcode.New(errcode.Conflict, "conversation %s has %d messages: the next is %d, not %d (another process appended meanwhile?)",
					id, count+i, count+i+1, m.Seq).With("conversation_id", id).With("messages", count+i)
			}
			if len(m.Content) > store.MaxConversationMessageBytes {
				return errcode.New(errcode.InvalidArgument, "message %d of conversation %s holds %d bytes, over the %d kept per message: cut it",
					m.Seq, id, len(m.Content), store.MaxConversationMessageBytes)
			}
			calls, _ := json.Marshal(m.ToolCalls)
			if m.ToolCalls == nil {
				calls = []byte("[]")
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO conversation_messages (`+conversationMessageCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				id, m.Seq, m.Role, m.Content, string(calls), m.ToolCallID, m.Tool, b2i(m.IsError), b2i(m.Truncated), m.OutputBytes,
				m.PromptTokens, m.CompletionTokens, m.DurationMS, m.Model, millis(m.CreatedAt)); err != nil {
				return err
			}
			pt, ct = pt+m.PromptTokens, ct+m.CompletionTokens
			if m.CreatedAt.After(last) {
				last = m.CreatedAt
			}
		}
		_, err = tx.ExecContext(ctx, `UPDATE conversations SET messages = messages + ?, prompt_tokens = prompt_tokens + ?, completion_tokens = completion_tokens + ?, updated_at = ? WHERE id = ?`,
			len(msgs), pt, ct, millis(last), id)
		return err
	})
	if err != nil {
		if _, ok := errcode.As(err); ok {
			return err
		}
		if isPrimaryKeyViolation(err) || isUniqueViolation(err) {
			return errcode.Wrap(errcode.Conflict, err, "conversation %s: a message of that seq exists", id)
		}
		return fmt.Errorf("%s: append to conversation %s: %w", s.name, id, err)
	}
	return nil
}

// ConversationMessages returns the conversation's messages by seq.
func (s *Store) ConversationMessages(ctx context.Context, id string) ([]store.ConversationMessage, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT `+conversationMessageCols+` FROM conversation_messages WHERE conversation_id = ? ORDER BY seq`, id)
	if err != nil {
		return nil, fmt.Errorf("%s: conversation %s's messages: %w", s.name, id, err)
	}
	defer rows.Close()
	var out []store.ConversationMessage
	for rows.Next() {
		var m store.ConversationMessage
		var calls string
		var isErr, trunc, created int64
		if err := rows.Scan(&m.ConversationID, &m.Seq, &m.Role, &m.Content, &calls, &m.ToolCallID, &m.Tool, &isErr, &trunc, &m.OutputBytes,
			&m.PromptTokens, &m.CompletionTokens, &m.DurationMS, &m.Model, &created); err != nil {
			return nil, fmt.Errorf("%s: conversation %s's messages: %w", s.name, id, err)
		}
		_ = json.Unmarshal([]byte(calls), &m.ToolCalls)
		m.IsError, m.Truncated, m.CreatedAt = isErr != 0, trunc != 0, fromMillis(created)
		out = append(out, m)
	}
	return out, rows.Err()
}

// DeleteConversation deletes the conversation and its messages.
func (s *Store) DeleteConversation(ctx context.Context, id string) error {
	var n int64
	err := s.inTx(ctx, func(tx *Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM conversation_messages WHERE conversation_id = ?`, id); err != nil {
			return err
		}
		r, err := tx.ExecContext(ctx, `DELETE FROM conversations WHERE id = ?`, id)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: delete conversation %s: %w", s.name, id, err)
	}
	if n == 0 {
		return conversationNotFound(id)
	}
	return nil
}

// ConversationPrincipal is the principal of the conversation of id (the authorization gate's
// question).
func (s *Store) ConversationPrincipal(ctx context.Context, id string) (string, error) {
	var p string
	err := s.read.QueryRowContext(ctx, `SELECT principal FROM conversations WHERE id = ?`, id).Scan(&p)
	if errors.Is(err, sql.ErrNoRows) {
		return "", conversationNotFound(id)
	}
	if err != nil {
		return "", fmt.Errorf("%s: conversation %s: %w", s.name, id, err)
	}
	return p, nil
}
