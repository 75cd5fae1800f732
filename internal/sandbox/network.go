package sandbox

// Skeleton (the control-plane engineer replaces the stubs): a sandbox's network, secrets,
// connection records and preview URLs.

import (
	"context"
	"net"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
)

// Network is a sandbox's network as create requests and replies write it: the JSON string
// "none" (Policy nil, the default), or an object {"allow": [...], "deny": [...]}.
type Network struct {
	Policy *egress.Policy
}

// SecretSpec is one entry of a create's "secrets": the sandbox sees NAME=<placeholder>; the
// proxy swaps in the value From resolves to ("env:VAR" or "file:/path") on requests to Hosts.
type SecretSpec struct {
	From  string   `json:"from"`
	Hosts []string `json:"hosts"`
	// Body swaps the placeholder in request bodies too, not only in headers.
	Body bool `json:"body,omitempty"`
}

// ConnectionList is a page of a sandbox's connection records, oldest first.
type ConnectionList struct {
	SandboxID   string              `json:"sandbox_id"`
	Connections []egress.Connection `json:"connections"`
	// Next is the cursor for the following page (pass it as after).
	Next int64 `json:"next"`
	// Omitted counts older records not returned when no cursor was given.
	Omitted int64 `json:"omitted,omitempty"`
}

// SecretCallList is a page of a sandbox's secret swaps, oldest first.
type SecretCallList struct {
	SandboxID string              `json:"sandbox_id"`
	Calls     []egress.SecretCall `json:"calls"`
	Next      int64               `json:"next"`
	Omitted   int64               `json:"omitted,omitempty"`
}

// Exposure is a port of a sandbox reachable as a preview URL.
type Exposure struct {
	SandboxID string `json:"sandbox_id"`
	Port      int    `json:"port"`
	Public    bool   `json:"public"`
	URL       string `json:"url"`
	// AccessToken is given once, in the reply of the expose that made it (private only).
	AccessToken string    `json:"access_token,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
}

var errNotBuilt = errcode.New(errcode.UnsupportedOp, "network is not built yet")

// UpdateNetwork replaces a sandbox's egress policy; the next connection sees it.
func (s *Service) UpdateNetwork(ctx context.Context, id string, p egress.Policy) (Sandbox, error) {
	return Sandbox{}, errNotBuilt
}

// Connections pages a sandbox's connection records: after a cursor (ascending), or without one
// the newest limit (1–1000, 0: 100).
func (s *Service) Connections(ctx context.Context, id string, after int64, limit int) (ConnectionList, error) {
	return ConnectionList{}, errNotBuilt
}

// SecretCalls pages a sandbox's secret swaps like Connections.
func (s *Service) SecretCalls(ctx context.Context, id string, after int64, limit int) (SecretCallList, error) {
	return SecretCallList{}, errNotBuilt
}

// Expose makes port (1–65535) of the sandbox's loopback a preview URL; exposing a port again
// replaces its access (a new token).
func (s *Service) Expose(ctx context.Context, id string, port int, public bool) (Exposure, error) {
	return Exposure{}, errNotBuilt
}

// Unexpose removes a preview URL (FILE_NOT_FOUND-like NOT_FOUND errors are CONFLICT-free:
// unexposing a port that is not exposed is SANDBOX_NOT_FOUND naming the port).
func (s *Service) Unexpose(ctx context.Context, id string, port int) error { return errNotBuilt }

// Exposures lists a sandbox's preview URLs (tokens not included).
func (s *Service) Exposures(ctx context.Context, id string) ([]Exposure, error) {
	return nil, errNotBuilt
}

// AuthorizePreview checks a request for a preview URL: nil when the port is exposed and the
// exposure is public, bearer is true (the caller presented the server's token), or
// accessToken is the exposure's; SANDBOX_NOT_FOUND when the port is not exposed (or no such
// sandbox); AUTH_FAILED otherwise.
func (s *Service) AuthorizePreview(ctx context.Context, id string, port int, accessToken string, bearer bool) error {
	return errNotBuilt
}

// DialPort connects to port on a running sandbox's loopback, through its agent.
func (s *Service) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	return nil, errNotBuilt
}
