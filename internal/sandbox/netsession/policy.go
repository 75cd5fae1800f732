package netsession

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxid"
	"github.com/agentbox/agentbox/internal/text"
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

func proxyPort(c sandbox.EgressConfig) int {
	switch c.ProxyPort {
	case 0:
		return 3128
	case -1:
		return 0
	}
	return c.ProxyPort
}

func dnsPort(c sandbox.EgressConfig) int {
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
func egressEnv(c sandbox.EgressConfig, secrets []egress.Secret) map[string]string {
	env := map[string]string{}
	proxy := "http://127.0.0.1:" + strconv.Itoa(proxyPort(c))
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
func (s *Service) validateNetwork(req *sandbox.CreateRequest, rt runtime.Runtime) (*netPlan, error) {
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
		return nil, errcode.Prefixed(fmt.Sprintf("network: runtime %s cannot give a sandbox a network policy: ", rt.Name()), err)
	}
	for k := range req.Env {
		if reservedEnvName(k) {
			return nil, errcode.New(errcode.InvalidArgument, "env: %s is set by agentbox in a sandbox with a network policy (the egress proxy and its CA bundle); remove it from env", k)
		}
	}
	if len(req.Secrets) > sandbox.MaxSecrets {
		return nil, errcode.New(errcode.InvalidArgument, "secrets has %d entries; at most %d are allowed", len(req.Secrets), sandbox.MaxSecrets)
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
		case !sandbox.ValidEnvName(name):
			return nil, errcode.New(errcode.InvalidArgument, "secrets: %q is not a valid variable name (letters, digits and _, not starting with a digit, at most %d)", text.Truncate(name, 64), sandbox.MaxKeyLen)
		case reservedEnvName(name):
			return nil, errcode.New(errcode.InvalidArgument, "%s: %s is set by agentbox in a sandbox with a network policy; name the secret otherwise", field, name)
		}
		if _, dup := req.Env[name]; dup {
			return nil, errcode.New(errcode.InvalidArgument, "%s: env also sets %s; a secret's variable holds its placeholder, so remove it from env", field, name)
		}
		if err := checkSecretFrom(spec.From); err != nil {
			return nil, errcode.Prefixed(field+".from: ", err)
		}
		if s.core.Config().Egress.CheckSecretSource == nil {
			return nil, errcode.New(errcode.InvalidArgument, "%s.from: this server allows no secret sources; start it with --secret-env VAR (for env:VAR) or --secret-dir DIR (for file:DIR/...)", field)
		}
		if err := s.core.Config().Egress.CheckSecretSource(spec.From); err != nil {
			return nil, errcode.Prefixed(field+".from: ", err)
		}
		if len(spec.Hosts) == 0 || len(spec.Hosts) > sandbox.MaxSecretHosts {
			return nil, errcode.New(errcode.InvalidArgument, "%s.hosts must name 1 to %d hosts the secret may be sent to; got %d", field, sandbox.MaxSecretHosts, len(spec.Hosts))
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
		if s.core.Config().Egress.NewPlaceholder != nil {
			ph = s.core.Config().Egress.NewPlaceholder
		}
		plan.secrets = append(plan.secrets, egress.Secret{Name: name, Placeholder: ph(), From: spec.From, Hosts: hosts, Body: spec.Body})
	}
	return plan, nil
}

// checkSecretFrom checks a secret's source's syntax: "env:VAR" or "file:/absolute/path".
func checkSecretFrom(from string) error {
	switch {
	case strings.HasPrefix(from, "env:"):
		if !sandbox.ValidEnvName(from[4:]) {
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

// UpdateNetwork replaces a sandbox's egress policy (allow and deny both); the next connection
// sees it. It is recorded (a version bump and a "network_updated" event) before it applies.
func (s *Service) UpdateNetwork(ctx context.Context, id string, p egress.Policy) (sandbox.Sandbox, error) {
	if err := sandboxid.Check(id); err != nil {
		return sandbox.Sandbox{}, err
	}
	compiled, err := egress.ParsePolicy(p)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	if err := s.core.WakeForCall(ctx, id); err != nil {
		return sandbox.Sandbox{}, err
	}
	unlock := s.core.Lock(id)
	defer unlock()
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	if sb.State != sandbox.StateRunning {
		return sb, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a running sandbox's network can be changed", id, sb.State).With("state", string(sb.State))
	}
	if sb.Network.Policy == nil {
		return sb, errcode.New(errcode.Conflict, "this sandbox was created with network none; create it with a network policy, e.g. network: {allow: []}, to change it later")
	}
	np := sandbox.NormalPolicy(compiled.Policy())
	now := s.core.Now()
	sb.Network = sandbox.Network{Policy: &np}
	sb.UpdatedAt = now
	sb.Version++
	ev := sandbox.Event{SandboxID: id, Type: "network_updated", From: sb.State, To: sb.State, At: now,
		Reason: text.Truncate(fmt.Sprintf("network policy: allow %s, deny %s", quoteList(np.Allow), quoteList(np.Deny)), 1024)}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := s.store.UpdateSandbox(wctx, sb, ev); err != nil {
		return sb, fmt.Errorf("update network of %s: %w", id, err)
	}
	s.core.Published()
	s.setNetPolicy(id, compiled)
	s.core.Log().Info("sandbox network updated", "sandbox_id", id, "allow", len(np.Allow), "deny", len(np.Deny))
	return sb, nil
}

func quoteList(l []string) string {
	b, _ := json.Marshal(l)
	return string(b)
}
