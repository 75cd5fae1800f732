// Package netsession is a sandbox's network: its egress (the create's network and secrets
// checked and set, the session that carries the sandbox's connections to the egress proxy,
// policy updates), the records of what the proxy did (a queue written in batches, pages of
// connection and secret-call records, a wake-up for their live watchers) and its preview URLs
// (expose, unexpose, list, the preview proxy's authorization and its dial to the sandbox's
// port). It is a feature over the sandbox lifecycle core, which it reaches through its
// sandbox.Core handle and which calls it through the hooks it registers (a create's Prepare,
// Spec and Up; Adopted, Woken, Resumed, Claimed, Released), and reads and writes the durable
// state it needs through its own Store.
package netsession

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net"
	"slices"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

// Store is what the network feature reads and writes of durable state (sandbox.Store
// includes it).
type Store interface {
	GetSandbox(ctx context.Context, id string) (sandbox.Sandbox, error)
	// ListConnections returns sandboxID's connections with seq > after, oldest first, at most
	// limit; with after 0, the newest limit in ascending order and how many older ones that
	// left out.
	ListConnections(ctx context.Context, sandboxID string, after int64, limit int) ([]egress.Connection, int64, error)
	// ListSecretCalls is ListConnections for secret calls.
	ListSecretCalls(ctx context.Context, sandboxID string, after int64, limit int) ([]egress.SecretCall, int64, error)
	// PutExposure records e (URL and AccessToken are not stored), replacing the sandbox's
	// exposure of the same port; SANDBOX_NOT_FOUND if the sandbox's record does not exist.
	PutExposure(ctx context.Context, e sandbox.Exposure) error
	// GetExposure returns the exposure of port; SANDBOX_NOT_FOUND naming the port if none.
	GetExposure(ctx context.Context, sandboxID string, port int) (sandbox.Exposure, error)
	// ListExposures returns a sandbox's exposures by port.
	ListExposures(ctx context.Context, sandboxID string) ([]sandbox.Exposure, error)
	// DeleteExposure removes the exposure of port; SANDBOX_NOT_FOUND naming the port if none.
	DeleteExposure(ctx context.Context, sandboxID string, port int) error
	// AppendNetRecords writes a batch of the proxy's records (sandbox.NetStore).
	AppendNetRecords(ctx context.Context, conns []egress.Connection, calls []egress.SecretCall, events []sandbox.Event, keep int) error
	// UpdateSandbox writes sb (its version checked) with ev (sandbox.Store).
	UpdateSandbox(ctx context.Context, sb sandbox.Sandbox, ev sandbox.Event) error
}

// Service serves sandboxes' networks. It is safe for concurrent use.
type Service struct {
	core  *sandbox.Core
	store Store

	net     netState   // egress sandboxes' sessions and records (egress.go, records.go)
	recWake recordWake // wakes watchers of connection records (recordwake.go)
}

type featureKey struct{}

// New returns the network feature over core, reading and writing st, and registers its hooks:
// one per core, however often asked. Build it at wiring time, before the features whose create
// hooks read the network it prepares (the warm pools). With an egress proxy configured
// (sandbox.Config.Egress) it records what the proxy did and serves egress sandboxes' sessions.
func New(core *sandbox.Core, st Store) *Service {
	return core.Feature(featureKey{}, func() any {
		s := &Service{core: core, store: st, net: netState{m: map[string]*netSandbox{}}}
		if p := core.EgressProxy(); p != nil {
			s.net.proxy, s.net.rec = p, newRecordQueue()
			core.SetEgressRecorder(s)
			core.Go(s.flushRecords)
		}
		core.Register(sandbox.Hooks{Name: "network",
			Adopted:  func(_ context.Context, sb sandbox.Sandbox, rt runtime.Runtime) { s.startNet(sb, rt, nil) },
			Released: s.stopNet, Prepare: s.prepare, Spec: s.spec, Up: s.up, Claimed: s.claimed, Woken: s.woken,
			Resumed: func(_ context.Context, sb sandbox.Sandbox, rt runtime.Runtime) { s.startNet(sb, rt, nil) }})
		return s
	}).(*Service)
}

