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
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
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
	return json.Marshal(normalPolicy(*n.Policy))
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
		p = normalPolicy(p)
		n.Policy = &p
		return nil
	}
	return errcode.New(errcode.InvalidArgument, "%s; got %s", want, text.Truncate(string(b), 64))
}

// normalPolicy returns p with non-nil arrays.
func normalPolicy(p egress.Policy) egress.Policy {
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

// EgressConfig configures sandboxes' networks. With NewProxy nil, creates with a network
// policy are refused (UNSUPPORTED_OPERATION).
type EgressConfig struct {
	// NewProxy builds the egress proxy the service hands every stream to; rec is the service,
	// which records what the proxy did (egress.Config.Recorder). Called once, by NewService.
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

// egressEnvNames are the variables agentbox sets in every egress sandbox: the proxy's and the
// CA bundle's. A create's env or secret may not name them.
var (
	proxyEnvNames = []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"}
	noProxyNames  = []string{"NO_PROXY", "no_proxy"}
	caEnvNames    = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"}
)

func reservedEnvName(k string) bool {
	return slices.Contains(proxyEnvNames, k) || slices.Contains(noProxyNames, k) || slices.Contains(caEnvNames, k)
}

func (c EgressConfig) proxyPort() int {
	switch c.ProxyPort {
	case 0:
		return 3128
	case -1:
		return 0
	}
	return c.ProxyPort
}

func (c EgressConfig) dnsPort() int {
	switch c.DNSPort {
	case 0:
		return 53
	case -1:
		return 0
	}
	return c.DNSPort
}

// egressEnv is the environment agentbox adds to an egress sandbox's: the proxy, the CA
// bundle and the secrets' placeholders.
func (c EgressConfig) egressEnv(secrets []egress.Secret) map[string]string {
	env := map[string]string{}
	proxy := "http://127.0.0.1:" + strconv.Itoa(c.proxyPort())
	for _, k := range proxyEnvNames {
		env[k] = proxy
	}
	for _, k := range noProxyNames {
		env[k] = "localhost,127.0.0.1,::1"
	}
	for _, k := range caEnvNames {
		env[k] = runtime.CABundlePath
	}
	for _, sc := range secrets {
		env[sc.Name] = sc.Placeholder
	}
	return env
}

// newPlaceholder returns "agentbox-secret-" and 32 random hex digits.
func newPlaceholder() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "agentbox-secret-" + hex.EncodeToString(b[:])
}

// netPlan is what a create's network and secrets become once validated.
type netPlan struct {
	policy  *egress.Compiled
	secrets []egress.Secret
}

// validateNetwork checks a create's network and secrets against the server's egress
// configuration and the runtime rt, before anything is created. nil plan: network none.
func (s *Service) validateNetwork(req *CreateRequest, rt runtime.Runtime) (*netPlan, error) {
	if req.Network == nil || req.Network.Policy == nil {
		if len(req.Secrets) > 0 {
			return nil, errcode.New(errcode.InvalidArgument, "secrets need network: {allow: [...]} (the hosts the secrets go to must be reachable); add a network policy to the create")
		}
		return nil, nil
	}
	if s.net.proxy == nil {
		return nil, errcode.New(errcode.UnsupportedOp, "network: this server has no egress proxy, so sandboxes can only have network \"none\"")
	}
	compiled, err := egress.ParsePolicy(*req.Network.Policy) // its errors name network.allow[i]
	if err != nil {
		return nil, err
	}
	if err := runtime.CheckNetwork(runtime.NetworkEgress, rt.Capabilities().NetworkModes); err != nil {
		return nil, prefixed(fmt.Sprintf("network: runtime %s cannot give a sandbox a network policy: ", rt.Name()), err)
	}
	for k := range req.Env {
		if reservedEnvName(k) {
			return nil, errcode.New(errcode.InvalidArgument, "env: %s is set by agentbox in a sandbox with a network policy (the egress proxy and its CA bundle); remove it from env", k)
		}
	}
	if len(req.Secrets) > MaxSecrets {
		return nil, errcode.New(errcode.InvalidArgument, "secrets has %d entries; at most %d are allowed", len(req.Secrets), MaxSecrets)
	}
	names := make([]string, 0, len(req.Secrets))
	for name := range req.Secrets {
		names = append(names, name)
	}
	sort.Strings(names)
	plan := &netPlan{policy: compiled}
	for _, name := range names {
		spec := req.Secrets[name]
		field := "secrets." + name
		switch {
		case !validEnvName(name):
			return nil, errcode.New(errcode.InvalidArgument, "secrets: %q is not a valid variable name (letters, digits and _, not starting with a digit, at most %d)", text.Truncate(name, 64), maxKeyLen)
		case reservedEnvName(name):
			return nil, errcode.New(errcode.InvalidArgument, "%s: %s is set by agentbox in a sandbox with a network policy; name the secret otherwise", field, name)
		}
		if _, dup := req.Env[name]; dup {
			return nil, errcode.New(errcode.InvalidArgument, "%s: env also sets %s; a secret's variable holds its placeholder, so remove it from env", field, name)
		}
		if err := checkSecretFrom(spec.From); err != nil {
			return nil, prefixed(field+".from: ", err)
		}
		if s.cfg.Egress.CheckSecretSource == nil {
			return nil, errcode.New(errcode.InvalidArgument, "%s.from: this server allows no secret sources; start it with --secret-env VAR (for env:VAR) or --secret-dir DIR (for file:DIR/...)", field)
		}
		if err := s.cfg.Egress.CheckSecretSource(spec.From); err != nil {
			return nil, prefixed(field+".from: ", err)
		}
		if len(spec.Hosts) == 0 || len(spec.Hosts) > MaxSecretHosts {
			return nil, errcode.New(errcode.InvalidArgument, "%s.hosts must name 1 to %d hosts the secret may be sent to; got %d", field, MaxSecretHosts, len(spec.Hosts))
		}
		hosts := make([]string, len(spec.Hosts))
		for i, h := range spec.Hosts {
			h = strings.ToLower(strings.TrimSuffix(h, "."))
			if !validSecretHost(h) {
				return nil, errcode.New(errcode.InvalidArgument, "%s.hosts[%d]: %q is not a host name (e.g. api.openai.com) or a wildcard (*.example.com); no ports, addresses or paths", field, i, text.Truncate(spec.Hosts[i], 64))
			}
			hosts[i] = h
		}
		ph := newPlaceholder
		if s.cfg.Egress.NewPlaceholder != nil {
			ph = s.cfg.Egress.NewPlaceholder
		}
		plan.secrets = append(plan.secrets, egress.Secret{Name: name, Placeholder: ph(), From: spec.From, Hosts: hosts, Body: spec.Body})
	}
	return plan, nil
}

// checkSecretFrom checks a secret's source's syntax: "env:VAR" or "file:/absolute/path".
func checkSecretFrom(from string) error {
	switch {
	case strings.HasPrefix(from, "env:"):
		if !validEnvName(from[4:]) {
			return errcode.New(errcode.InvalidArgument, "%q: env:VAR needs a variable name (letters, digits and _)", text.Truncate(from, 64))
		}
		return nil
	case strings.HasPrefix(from, "file:"):
		p := from[5:]
		if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) || len(p) > 4096 || slices.Contains(strings.Split(p, "/"), "..") {
			return errcode.New(errcode.InvalidArgument, "%q: file:PATH needs an absolute path without ..", text.Truncate(from, 64))
		}
		return nil
	}
	return errcode.New(errcode.InvalidArgument, "%q must be env:VAR (a variable of the server's environment) or file:/path (a file on the server)", text.Truncate(from, 64))
}

