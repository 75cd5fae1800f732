//go:build unix

package guest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
)

// TestAgentCodesCoverServer keeps the codes the client accepts in step with the server: every
// code the agent's source uses is accepted from some endpoint, and nothing else is.
func TestAgentCodesCoverServer(t *testing.T) {
	client := map[string]bool{"client.go": true, "reply.go": true, "agenterr.go": true, "jobs_client.go": true, "pty_client.go": true, "stdin_client.go": true, "net_client.go": true}
	files, _ := filepath.Glob("*.go")
	used := map[errcode.Code]bool{}
	re := regexp.MustCompile(`errcode\.([A-Z][A-Za-z]+)`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || client[f] {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			for _, c := range errcode.Codes {
				if strings.EqualFold(strings.ReplaceAll(string(c), "_", ""), m[1]) || (m[1] == "UnsupportedOp" && c == errcode.UnsupportedOp) {
					used[c] = true
				}
			}
		}
	}
	if len(used) < 5 {
		t.Fatalf("found only %v in the server's source: the scan is broken", used)
	}
	accepted := map[errcode.Code]bool{}
	for _, set := range [][]errcode.Code{baseCodes, execCodes, fileCodes, jobCodes, jobStartCodes, netCodes} {
		for _, c := range set {
			accepted[c] = true
		}
	}
	for c := range used {
		if !accepted[c] {
			t.Errorf("the agent returns %s, which no endpoint's list accepts", c)
		}
	}
	for c := range accepted {
		if !used[c] {
			t.Errorf("%s is accepted from the agent, which never returns it", c)
		}
	}
	if slices.Contains(fileCodes, errcode.CapacityUnavailable) || slices.Contains(baseCodes, errcode.CapacityUnavailable) {
		t.Error("CAPACITY_UNAVAILABLE is only the exec endpoint's")
	}
}

// TestFrameDataBound: the client's bound of an output frame is the agent's chunk size.
func TestFrameDataBound(t *testing.T) {
	if chunkSize != MaxFrameData {
		t.Fatalf("the agent streams output in chunks of %d bytes; MaxFrameData is %d", chunkSize, MaxFrameData)
	}
}

// TestAgentErrorOrigin: an agent's error reaches callers cleaned and marked as the sandbox's.
func TestAgentErrorOrigin(t *testing.T) {
	legit := map[string]any{"path": "/x\n", "size": 12.0, "origin": "server", "long": strings.Repeat("x", 1000)}
	e := agent.Error(ErrorBody{Code: "FILE_NOT_FOUND", Message: "gone\x1b[2J\u202e", Details: legit}, "", fileCodes)
	if e.Code != errcode.FileNotFound || e.Message != "gone" || e.Details["origin"] != "sandbox_agent" || e.Details["path"] != "/x " ||
		e.Details["size"] != 12.0 || len(e.Details["long"].(string)) > peerreply.MaxDetailValue {
		t.Errorf("agent.Error = %+v", e)
	}
}
