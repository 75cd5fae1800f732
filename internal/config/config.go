// Package config holds agentbox's versioned configuration: documented zero values, defaults from
// the host and the environment, and Validate. Only cmd/ and this package read the environment.
package config

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/lease"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Version is the configuration schema version.
const Version = 1

// DefaultListen is the server's default address: loopback only.
const DefaultListen = "127.0.0.1:8765"

// DefaultOvercommit lets a 2-core, 4 GiB laptop hold the default live bound (200) of default
// sandboxes (1 core, 512 MiB, 1 GiB of sparse disk each) when its real memory and disk allow.
const DefaultOvercommit = 128

// Config is the server's configuration.
type Config struct {
	Version int
	// StateDir holds the database, runtime state and sandbox directories.
	// Default /var/lib/agentbox as root, $XDG_STATE_HOME/agentbox otherwise.
	StateDir string
	// Store selects the durable store (--store): "" for SQLite's agentbox.db in StateDir,
	// sqlite://PATH, or a postgres:// DSN (ParseStore). It may hold a password: never log it.
	Store string
	// Listen is the REST/MCP address. Non-loopback needs AllowRemote.
	Listen      string
	AllowRemote bool
	// TokenFile holds the bearer token (created on first run, mode 0600).
	TokenFile string
	// Token, when set (AGENTBOX_TOKEN), is used instead of TokenFile's content.
	Token string
	// DefaultRuntime is used when a create names none; "" is the first usable of
	// PreferredRuntimes (crun, else runc), chosen once the runtimes are probed.
	DefaultRuntime string
	DefaultTTL     time.Duration // 30m
	MaxTTL         time.Duration // 24h
	MaxSandboxes   int           // 200
	MaxPooled      int           // bound on the sum of warm pools' sizes (0: MaxSandboxes/2)
	// Overcommit is how far the sums of live sandboxes' limits may exceed what the host has
	// (DefaultOvercommit). Limits are ceilings, not reservations: an idle sandbox uses a few MiB
	// whatever its memory_mb, so admission refuses what would really run out (the live bound,
	// the host's available memory and free disk, less reserves) and bounds the sums only
	// loosely. 1 makes every limit a hard reservation.
	Overcommit float64
	// CPUBudget and MemoryBudgetMB bound the sum over live sandboxes. 0 = derived from the
	// host: Overcommit × cores and Overcommit × the host's memory.
	CPUBudget      float64
	MemoryBudgetMB int64
	// DiskBudgetMB bounds the sum of live sandboxes' disk_mb. 0 = derived from the host:
	// Overcommit × (what the state dir's file system has free at start plus what adopted
	// sandboxes' disks hold, less a tenth of its size, at most 4 GiB, kept for the host).
	DiskBudgetMB int64
	// SnapshotBudgetMB bounds what ready user snapshots hold on disk together; the
	// oldest are retired to make room. 0 = snapshots.DefaultSnapshotBudgetBytes (10 GiB).
	SnapshotBudgetMB int64
	// CgroupParent names the cgroup under which sandboxes get one each; "" (the default):
	// derived from the state dir ("agentbox-" and 8 hex digits of its path), or the legacy
	// shared "agentbox" while the store has sandboxes there. Two servers on one host never
	// share one: the second refuses to start (a host lock, internal/hostlock).
	CgroupParent string
	// GuestBinary is the agent binary bound into sandboxes (default: agentbox-guest beside this
	// executable, else this executable).
	GuestBinary string
	// UIDPoolBase is the first host uid (and gid) of the pool each sandbox's range of 65536 ids
	// comes from (0 = sandbox.DefaultIDPoolBase, 200000). Ranges never include ids below 65536, the host's users and
	// groups, or what /etc/subuid and /etc/subgid delegate.
	UIDPoolBase int64
	// MaxFileBytes bounds one file upload or download through the REST API; 0 = the API's
	// default (1 GiB). JSON bodies have a fixed bound (api.MaxJSONBody).
	MaxFileBytes int64
	// JobRetention is how long finished jobs' records are kept (DefaultJobRetention, 7 days).
	JobRetention time.Duration
	// MaxJobsPerSandbox bounds the running jobs of one sandbox (sandbox.DefaultMaxJobs, 64,
	// which is also the agent's own bound).
	MaxJobsPerSandbox int
	// Network. EgressAllowCIDRs open never-reachable ranges (private, loopback…)
	// to sandboxes whose policy allows them, for labs and tests (--egress-allow-cidr).
	EgressAllowCIDRs []string
	// AllowPrivateNetwork (--allow-private-network) lets a private-network range
	// (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7, link-local) be an upstream target
	// (EgressAllowCIDRs) or, with AllowRemote, the listen address.
	AllowPrivateNetwork bool
	// SecretEnv are the server's environment variables (names or globs such as OPENAI_*) a
	// sandbox's secret may read (--secret-env); SecretDirs the directories whose files it may
	// read (--secret-dir). Anything else is refused.
	SecretEnv  []string
	SecretDirs []string
	// EgressDNS is the DNS server (host:port) that resolves the names sandboxes reach; ""
	// the host's resolver. For tests (--egress-dns).
	EgressDNS string
	// EgressUpstreamCA is a PEM file of extra roots trusted for upstreams whose TLS the
	// egress proxy terminates (secrets); for tests (--egress-upstream-ca).
	EgressUpstreamCA string
	// Images. ImageCacheMB bounds the image cache (<state>/images); 0: 10% of the
	// state dir's file system, at most 20 GiB (--image-cache-mb). RegistryAuth are
	// host=user:password credentials (--registry-auth), RegistryAuthFile a file of them, one a
	// line (--registry-auth-file); InsecureRegistries are hosts reached over plain HTTP
	// (--insecure-registry).
	ImageCacheMB       int64
	RegistryAuth       []string
	RegistryAuthFile   string
	InsecureRegistries []string
	// Durable runs. RunWorkers bounds the runs this server executes at once (0:
	// runs.DefaultWorkers; --run-workers); CheckoutDirs are the host directories a file://
	// repo_url may name (--checkout-dir; none: file:// is refused); ArtifactMB bounds the run
	// blob store of logs and artifacts (0: runs.DefaultArtifactBudgetBytes; --artifact-mb);
	// RunRetention is how long settled runs, their logs and artifacts are kept
	// (--run-retention).
	RunWorkers   int
	CheckoutDirs []string
	ArtifactMB   int64
	RunRetention time.Duration
	// The audit log: how long records are kept (--audit-retention) and how many at
	// most (--audit-max-rows); pruned hourly.
	AuditRetention time.Duration
	AuditMaxRows   int
	// Approvals. ApprovalRequired (--approval-required, AGENTBOX_APPROVAL_REQUIRED=1)
	// makes every call that acts wait for an operator's decision; ApprovalTools
	// (--approval-tools exec,file_write,…) gates only these tools (and their REST routes);
	// ApprovalTimeout is how long a call waits (--approval-timeout, default 5m);
	// ApprovalElicit lets the MCP client itself decide through elicitation (--approval-elicit).
	ApprovalRequired bool
	ApprovalTools    []string
	ApprovalTimeout  time.Duration
	ApprovalElicit   bool
	// Several replicas: LeaseTTL is how long the node's lifecycle lease lasts
	// unless renewed (renewed every third of it; --lease-ttl): a dead holder's lifecycle work is
	// taken over by another replica within it.
	LeaseTTL time.Duration
	// ReadyTimeout bounds a create's wait for the new sandbox's agent to answer (--ready-timeout;
	// 0: 15 s, or 3 min with the kubernetes runtime, whose kubelet pulls the image meanwhile).
	ReadyTimeout time.Duration
	// Kubernetes: with --runtime kubernetes (or kubernetes-gvisor) the server runs
	// every sandbox as a pod in KubeNamespace of the cluster KubeConfig names (--kube-config;
	// "": the in-cluster config), under RuntimeClass KubeRuntimeClassProcess
	// (--kube-runtime-class-process, runtime kubernetes) or KubeRuntimeClassKernel
	// (--kube-runtime-class-kernel, runtime kubernetes-gvisor; "" for either: not offered).
	// KubeGuestImage is the guest image its pods take the agent from (--kube-guest-image;
	// default the one `agentbox kube-guest-image` builds from this binary); KubeHostImage what
	// image "host" runs there (--kube-host-image; "": image "host" is not offered);
	// KubeNodeName pins pods to a node (--kube-node-name).
	KubeConfig              string
	KubeContext             string
	KubeNamespace           string
	KubeRuntimeClassProcess string
	KubeRuntimeClassKernel  string
	KubeGuestImage          string
	KubeHostImage           string
	KubeNodeName            string
	// The vm runtime (microVMs on QEMU): VMKernel is the guest kernel (--vm-kernel; "": the one
	// make deps unpacks), VMAccel the accelerator (--vm-accel auto|kvm|tcg; "": auto, KVM only
	// when a probe boot proves /dev/kvm works).
	VMKernel string
	VMAccel  string
	// KubeGuestDelivery is how the agent gets into pods (--kube-guest-delivery): image-volume
	// (default) or init-container.
	KubeGuestDelivery string
}

