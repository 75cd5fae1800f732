package main

import (
	"context"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/egress/mitm"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Network: the server flags of sandboxes' egress and secrets, and the egress proxy
// and secret interceptor the control plane gets.

// registerEgressFlags adds serve's and mcp's network flags to fs.
func registerEgressFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.Var((*listFlag)(&cfg.EgressAllowCIDRs), "egress-allow-cidr", "open a never-reachable range (private, loopback…) such as 10.200.0.0/16 to sandboxes whose network policy allows it (repeatable; for labs and tests: logged loudly)")
	fs.BoolVar(&cfg.AllowPrivateNetwork, "allow-private-network", false, "allow private-network addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7, link-local) as upstream targets (--egress-allow-cidr) and, with --allow-remote, as the --listen address")
	fs.Var((*listFlag)(&cfg.SecretEnv), "secret-env", "an environment variable of the server that sandboxes' secrets may read (env:NAME), a name or a glob such as OPENAI_* (repeatable)")
	fs.Var((*listFlag)(&cfg.SecretDirs), "secret-dir", "a directory whose files sandboxes' secrets may read (file:/path) (repeatable)")
	fs.StringVar(&cfg.EgressDNS, "egress-dns", "", "FOR TESTS: the DNS server (ip:port) that resolves the names sandboxes reach (default: the host's resolver)")
	fs.StringVar(&cfg.EgressUpstreamCA, "egress-upstream-ca", "", "FOR TESTS: a PEM file of extra roots trusted for upstreams whose TLS the egress proxy terminates (secrets)")
}

// egressConfig builds the control plane's sandbox.EgressConfig from cfg: the per-server CA
// (<state>/egress), the sandboxes' CA bundle, the secret sources and the egress proxy with
// its secret interceptor.
func egressConfig(cfg config.Config, log *slog.Logger) (sandbox.EgressConfig, error) {
	var cidrs []netip.Prefix
	for _, c := range cfg.EgressAllowCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return sandbox.EgressConfig{}, fmt.Errorf("--egress-allow-cidr %q: %w", c, err)
		}
		cidrs = append(cidrs, p)
	}
	src := mitm.Sources{EnvAllow: cfg.SecretEnv, Dirs: cfg.SecretDirs}
	if err := src.Validate(); err != nil {
		return sandbox.EgressConfig{}, err
	}
	ca, err := mitm.LoadOrCreateCA(filepath.Join(cfg.StateDir, "egress"))
	if err != nil {
		return sandbox.EgressConfig{}, fmt.Errorf("egress CA: %w", err)
	}
	bundle, err := mitm.CABundle(ca, "")
	if err != nil {
		return sandbox.EgressConfig{}, err
	}
	var roots *x509.CertPool
	if cfg.EgressUpstreamCA != "" {
		pem, err := os.ReadFile(cfg.EgressUpstreamCA)
		if err != nil {
			return sandbox.EgressConfig{}, fmt.Errorf("--egress-upstream-ca: %w", err)
		}
		if roots, err = x509.SystemCertPool(); err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return sandbox.EgressConfig{}, fmt.Errorf("--egress-upstream-ca %s holds no PEM certificate", cfg.EgressUpstreamCA)
		}
		log.Warn("egress: extra upstream roots trusted (--egress-upstream-ca; for tests)", "file", cfg.EgressUpstreamCA)
	}
	var resolver egress.Resolver
	if cfg.EgressDNS != "" {
		server := cfg.EgressDNS
		resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		}}
		log.Warn("egress: names are resolved by --egress-dns (for tests)", "server", server)
	}
	for _, e := range cfg.SecretEnv {
		log.Info("egress: secrets may read environment variables", "secret_env", e)
	}
	for _, d := range cfg.SecretDirs {
		log.Info("egress: secrets may read files", "secret_dir", d)
	}
	return sandbox.EgressConfig{
		CABundle:          bundle,
		CheckSecretSource: src.Check,
		NewProxy: func(rec egress.Recorder) (sandbox.EgressProxy, error) {
			// egress.New logs a WARN naming each range --egress-allow-cidr opens.
			return egress.New(egress.Config{AllowCIDRs: cidrs, Resolver: resolver, Recorder: rec, Logger: log,
				Interceptor: mitm.New(mitm.Config{CA: ca, Sources: src, UpstreamRoots: roots, Recorder: rec, Logger: log})})
		},
	}, nil
}

// previewURLs makes preview URLs once the server's port is known (serve sets it after
// listening); before that, and without an HTTP server (mcp on stdio), there are none.
type previewURLs struct {
	port atomic.Int64
	tls  atomic.Bool // the server serves HTTPS: so do its preview URLs
}

// URL is sandbox.Config.PreviewURL.
func (p *previewURLs) URL(id string, port int) string {
	u := api.PreviewURL(id, port, int(p.port.Load()))
	if p.tls.Load() {
		u = "https://" + strings.TrimPrefix(u, "http://")
	}
	return u
}

// setAddr records the listener's port.
func (p *previewURLs) setAddr(addr net.Addr) {
	if _, ps, err := net.SplitHostPort(addr.String()); err == nil {
		n, _ := strconv.Atoi(ps)
		p.port.Store(int64(n))
	}
}
