//go:build linux

package agent_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/testenv"
)

// MachineSide are the packages that run on a joined machine: they must build for every
// platform a machine may be. Feature packages (remoteexec, screenshot, hostfiles,
// hostjobs) add themselves here.
var MachineSide = []string{
	"./internal/machine/agent",
	"./internal/machine/proto",
	"./internal/gpu",
	"./internal/jobmodel",
	"./internal/peerreply",
	"./internal/text",
}

// TestMachineSideCrossCompiles builds (and vets) the machine-side packages for darwin/arm64,
// darwin/amd64 and windows/amd64.
func TestMachineSideCrossCompiles(t *testing.T) {
	root := testenv.ModuleRoot(t)
	for _, target := range []string{"darwin/arm64", "darwin/amd64", "windows/amd64"} {
		t.Run(strings.ReplaceAll(target, "/", "_"), func(t *testing.T) {
			goos, goarch, _ := strings.Cut(target, "/")
			cmd := exec.Command("go", append([]string{"vet"}, MachineSide...)...)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("GOOS=%s GOARCH=%s go vet %s: %v\n%s", goos, goarch, strings.Join(MachineSide, " "), err, out)
			}
		})
	}
}
