//go:build linux

package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/runtime/kubernetes/kubetest"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestMCPKubernetes: the MCP loop (create, exec with progress, files, cancel, list, destroy)
// against `agentbox serve --runtime kubernetes` on the test cluster (AGENTBOX_TEST_KUBECONFIG;
// skipped when unset), in a namespace of its own.
func TestMCPKubernetes(t *testing.T) {
	kc := os.Getenv(kubetest.EnvKubeconfig)
	if kc == "" {
		t.Skip("AGENTBOX_TEST_KUBECONFIG is unset: no cluster for the kubernetes runtime (make test brings one up)")
	}
	testenv.RequireRoot(t)
	lab, err := kubetest.Open(kc, testenv.GuestBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lab.Close) // last: after the namespace's deletion
	ns, del, err := lab.Namespace(context.Background(), "ab-kuberuntime-mcp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := del(); err != nil {
			t.Errorf("delete namespace %s: %v", ns, err)
		}
	})
	url, logs := serve(t, testenv.ShortTempDir(t, "abmcpk"), "--runtime", "kubernetes", "--kube-config", kc, "--kube-namespace", ns,
		"--kube-guest-image", lab.GuestImage, "--kube-host-image", lab.HostImage)
	s := open(t, &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: authClient()}, "2025-11-25")
	if cp := s.loop(); !strings.HasPrefix(cp, "agentbox serve") {
		t.Fatalf("control plane %q\n%s", cp, logs)
	}
}