// validSecretHost reports whether h is a lower-case host name, optionally "*."-prefixed.
func validSecretHost(h string) bool {
	h = strings.TrimPrefix(h, "*.")
	if h == "" || len(h) > 253 {
		return false
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// prefixed returns err with its message prefixed (its code and details kept).
func prefixed(prefix string, err error) error {
	e, ok := errcode.As(err)
	if !ok {
		return err
	}
	out := *e
	out.Message = prefix + e.Message
	out.Cause = err
	return &out
}

// UpdateNetwork replaces a sandbox's egress policy (allow and deny both); the next connection
// sees it. It is recorded (a version bump and a "network_updated" event) before it applies.
func (s *Service) UpdateNetwork(ctx context.Context, id string, p egress.Policy) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	compiled, err := egress.ParsePolicy(p)
	if err != nil {
		return Sandbox{}, err
	}
	if err := s.wakeForCall(ctx, id); err != nil {
		return Sandbox{}, err
	}
	unlock := s.lock(id)
	defer unlock()
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.State != StateRunning {
		return sb, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a running sandbox's network can be changed", id, sb.State).With("state", string(sb.State))
	}
	if sb.Network.Policy == nil {
		return sb, errcode.New(errcode.Conflict, "this sandbox was created with network none; create it with a network policy, e.g. network: {allow: []}, to change it later")
	}
	np := normalPolicy(compiled.Policy())
	now := s.now().UTC().Truncate(time.Millisecond)
	sb.Network = Network{Policy: &np}
	sb.UpdatedAt = now
	sb.Version++
	ev := Event{SandboxID: id, Type: "network_updated", From: sb.State, To: sb.State, At: now,
		Reason: text.Truncate(fmt.Sprintf("network policy: allow %s, deny %s", quoteList(np.Allow), quoteList(np.Deny)), 1024)}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := s.store.UpdateSandbox(wctx, sb, ev); err != nil {
		return sb, fmt.Errorf("update network of %s: %w", id, err)
	}
	s.bus.publish()
	s.setNetPolicy(id, compiled)
	s.log.Info("sandbox network updated", "sandbox_id", id, "allow", len(np.Allow), "deny", len(np.Deny))
	return sb, nil
}

func quoteList(l []string) string {
	b, _ := json.Marshal(l)
	return string(b)
}

// sameNetwork reports whether a repeated create (idempotency key) asked for the same network
// and secrets as the sandbox the key made.
func sameNetwork(prior Sandbox, req CreateRequest) bool {
	var want *egress.Policy
	if req.Network != nil && req.Network.Policy != nil {
		p := normalPolicy(*req.Network.Policy)
		want = &p
	}
	var got *egress.Policy
	if prior.Network.Policy != nil {
		p := normalPolicy(*prior.Network.Policy)
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