// Bounds of --lease-ttl.
const (
	MinLeaseTTL = 3 * time.Second
	MaxLeaseTTL = 10 * time.Minute
)

// Bounds and defaults of --ready-timeout.
const (
	MinReadyTimeout     = time.Second
	MaxReadyTimeout     = 30 * time.Minute
	DefaultReadyTimeout = sandbox.DefaultReadyTimeout
	KubeReadyTimeout    = 3 * time.Minute
)

// PreferredRuntimes is the order in which a server without --runtime picks its default among
// the local runtimes, the first usable one: crun starts a sandbox fastest (its create → first
// exec is at `runc run`'s floor, runc's about a third above it; docs/PERFORMANCE.md) with the
// same isolation, and can give a sandbox egress where runc cannot (RUNTIMES.md); runc is next.
var PreferredRuntimes = []string{"crun", "runc"}

// KubeRuntime reports whether runtime name is one of the kubernetes runtimes.
func KubeRuntime(name string) bool { return name == "kubernetes" || name == "kubernetes-gvisor" }

// Bounds of the audit log's settings.
const (
	MinAuditRetention = time.Hour
	MinAuditMaxRows   = 1000
	MaxAuditMaxRows   = 100_000_000
)

// Bounds of the run settings.
const (
	MaxRunWorkers   = 1024
	MinRunRetention = time.Hour
)

