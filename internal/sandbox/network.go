package sandbox

// A sandbox's network: its egress policy (network "none" or {"allow": [...], "deny": [...]}),
// its secrets (placeholders in its environment, swapped at the egress proxy), the records of
// its connections and secret swaps, and its preview URLs. The session that carries its egress
// is in netsession.go, the records' queue in netrecords.go; reading the records and serving
// preview URLs is the feature package internal/sandbox/netsession. The types here (records'
// pages, exposures) are the store's and that package's.

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/text"
)

// Network is a sandbox's network as create requests and replies write it: the JSON string
// "none" (Policy nil, the default), or an object {"allow": [...], "deny": [...]}.
type Network struct {
	Policy *egress.Policy
}

// MarshalJSON writes "none" or {"allow": [...], "deny": [...]} (arrays never null).
func (n Network) MarshalJSON() ([]byte, error) {
	if n.Policy == nil {
		return []byte(`"none"`), nil
	}
	return json.Marshal(NormalPolicy(*n.Policy))
}

// UnmarshalJSON reads "none" (or null) or an object with only "allow" and "deny".
func (n *Network) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	const want = `network must be "none" or {"allow": ["host", ...], "deny": [...]}`
	switch {
	case bytes.Equal(b, []byte("null")):
		n.Policy = nil
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil || s != "none" {
			return errcode.New(errcode.InvalidArgument, "%s; got %s", want, text.Truncate(string(b), 64))
		}
		n.Policy = nil
		return nil
	case len(b) > 0 && b[0] == '{':
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var p egress.Policy
		if err := dec.Decode(&p); err != nil {
			return errcode.Wrap(errcode.InvalidArgument, err, "%s: %s", want, text.Truncate(err.Error(), 200))
		}
		p = NormalPolicy(p)
		n.Policy = &p
		return nil
	}
	return errcode.New(errcode.InvalidArgument, "%s; got %s", want, text.Truncate(string(b), 64))
}

// NormalPolicy returns p with non-nil arrays (how records and replies write a policy).
func NormalPolicy(p egress.Policy) egress.Policy {
	if p.Allow == nil {
		p.Allow = []string{}
	}
	if p.Deny == nil {
		p.Deny = []string{}
	}
	return p
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
	// TokenHash is the SHA-256 (hex) of the access token, as the store keeps it; never in a
	// reply ("" for a public exposure).
	TokenHash string `json:"-"`
}

// NetStore is what a sandbox's network needs of durable state. internal/store.Store includes it.
//
// Records of a sandbox whose record does not exist (pruned) are dropped without error.
type NetStore interface {
	// AppendNetRecords inserts connection and secret-call records (their Seq assigned) and
	// events (each appended to its sandbox's events as is, without a version bump) in one
	// transaction, then deletes, for each sandbox it touched, all but the newest keep
	// connections and the newest keep secret calls.
	AppendNetRecords(ctx context.Context, conns []egress.Connection, calls []egress.SecretCall, events []Event, keep int) error
	// ListConnections returns sandboxID's connections with seq > after, oldest first, at most
	// limit; with after 0, the newest limit in ascending order and how many older ones that
	// left out.
	ListConnections(ctx context.Context, sandboxID string, after int64, limit int) ([]egress.Connection, int64, error)
	// ListSecretCalls is ListConnections for secret calls.
	ListSecretCalls(ctx context.Context, sandboxID string, after int64, limit int) ([]egress.SecretCall, int64, error)
	// PutExposure records e (URL and AccessToken are not stored), replacing the sandbox's
	// exposure of the same port; SANDBOX_NOT_FOUND if the sandbox's record does not exist.
	PutExposure(ctx context.Context, e Exposure) error
	// GetExposure returns the exposure of port; SANDBOX_NOT_FOUND naming the port if none.
	GetExposure(ctx context.Context, sandboxID string, port int) (Exposure, error)
	// ListExposures returns a sandbox's exposures by port.
	ListExposures(ctx context.Context, sandboxID string) ([]Exposure, error)
	// DeleteExposure removes the exposure of port; SANDBOX_NOT_FOUND naming the port if none.
	DeleteExposure(ctx context.Context, sandboxID string, port int) error
	// DeleteExposures removes every exposure of a sandbox.
	DeleteExposures(ctx context.Context, sandboxID string) error
}