// checkPage validates a records page's cursor and limit.
func checkPage(id string, after int64, limit int) (int, error) {
	if err := sandboxid.Check(id); err != nil {
		return 0, err
	}
	if after < 0 {
		return 0, errcode.New(errcode.InvalidArgument, "after must be a cursor from a previous page (a seq, ≥ 0); got %d", after)
	}
	if limit < 0 || limit > sandbox.MaxNetList {
		return 0, errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", sandbox.MaxNetList, limit)
	}
	if limit == 0 {
		limit = sandbox.DefaultNetList
	}
	return limit, nil
}

// pageRecords reads one page of a sandbox's records with list (ListConnections or
// ListSecretCalls) after checking the cursor, the limit and the sandbox; it returns the page
// (never nil), the cursor of the next page and how many older records were left out.
func pageRecords[T any](ctx context.Context, s *Service, id string, after int64, limit int,
	list func(Store, context.Context, string, int64, int) ([]T, int64, error), seq func(T) int64) ([]T, int64, int64, error) {
	limit, err := checkPage(id, after, limit)
	if err != nil {
		return nil, 0, 0, err
	}
	if _, err := s.store.GetSandbox(ctx, id); err != nil {
		return nil, 0, 0, err
	}
	page, omitted, err := list(s.store, ctx, id, after, limit)
	if err != nil {
		return nil, 0, 0, err
	}
	next := after
	if n := len(page); n > 0 {
		next = seq(page[n-1])
	}
	if page == nil {
		page = []T{}
	}
	return page, next, omitted, nil
}

// Connections pages a sandbox's connection records: after a cursor (ascending), or without one
// (after 0) the newest limit (1–1000, 0: 100) in ascending order, with how many older ones
// were left out.
func (s *Service) Connections(ctx context.Context, id string, after int64, limit int) (sandbox.ConnectionList, error) {
	page, next, omitted, err := pageRecords(ctx, s, id, after, limit, Store.ListConnections,
		func(c egress.Connection) int64 { return c.Seq })
	if err != nil {
		return sandbox.ConnectionList{}, err
	}
	return sandbox.ConnectionList{SandboxID: id, Connections: page, Next: next, Omitted: omitted}, nil
}

// SecretCalls pages a sandbox's secret swaps like Connections.
func (s *Service) SecretCalls(ctx context.Context, id string, after int64, limit int) (sandbox.SecretCallList, error) {
	page, next, omitted, err := pageRecords(ctx, s, id, after, limit, Store.ListSecretCalls,
		func(c egress.SecretCall) int64 { return c.Seq })
	if err != nil {
		return sandbox.SecretCallList{}, err
	}
	return sandbox.SecretCallList{SandboxID: id, Calls: page, Next: next, Omitted: omitted}, nil
}

func checkPort(port int) error {
	if port < 1 || port > 65535 {
		return errcode.New(errcode.InvalidArgument, "port must be between 1 and 65535; got %d", port)
	}
	return nil
}