// DefaultJobRetention is how long finished jobs' records are kept by default.
const DefaultJobRetention = 7 * 24 * time.Hour

// Default returns the configuration with every default filled from the environment and host.
func Default() Config {
	c := Config{Version: Version, Listen: DefaultListen,
		DefaultTTL: sandbox.DefaultTTL, MaxTTL: sandbox.DefaultMaxTTL, MaxSandboxes: sandbox.DefaultMaxSandboxes,
		Overcommit: DefaultOvercommit, JobRetention: DefaultJobRetention, MaxJobsPerSandbox: sandbox.DefaultMaxJobs,
		RunRetention:   runs.DefaultRetention,
		AuditRetention: audit.DefaultRetention, AuditMaxRows: audit.DefaultMaxRows,
		LeaseTTL:      lease.DefaultTTL,
		KubeNamespace: "default", KubeRuntimeClassProcess: "runc", KubeRuntimeClassKernel: "gvisor"}
	c.ApprovalRequired, c.ApprovalTimeout = os.Getenv("AGENTBOX_APPROVAL_REQUIRED") == "1", 5*time.Minute // approvals
	c.StateDir = DefaultStateDir()
	c.TokenFile = DefaultTokenFile()
	c.Token = os.Getenv("AGENTBOX_TOKEN")
	if f := os.Getenv("AGENTBOX_TOKEN_FILE"); f != "" {
		c.TokenFile = f
	}
	return c
}

// DefaultStateDir is /var/lib/agentbox as root, $XDG_STATE_HOME/agentbox (or
// ~/.local/state/agentbox) otherwise.
func DefaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/agentbox"
	}
	if x := os.Getenv("XDG_STATE_HOME"); x != "" {
		return filepath.Join(x, "agentbox")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "agentbox")
}

// DefaultTokenFile is $XDG_CONFIG_HOME/agentbox/token or ~/.config/agentbox/token.
func DefaultTokenFile() string {
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "agentbox", "token")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".config", "agentbox", "token")
}