// EgressProxy serves the egress streams of every sandbox (*egress.Proxy).
type EgressProxy interface {
	Serve(ctx context.Context, t *egress.Target, c net.Conn, kind egress.Kind, origDst netip.AddrPort)
}

// EgressConfig configures sandboxes' networks (the network feature, internal/sandbox/netsession,
// serves them). With NewProxy nil, creates with a network policy are refused
// (UNSUPPORTED_OPERATION).
type EgressConfig struct {
	// NewProxy builds the egress proxy every egress stream is handed to; rec records what the
	// proxy did (egress.Config.Recorder), for the network feature. Called once, by NewService.
	NewProxy func(rec egress.Recorder) (EgressProxy, error)
	// CABundle is the PEM bundle egress sandboxes trust (runtime.Spec.CABundle): the host's
	// roots and agentbox's CA.
	CABundle []byte
	// CheckSecretSource says whether a secret's "from" ("env:VAR", "file:/path") is one the
	// server allows (--secret-env, --secret-dir), with an INVALID_ARGUMENT error naming the
	// flag to add when not. nil: secrets are refused.
	CheckSecretSource func(from string) error
	// NewPlaceholder makes a secret's placeholder; nil: "agentbox-secret-" + 32 random hex.
	NewPlaceholder func() string
	// ProxyPort is the HTTP proxy's port inside the sandbox (0: 3128; -1: any free port, for
	// tests: the environment's HTTP_PROXY then names port 0).
	ProxyPort int
	// DNSPort is the resolver's port inside the sandbox (0: 53; -1: any free port, for tests).
	DNSPort int
	// TransparentPorts are the ports of the transparent path on runtimes that have it
	// (runtime.HardeningTransparentEgress); nil: 80 and 443.
	TransparentPorts []int
}

// Bounds of a sandbox's network.
const (
	MaxSecrets     = 32
	MaxSecretHosts = 16
	// MaxNetRecords is how many connection records (and, apart, secret-call records) are kept
	// per sandbox: the newest.
	MaxNetRecords = 10000
	// DefaultNetList and MaxNetList bound a page of records.
	DefaultNetList = 100
	MaxNetList     = 1000
	// MaxExposures bounds a sandbox's preview URLs.
	MaxExposures = 64
)

// sameNetwork reports whether a repeated create (idempotency key) asked for the same network
// and secrets as the sandbox the key made.
func sameNetwork(prior Sandbox, req CreateRequest) bool {
	var want *egress.Policy
	if req.Network != nil && req.Network.Policy != nil {
		p := NormalPolicy(*req.Network.Policy)
		want = &p
	}
	var got *egress.Policy
	if prior.Network.Policy != nil {
		p := NormalPolicy(*prior.Network.Policy)
		got = &p
	}
	if (want == nil) != (got == nil) || want != nil && !reflect.DeepEqual(*want, *got) {
		return false
	}
	if len(req.Secrets) != len(prior.Secrets) {
		return false
	}
	for _, sc := range prior.Secrets {
		spec, ok := req.Secrets[sc.Name]
		if !ok || spec.From != sc.From || spec.Body != sc.Body || len(spec.Hosts) != len(sc.Hosts) {
			return false
		}
	}
	return true
}

// egressProxy is the service's egress proxy and the recorder it reports to: the proxy is built
// with the service (NewService), before the network feature that records for it exists, so it
// records through this, which forwards to the recorder set (Core.SetEgressRecorder) and drops
// records until then.
type egressProxy struct {
	proxy EgressProxy
	rec   atomic.Pointer[egress.Recorder]
}

func (e *egressProxy) RecordConnection(c egress.Connection) {
	if r := e.rec.Load(); r != nil {
		(*r).RecordConnection(c)
	}
}

func (e *egressProxy) RecordSecretCall(c egress.SecretCall) {
	if r := e.rec.Load(); r != nil {
		(*r).RecordSecretCall(c)
	}
}
