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

func approvalPath(id, rest string) (string, error) {
	if id == "" || strings.ContainsAny(id, "/?#") || len(id) > 128 {
		return "", errcode.New(errcode.InvalidArgument, "approval id %q is malformed: give an id `agentbox approvals ls` shows (ap-…)", id)
	}
	return "/v1/approvals/" + url.PathEscape(id) + rest, nil
}

// ListApprovals lists approvals newest first (state "": all; limit 0: the server's default).
func (c *Client) ListApprovals(ctx context.Context, state wire.ApprovalState, limit int) ([]wire.Approval, error) {
	q := url.Values{}
	if state != "" {
		q.Set("state", string(state))
	}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l wire.ApprovalList
	err := c.doJSON(ctx, http.MethodGet, "/v1/approvals", q, nil, &l)
	return l.Approvals, err
}

// ApprovalPolicy returns which calls the server holds for a decision, and whether this
// client's key may decide them.
func (c *Client) ApprovalPolicy(ctx context.Context) (wire.ApprovalPolicy, error) {
	var p wire.ApprovalPolicy
	err := c.doJSON(ctx, http.MethodGet, "/v1/approvals/policy", nil, nil, &p)
	return p, err
}

// GetApproval returns one approval.
func (c *Client) GetApproval(ctx context.Context, id string) (wire.Approval, error) {
	p, err := approvalPath(id, "")
	if err != nil {
		return wire.Approval{}, err
	}
	var a wire.Approval
	err = c.doJSON(ctx, http.MethodGet, p, nil, nil, &a)
	return a, err
}

// DecideApproval approves (or denies) a pending approval, with an optional reason.
func (c *Client) DecideApproval(ctx context.Context, id string, approve bool, reason string) (wire.Approval, error) {
	verb := "/deny"
	if approve {
		verb = "/approve"
	}
	p, err := approvalPath(id, verb)
	if err != nil {
		return wire.Approval{}, err
	}
	var a wire.Approval
	err = c.doJSON(ctx, http.MethodPost, p, nil, wire.DecisionRequest{Reason: reason}, &a)
	return a, err
}
