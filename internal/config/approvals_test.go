package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/config"
)

// TestApprovalConfig: AGENTBOX_APPROVAL_REQUIRED=1 turns approvals on; the timeout and tool
// names are checked with what to change.
func TestApprovalConfig(t *testing.T) {
	t.Setenv("AGENTBOX_APPROVAL_REQUIRED", "1")
	c := config.Default()
	if !c.ApprovalRequired || c.ApprovalTimeout != 5*time.Minute || c.ApprovalElicit {
		t.Fatalf("defaults: required %v timeout %v elicit %v", c.ApprovalRequired, c.ApprovalTimeout, c.ApprovalElicit)
	}
	t.Setenv("AGENTBOX_APPROVAL_REQUIRED", "")
	if config.Default().ApprovalRequired {
		t.Fatal("approvals must be off by default")
	}
	for _, tc := range []struct {
		mut  func(*config.Config)
		want string
	}{
		{func(c *config.Config) { c.ApprovalTimeout = 0 }, "--approval-timeout 0s must be between 1s and 24h"},
		{func(c *config.Config) { c.ApprovalTimeout = 25 * time.Hour }, "--approval-timeout 25h0m0s must be between 1s and 24h"},
		{func(c *config.Config) { c.ApprovalTools = []string{"exec", "File Write"} }, `--approval-tools "File Write" must be MCP tool names`},
	} {
		c := config.Default()
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate: %v, want %q", err, tc.want)
		}
	}
	c = config.Default()
	c.ApprovalTools = []string{"exec", "file_write"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}
