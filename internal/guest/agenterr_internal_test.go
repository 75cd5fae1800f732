//go:build unix

package guest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
)

// TestAgentCodesCoverServer keeps the codes the client accepts in step with the server: every
// code the agent's source uses is accepted from some endpoint, and nothing else is.
func TestAgentCodesCoverServer(t *testing.T) {
	client := map[string]bool{"client.go": true, "reply.go": true, "agenterr.go": true, "jobs_client.go": true, "pty_client.go": true, "net_client.go": true}
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

func TestCleanText(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                   "plain",
		"a\nb\tc\rd":              "a b c d",
		"\x1b[31mred\x1b[0m":      "[31mred[0m",
		"bidi\u202eevil\u200b":    "bidievil",
		"bad\xffutf8":             "bad\uFFFDutf8",
		"\u0085next\u009bcsi":     "nextcsi",
		strings.Repeat("é", 1000): strings.Repeat("é", 510) + "…",
	} {
		got := cleanText(in, 1024)
		if got != want {
			t.Errorf("cleanText(%q) = %q, want %q", in, got, want)
		}
		if len(got) > 1024 || !utf8.ValidString(got) {
			t.Errorf("cleanText(%q) = %q: over 1024 bytes or invalid UTF-8", in, got)
		}
	}
}

func TestCleanDetails(t *testing.T) {
	in := map[string]any{"path": "/x\n", "size": 12.0, "origin": "server", "Bad-Key": 1.0, "nested": map[string]any{"a": 1},
		"long": strings.Repeat("x", 1000)}
	for i := range 20 {
		in["k"+string(rune('a'+i))] = true
	}
	out := cleanDetails(in)
	if len(out) != maxAgentDetails {
		t.Errorf("%d details kept, want %d: %v", len(out), maxAgentDetails, out)
	}
	for _, k := range []string{"origin", "Bad-Key", "nested"} {
		if _, ok := out[k]; ok {
			t.Errorf("detail %q kept", k)
		}
	}
	legit := map[string]any{"path": "/x\n", "size": 12.0, "origin": "server", "long": strings.Repeat("x", 1000)}
	e := agentError(ErrorBody{Code: "FILE_NOT_FOUND", Message: "gone", Details: legit}, fileCodes)
	if e.Code != errcode.FileNotFound || e.Details["origin"] != agentOrigin || e.Details["path"] != "/x " || e.Details["size"] != 12.0 ||
		len(e.Details["long"].(string)) > maxDetailValue {
		t.Errorf("agentError = %+v", e)
	}
}
