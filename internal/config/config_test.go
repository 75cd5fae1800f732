package config_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestJobSettings: the defaults are 7 days and 64; out-of-range values are refused with
// INVALID_ARGUMENT naming the setting and its range.
func TestJobSettings(t *testing.T) {
	c := config.Default()
	if c.JobRetention != 7*24*time.Hour || c.MaxJobsPerSandbox != sandbox.DefaultMaxJobs {
		t.Fatalf("defaults: retention %v, max jobs %d", c.JobRetention, c.MaxJobsPerSandbox)
	}
	c.StateDir = "/var/lib/agentbox-test"
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	for _, tc := range []struct {
		set  func(*config.Config)
		want string
	}{
		{func(c *config.Config) { c.MaxJobsPerSandbox = 0 }, "max jobs per sandbox 0 must be between 1 and 64"},
		{func(c *config.Config) { c.MaxJobsPerSandbox = 65 }, "max jobs per sandbox 65 must be between 1 and 64"},
		{func(c *config.Config) { c.JobRetention = 0 }, "job retention 0s must be at least 1m"},
		{func(c *config.Config) { c.JobRetention = -time.Hour }, "job retention -1h0m0s must be at least 1m"},
		{func(c *config.Config) { c.ReadyTimeout = time.Millisecond }, "--ready-timeout 1ms must be between 1s and 30m0s"},
		{func(c *config.Config) { c.ReadyTimeout = time.Hour }, "--ready-timeout 1h0m0s must be between 1s and 30m0s"},
	} {
		c := c
		tc.set(&c)
		err := c.Validate()
		if e, ok := errcode.As(err); !ok || e.Code != errcode.InvalidArgument || !strings.Contains(e.Message, tc.want) {
			t.Errorf("Validate = %v; want INVALID_ARGUMENT with %q", err, tc.want)
		}
	}
}

// TestRunSettings: the run settings' defaults and bounds.
func TestRunSettings(t *testing.T) {
	c := config.Default()
	c.StateDir = "/var/lib/agentbox-test"
	if c.RunRetention != 7*24*time.Hour || c.RunWorkers != 0 || c.ArtifactMB != 0 {
		t.Fatalf("defaults: retention %v, workers %d, artifact MiB %d", c.RunRetention, c.RunWorkers, c.ArtifactMB)
	}
	c.RunWorkers, c.ArtifactMB, c.CheckoutDirs = 4, 512, []string{"/srv/repos"}
	if err := c.Validate(); err != nil {
		t.Fatalf("valid settings refused: %v", err)
	}
	for _, tc := range []struct {
		set  func(*config.Config)
		want string
	}{
		{func(c *config.Config) { c.RunWorkers = -1 }, "--run-workers -1 must be between 1 and 1024"},
		{func(c *config.Config) { c.RunWorkers = 1025 }, "--run-workers 1025 must be between 1 and 1024"},
		{func(c *config.Config) { c.CheckoutDirs = []string{"repos"} }, `--checkout-dir "repos" must be an absolute path`},
		{func(c *config.Config) { c.ArtifactMB = -5 }, "--artifact-mb -5 must be between 1 and"},
		{func(c *config.Config) { c.RunRetention = time.Minute }, "--run-retention 1m0s must be at least 1h0m0s"},
	} {
		c := c
		tc.set(&c)
		err := c.Validate()
		if e, ok := errcode.As(err); !ok || e.Code != errcode.InvalidArgument || !strings.Contains(e.Message, tc.want) {
			t.Errorf("Validate = %v; want INVALID_ARGUMENT with %q", err, tc.want)
		}
	}
}

// TestPrivateNetworkNeedsFlag: an --egress-allow-cidr overlapping a private-network range is
// refused without --allow-private-network; loopback and public ranges are not
// private.
func TestPrivateNetworkNeedsFlag(t *testing.T) {
	for cidr, private := range map[string]bool{
		"10.203.1.0/24": true, "172.20.0.0/16": true, "192.168.1.5/32": true, "100.64.0.0/10": true,
		"169.254.169.254/32": true, "fd00::/8": true, "::ffff:10.0.0.1/128": true, "0.0.0.0/0": true,
		"127.0.0.1/32": false, "8.8.8.0/24": false, "2001:db8::/32": false,
	} {
		if got := config.PrivateNetwork(netip.MustParsePrefix(cidr)); got != private {
			t.Errorf("PrivateNetwork(%s) = %v", cidr, got)
		}
	}
	c := config.Default()
	c.StateDir = t.TempDir()
	c.EgressAllowCIDRs = []string{"10.203.1.0/24"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--allow-private-network") {
		t.Fatalf("private CIDR without the flag: %v", err)
	}
	c.AllowPrivateNetwork = true
	if err := c.Validate(); err != nil {
		t.Fatalf("private CIDR with the flag: %v", err)
	}
}
