package guest

// Skeleton: the guest engineer replaces this file.

import (
	"context"
	"net"

	"github.com/agentbox/agentbox/internal/errcode"
)

// NetSession is the host's side of a sandbox's egress session.
type NetSession struct {
	Reply NetSessionReply
}

// NetStream is one connection from inside the sandbox.
type NetStream struct {
	net.Conn
	Header NetStreamHeader
}

// Accept returns the next stream the agent opened, with its header read (bounded, within a
// deadline); it fails once the session is closed or broken.
func (s *NetSession) Accept() (*NetStream, error) {
	return nil, errcode.New(errcode.UnsupportedOp, "not built")
}

// Close ends the session and every stream of it.
func (s *NetSession) Close() error { return nil }

// Done is closed when the session ends.
func (s *NetSession) Done() <-chan struct{} { return nil }

// NetSession opens the sandbox's egress session.
func (c *Client) NetSession(ctx context.Context, req NetSessionRequest) (*NetSession, error) {
	return nil, errcode.New(errcode.UnsupportedOp, "not built")
}

// DialPort connects to port on the sandbox's loopback through the agent.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	return nil, errcode.New(errcode.UnsupportedOp, "not built")
}
