package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

func conversationPath(id, rest string) (string, error) {
	if id == "" || strings.ContainsAny(id, "/?#") || len(id) > 128 {
		return "", errcode.New(errcode.InvalidArgument, "conversation id %q is malformed: give an id `agentbox chat ls` shows (conv-…)", id)
	}
	return "/v1/conversations/" + url.PathEscape(id) + rest, nil
}

// CreateConversation records a new conversation (its principal: the caller's key).
func (c *Client) CreateConversation(ctx context.Context, in wire.ConversationCreate) (wire.Conversation, error) {
	var out wire.Conversation
	err := c.doJSON(ctx, http.MethodPost, "/v1/conversations", nil, in, &out)
	return out, err
}

// ListConversations lists the caller's conversations, newest first (limit 0: the default).
func (c *Client) ListConversations(ctx context.Context, limit int) (wire.ConversationList, error) {
	q := url.Values{}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out wire.ConversationList
	err := c.doJSON(ctx, http.MethodGet, "/v1/conversations", q, nil, &out)
	return out, err
}

// GetConversation returns a conversation and its transcript.
func (c *Client) GetConversation(ctx context.Context, id string) (wire.ConversationDetail, error) {
	p, err := conversationPath(id, "")
	if err != nil {
		return wire.ConversationDetail{}, err
	}
	var out wire.ConversationDetail
	err = c.doJSON(ctx, http.MethodGet, p, nil, nil, &out)
	return out, err
}

// AppendConversation records messages of a conversation, in order.
func (c *Client) AppendConversation(ctx context.Context, id string, msgs []wire.ChatMessage) (wire.Conversation, error) {
	p, err := conversationPath(id, "/messages")
	if err != nil {
		return wire.Conversation{}, err
	}
	var out wire.Conversation
	err = c.doJSON(ctx, http.MethodPost, p, nil, wire.ConversationMessages{Messages: msgs}, &out)
	return out, err
}

// UpdateConversation changes a conversation's record (its sandbox).
func (c *Client) UpdateConversation(ctx context.Context, id string, u wire.ConversationUpdate) (wire.Conversation, error) {
	p, err := conversationPath(id, "")
	if err != nil {
		return wire.Conversation{}, err
	}
	var out wire.Conversation
	err = c.doJSON(ctx, http.MethodPatch, p, nil, u, &out)
	return out, err
}

// DeleteConversation deletes a conversation and its transcript.
func (c *Client) DeleteConversation(ctx context.Context, id string) error {
	p, err := conversationPath(id, "")
	if err != nil {
		return err
	}
	var out wire.DeletedConversation
	return c.doJSON(ctx, http.MethodDelete, p, nil, nil, &out)
}
