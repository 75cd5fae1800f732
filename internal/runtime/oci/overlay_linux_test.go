package oci

import (
	"os"
	"testing"
)

func TestProbeOverlay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if reason := ProbeOverlay(t.TempDir()); reason != "" {
		t.Fatalf("ProbeOverlay: %s", reason)
	}
	if reason := probeOverlay(t.TempDir(), true); reason != "" {
		t.Fatalf("probeOverlay with an id-mapped upper (gVisor): %s", reason)
	}
}