// Expose makes port (1–65535) of the sandbox's loopback a preview URL; exposing a port again
// replaces its access (a new token). A private exposure's AccessToken is in this reply only.
// The record is written before it returns.
func (s *Service) Expose(ctx context.Context, id string, port int, public bool) (sandbox.Exposure, error) {
	if err := sandboxid.Check(id); err != nil {
		return sandbox.Exposure{}, err
	}
	if err := checkPort(port); err != nil {
		return sandbox.Exposure{}, err
	}
	previewURL := s.core.Config().PreviewURL
	if previewURL == nil {
		return sandbox.Exposure{}, errcode.New(errcode.UnsupportedOp, "preview URLs are served by agentbox serve")
	}
	if err := s.core.WakeForCall(ctx, id); err != nil {
		return sandbox.Exposure{}, err
	}
	unlock := s.core.Lock(id)
	defer unlock()
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return sandbox.Exposure{}, err
	}
	if sb.State != sandbox.StateRunning {
		return sandbox.Exposure{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a running sandbox's ports can be exposed", id, sb.State).With("state", string(sb.State))
	}
	have, err := s.store.ListExposures(ctx, id)
	if err != nil {
		return sandbox.Exposure{}, err
	}
	if len(have) >= sandbox.MaxExposures && !slices.ContainsFunc(have, func(e sandbox.Exposure) bool { return e.Port == port }) {
		return sandbox.Exposure{}, errcode.New(errcode.InvalidArgument, "sandbox %s has %d exposed ports, the most allowed; unexpose one first", id, len(have))
	}
	e := sandbox.Exposure{SandboxID: id, Port: port, Public: public, CreatedAt: s.core.Now().Truncate(time.Millisecond)}
	if !public {
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return sandbox.Exposure{}, err
		}
		e.AccessToken = base64.RawURLEncoding.EncodeToString(b[:])
		e.TokenHash = tokenHash(e.AccessToken)
	}
	if err := s.store.PutExposure(ctx, e); err != nil {
		return sandbox.Exposure{}, err
	}
	e.URL = previewURL(id, port)
	s.core.Log().Info("sandbox port exposed", "sandbox_id", id, "port", port, "public", public)
	return e, nil
}

func tokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// Unexpose removes a preview URL. Unexposing a port that is not exposed is SANDBOX_NOT_FOUND
// naming the port ("port 8080 of sb-… is not exposed"), as a preview URL that does not exist
// is.
func (s *Service) Unexpose(ctx context.Context, id string, port int) error {
	if err := sandboxid.Check(id); err != nil {
		return err
	}
	if err := checkPort(port); err != nil {
		return err
	}
	if _, err := s.store.GetSandbox(ctx, id); err != nil {
		return err
	}
	return s.store.DeleteExposure(ctx, id, port)
}

// Exposures lists a sandbox's preview URLs (tokens not included).
func (s *Service) Exposures(ctx context.Context, id string) ([]sandbox.Exposure, error) {
	if err := sandboxid.Check(id); err != nil {
		return nil, err
	}
	if _, err := s.store.GetSandbox(ctx, id); err != nil {
		return nil, err
	}
	list, err := s.store.ListExposures(ctx, id)
	if err != nil {
		return nil, err
	}
	previewURL := s.core.Config().PreviewURL
	out := make([]sandbox.Exposure, 0, len(list))
	for _, e := range list {
		e.TokenHash = ""
		if previewURL != nil {
			e.URL = previewURL(id, e.Port)
		}
		out = append(out, e)
	}
	return out, nil
}

// AuthorizePreview checks a request for a preview URL: nil when the port is exposed and the
// exposure is public, bearer is true (the caller presented the server's token), or
// accessToken is the exposure's; SANDBOX_NOT_FOUND when the port is not exposed (or no such
// sandbox); AUTH_FAILED otherwise.
func (s *Service) AuthorizePreview(ctx context.Context, id string, port int, accessToken string, bearer bool) error {
	if err := sandboxid.Check(id); err != nil {
		return err
	}
	if err := checkPort(port); err != nil {
		return err
	}
	e, err := s.store.GetExposure(ctx, id, port)
	if err != nil {
		return err
	}
	if e.Public || bearer {
		return nil
	}
	got := tokenHash(accessToken)
	if accessToken != "" && e.TokenHash != "" && subtle.ConstantTimeCompare([]byte(got), []byte(e.TokenHash)) == 1 {
		return nil
	}
	return errcode.New(errcode.AuthFailed, "port %d of %s is private: present the server's bearer token or the access token its expose returned", port, id)
}

// DialPort connects to port on a running sandbox's loopback, through its agent.
func (s *Service) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if err := checkPort(port); err != nil {
		return nil, err
	}
	sb, gc, err := s.core.Running(ctx, id, true)
	if err != nil {
		return nil, err
	}
	c, err := gc.DialPort(ctx, port)
	if err != nil {
		return nil, s.core.GuestFailed(ctx, sb, err)
	}
	return c, nil
}