// Validate checks the configuration and says what to change.
func (c *Config) Validate() error {
	var errs []string
	if c.Version != Version {
		errs = append(errs, fmt.Sprintf("config version %d is not supported (want %d)", c.Version, Version))
	}
	if !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Sprintf("state dir %q must be an absolute path", c.StateDir))
	}
	if _, err := ParseStore(c.Store, c.StateDir); err != nil {
		errs = append(errs, err.Error())
	}
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		errs = append(errs, fmt.Sprintf("listen address %q must be host:port: %v", c.Listen, err))
	} else if !c.AllowRemote && !IsLoopback(host) {
		errs = append(errs, fmt.Sprintf("listen address %q is not loopback; agentbox serves only 127.0.0.1/::1 unless --allow-remote is given", c.Listen))
	}
	if c.MaxSandboxes < 1 {
		errs = append(errs, "max sandboxes must be at least 1")
	}
	if c.MaxPooled < 0 || c.MaxPooled > c.MaxSandboxes {
		errs = append(errs, fmt.Sprintf("max pooled must be between 0 (half of max sandboxes) and max sandboxes (%d); got %d", c.MaxSandboxes, c.MaxPooled))
	}
	if c.Overcommit < 1 {
		errs = append(errs, fmt.Sprintf("overcommit must be at least 1 (1 = limits are hard reservations); got %g", c.Overcommit))
	}
	if c.DefaultTTL <= 0 || c.MaxTTL < c.DefaultTTL {
		errs = append(errs, "default TTL must be positive and not above the max TTL")
	}
	if c.CPUBudget < 0 || c.MemoryBudgetMB < 0 || c.DiskBudgetMB < 0 || c.SnapshotBudgetMB < 0 {
		errs = append(errs, "budgets must not be negative")
	}
	if c.UIDPoolBase != 0 && (c.UIDPoolBase < 65536 || c.UIDPoolBase > 1<<32-1<<16) {
		errs = append(errs, fmt.Sprintf("uid pool base %d must be between 65536 and %d (0 = the default, %d)", c.UIDPoolBase, int64(1<<32-1<<16), sandbox.DefaultIDPoolBase))
	}
	if c.JobRetention < time.Minute {
		errs = append(errs, fmt.Sprintf("job retention %v must be at least 1m (how long finished job records are kept; default %v)", c.JobRetention, DefaultJobRetention))
	}
	if c.AuditRetention < MinAuditRetention {
		errs = append(errs, fmt.Sprintf("--audit-retention %v must be at least %v (default %v)", c.AuditRetention, MinAuditRetention, audit.DefaultRetention))
	}
	if c.AuditMaxRows < MinAuditMaxRows || c.AuditMaxRows > MaxAuditMaxRows {
		errs = append(errs, fmt.Sprintf("--audit-max-rows %d must be between %d and %d (default %d)", c.AuditMaxRows, MinAuditMaxRows, MaxAuditMaxRows, audit.DefaultMaxRows))
	}
	if c.MaxJobsPerSandbox < 1 || c.MaxJobsPerSandbox > sandbox.DefaultMaxJobs {
		errs = append(errs, fmt.Sprintf("max jobs per sandbox %d must be between 1 and %d (the agent's own bound)", c.MaxJobsPerSandbox, sandbox.DefaultMaxJobs))
	}
	for _, cidr := range c.EgressAllowCIDRs {
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			errs = append(errs, fmt.Sprintf("--egress-allow-cidr %q must be a CIDR such as 10.200.0.0/16", cidr))
		} else if PrivateNetwork(p) && !c.AllowPrivateNetwork {
			errs = append(errs, fmt.Sprintf("--egress-allow-cidr %q opens a private-network range to sandboxes: add --allow-private-network", cidr))
		}
	}
	for _, d := range c.SecretDirs {
		if !filepath.IsAbs(d) {
			errs = append(errs, fmt.Sprintf("--secret-dir %q must be an absolute path", d))
		}
	}
	if c.EgressDNS != "" {
		if _, err := netip.ParseAddrPort(c.EgressDNS); err != nil {
			errs = append(errs, fmt.Sprintf("--egress-dns %q must be ip:port, such as 10.200.0.53:53", c.EgressDNS))
		}
	}
	if c.EgressUpstreamCA != "" && !filepath.IsAbs(c.EgressUpstreamCA) {
		errs = append(errs, fmt.Sprintf("--egress-upstream-ca %q must be an absolute path", c.EgressUpstreamCA))
	}
	// durable runs
	if c.RunWorkers < 0 || c.RunWorkers > MaxRunWorkers {
		errs = append(errs, fmt.Sprintf("--run-workers %d must be between 1 and %d (0 = the default, %d)", c.RunWorkers, MaxRunWorkers, runs.DefaultWorkers))
	}
	for _, d := range c.CheckoutDirs {
		if !filepath.IsAbs(d) {
			errs = append(errs, fmt.Sprintf("--checkout-dir %q must be an absolute path", d))
		}
	}
	if c.ArtifactMB < 0 || c.ArtifactMB > 1<<30 {
		errs = append(errs, fmt.Sprintf("--artifact-mb %d must be between 1 and %d (0 = the default, %d)", c.ArtifactMB, int64(1<<30), int64(runs.DefaultArtifactBudgetBytes>>20)))
	}
	if c.RunRetention < MinRunRetention {
		errs = append(errs, fmt.Sprintf("--run-retention %v must be at least %v (how long settled runs, their logs and artifacts are kept; default %v)", c.RunRetention, MinRunRetention, runs.DefaultRetention))
	}
	// several replicas
	if c.LeaseTTL < MinLeaseTTL || c.LeaseTTL > MaxLeaseTTL {
		errs = append(errs, fmt.Sprintf("--lease-ttl %v must be between %v and %v (default %v)", c.LeaseTTL, MinLeaseTTL, MaxLeaseTTL, lease.DefaultTTL))
	}
	if c.ReadyTimeout != 0 && (c.ReadyTimeout < MinReadyTimeout || c.ReadyTimeout > MaxReadyTimeout) {
		errs = append(errs, fmt.Sprintf("--ready-timeout %v must be between %v and %v (0 = the default: %v, %v with the kubernetes runtime)", c.ReadyTimeout, MinReadyTimeout, MaxReadyTimeout, DefaultReadyTimeout, KubeReadyTimeout))
	}
	// approvals
	if c.ApprovalTimeout < time.Second || c.ApprovalTimeout > 24*time.Hour {
		errs = append(errs, fmt.Sprintf("--approval-timeout %v must be between 1s and 24h (default 5m)", c.ApprovalTimeout))
	}
	for _, t := range c.ApprovalTools {
		if t == "" || strings.Trim(t, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
			errs = append(errs, fmt.Sprintf("--approval-tools %q must be MCP tool names such as exec,file_write (lowercase, comma-separated)", t))
		}
	}
	if len(errs) > 0 {
		return errcode.New(errcode.InvalidArgument, "invalid configuration: %s", strings.Join(errs, "; "))
	}
	return nil
}

