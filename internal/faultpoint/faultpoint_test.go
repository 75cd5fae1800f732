package faultpoint_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/faultpoint"
)

// TestHitIsANoOpByDefault: without the faultpoints tag, Hit never ends the process, whatever
// the environment says.
func TestHitIsANoOpByDefault(t *testing.T) {
	if faultpoint.Enabled {
		t.Skip("built with -tags faultpoints: TestHitKills covers it")
	}
	t.Setenv("AGENTBOX_FAULTPOINT", "here")
	faultpoint.Hit("here")
	faultpoint.Hit("here")
}

// TestHitKills runs this test binary again, built with the tag, as a child that hits a crash
// point: the child dies of SIGKILL at the Nth hit of the named point and not before.
func TestHitKills(t *testing.T) {
	if os.Getenv("FAULTPOINT_CHILD") == "1" {
		faultpoint.Hit("other")
		faultpoint.Hit("here")
		os.Stdout.WriteString("after-first\n")
		faultpoint.Hit("here")
		os.Stdout.WriteString("after-second\n")
		return
	}
	if testing.Short() {
		t.Skip("builds a test binary with -tags faultpoints")
	}
	bin := t.TempDir() + "/fp.test"
	if out, err := exec.Command("go", "test", "-c", "-tags", "faultpoints", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build with -tags faultpoints: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-test.run", "^TestHitKills$")
	cmd.Env = append(os.Environ(), "FAULTPOINT_CHILD=1", "AGENTBOX_FAULTPOINT=here:2")
	out, err := cmd.Output()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ProcessState.String() != "signal: killed" {
		t.Fatalf("child: %v, want killed; stdout %q", err, out)
	}
	if !strings.Contains(string(out), "after-first") || strings.Contains(string(out), "after-second") {
		t.Fatalf("child stdout %q: want it killed at the second hit of here, not before", out)
	}
}
