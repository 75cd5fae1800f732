package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/internal/wire"
)

// ListMachines lists the joined machines, by name.
func (c *Client) ListMachines(ctx context.Context) ([]wire.Machine, error) {
	var out wire.MachineList
	err := c.doJSON(ctx, http.MethodGet, "/v1/machines", nil, nil, &out)
	return out.Machines, err
}

// GetMachine returns the machine whose id, name or alias is ref.
func (c *Client) GetMachine(ctx context.Context, ref string) (wire.Machine, error) {
	var out wire.Machine
	err := c.doJSON(ctx, http.MethodGet, "/v1/machines/"+url.PathEscape(ref), nil, nil, &out)
	return out, err
}

// ProbeMachine asks machine ref's agent who it is, over its live session.
func (c *Client) ProbeMachine(ctx context.Context, ref string) (wire.AgentInfo, error) {
	var out wire.AgentInfo
	err := c.doJSON(ctx, http.MethodGet, "/v1/machines/"+url.PathEscape(ref)+"/agent", nil, nil, &out)
	return out, err
}

// RemoveMachine removes machine ref and cuts its connection (admin scope).
func (c *Client) RemoveMachine(ctx context.Context, ref string) (wire.Machine, error) {
	var out wire.Machine
	err := c.doJSON(ctx, http.MethodDelete, "/v1/machines/"+url.PathEscape(ref), nil, nil, &out)
	return out, err
}

// AddMachineAlias gives machine ref an alias (admin scope).
func (c *Client) AddMachineAlias(ctx context.Context, ref, alias string) (wire.Machine, error) {
	var out wire.Machine
	err := c.doJSON(ctx, http.MethodPost, "/v1/machines/"+url.PathEscape(ref)+"/aliases", nil, wire.AliasRequest{Alias: alias}, &out)
	return out, err
}

// RemoveMachineAlias takes an alias from machine ref (admin scope).
func (c *Client) RemoveMachineAlias(ctx context.Context, ref, alias string) (wire.Machine, error) {
	var out wire.Machine
	err := c.doJSON(ctx, http.MethodDelete, "/v1/machines/"+url.PathEscape(ref)+"/aliases/"+url.PathEscape(alias), nil, nil, &out)
	return out, err
}

// CreateJoinToken makes a join token (admin scope); its secret is in the reply, once.
func (c *Client) CreateJoinToken(ctx context.Context, req wire.TokenRequest) (wire.CreatedToken, error) {
	var out wire.CreatedToken
	err := c.doJSON(ctx, http.MethodPost, "/v1/machines/tokens", nil, req, &out)
	return out, err
}

// ListJoinTokens lists the join tokens without their secrets (admin scope).
func (c *Client) ListJoinTokens(ctx context.Context) ([]wire.JoinToken, error) {
	var out struct {
		Tokens []wire.JoinToken `json:"tokens"`
	}
	err := c.doJSON(ctx, http.MethodGet, "/v1/machines/tokens", nil, nil, &out)
	return out.Tokens, err
}

// RevokeJoinToken revokes a join token by id or prefix (admin scope).
func (c *Client) RevokeJoinToken(ctx context.Context, ref string) (wire.JoinToken, error) {
	var out wire.JoinToken
	err := c.doJSON(ctx, http.MethodDelete, "/v1/machines/tokens/"+url.PathEscape(ref), nil, nil, &out)
	return out, err
}