// IsLoopback reports whether host (a name or an IP) is a loopback address.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// LoadOrCreateToken returns the token from c.Token, or the token file, creating the file with a
// fresh random token (mode 0600) if it does not exist.
func LoadOrCreateToken(c Config) (string, error) {
	if c.Token != "" {
		return c.Token, nil
	}
	b, err := os.ReadFile(c.TokenFile)
	if err == nil {
		tok := strings.TrimSpace(string(b))
		if len(tok) < 16 {
			return "", fmt.Errorf("token file %s holds a token shorter than 16 characters; delete it to get a new one", c.TokenFile)
		}
		return tok, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read token file: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(raw[:])
	if err := os.MkdirAll(filepath.Dir(c.TokenFile), 0o700); err != nil {
		return "", fmt.Errorf("create token dir: %w", err)
	}
	f, err := os.OpenFile(c.TokenFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) { // another process won the race
			return LoadOrCreateToken(c)
		}
		return "", fmt.Errorf("create token file: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(tok + "\n"); err != nil {
		return "", fmt.Errorf("write token file: %w", err)
	}
	return tok, nil
}

// ReadToken finds a client's token: AGENTBOX_TOKEN, AGENTBOX_TOKEN_FILE, then the default file.
func ReadToken() (string, error) {
	if t := os.Getenv("AGENTBOX_TOKEN"); t != "" {
		return t, nil
	}
	path := DefaultTokenFile()
	if f := os.Getenv("AGENTBOX_TOKEN_FILE"); f != "" {
		path = f
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("no token: set AGENTBOX_TOKEN, or run as the user that runs `agentbox serve` (it keeps the token in %s): %w", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// privateRanges are the private-network ranges (serve's --allow-private-network).
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fc00::/7"), netip.MustParsePrefix("fe80::/10"),
}

// PrivateNetwork reports whether p overlaps a private-network range.
func PrivateNetwork(p netip.Prefix) bool {
	if p.Addr().Is4In6() {
		p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
	}
	for _, r := range privateRanges {
		if r.Overlaps(p) {
			return true
		}
	}
	return false
}
