package gpu

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// recorded is real nvidia-smi output of a two-GPU machine (driver 535, the query Args names).
const recorded = "0, NVIDIA GeForce RTX 3090, 24576, 1234, 7\n1, NVIDIA A100-SXM4-80GB, 81920, 0, 0\n"

func TestParseRecorded(t *testing.T) {
	gpus, err := Parse([]byte(recorded))
	if err != nil {
		t.Fatal(err)
	}
	want := []GPU{{0, "NVIDIA GeForce RTX 3090", 24576, 1234, 7}, {1, "NVIDIA A100-SXM4-80GB", 81920, 0, 0}}
	if len(gpus) != 2 || gpus[0] != want[0] || gpus[1] != want[1] {
		t.Fatalf("got %+v, want %+v", gpus, want)
	}
	if err := Check(gpus); err != nil {
		t.Fatal(err)
	}
	na, err := Parse([]byte("0, Tesla K80, 11441, [N/A], [Not Supported]\r\n"))
	if err != nil || na[0].MemoryUsedMB != -1 || na[0].UtilizationPct != -1 {
		t.Fatalf("N/A fields: %+v %v", na, err)
	}
	if g, err := Parse(nil); err != nil || len(g) != 0 {
		t.Fatalf("empty: %v %v", g, err)
	}
}

func TestParseRefusesMalformed(t *testing.T) {
	for _, in := range []string{
		"0, A, 1, 2\n",                   // 4 fields
		"0, A, 1, 2, 3, 4\n",             // 6 fields
		"x, A, 1, 2, 3\n",                // index
		"-1, A, 1, 2, 3\n",               // index
		"0, , 1, 2, 3\n",                 // empty name
		"0, A, 1.5, 2, 3\n",              // memory
		"0, A, 1, 2, 101\n",              // utilization
		"0, A, 1, 2, 3\n0, B, 1, 2, 3\n", // repeated index
		"0, " + strings.Repeat("n", MaxNameLen+1) + ", 1, 2, 3\n",
		"\xff, A, 1, 2, 3\n",
	} {
		if g, err := Parse([]byte(in)); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", in, g)
		}
	}
	var many strings.Builder
	for i := 0; i <= MaxGPUs; i++ {
		many.WriteString(strconv.Itoa(i) + ", G, 1, 1, 1\n")
	}
	if _, err := Parse([]byte(many.String())); err == nil {
		t.Error("more than MaxGPUs accepted")
	}
}

// TestQueryStandIn runs Query against a stand-in nvidia-smi on PATH that prints recorded
// output and checks it gets the exact arguments; without one on PATH there are no GPUs.
func TestQueryStandIn(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the stand-in is a shell script")
	}
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	if g, err := Query(t.Context()); err != nil || g != nil {
		t.Fatalf("no nvidia-smi: %v %v", g, err)
	}
	script := "#!/bin/sh\n[ \"$*\" = \"" + strings.Join(Args, " ") + "\" ] || { echo bad args: \"$*\" >&2; exit 2; }\nprintf '" + strings.ReplaceAll(recorded, "\n", "\\n") + "'\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	g, err := Query(t.Context())
	if err != nil || len(g) != 2 || g[1].Name != "NVIDIA A100-SXM4-80GB" {
		t.Fatalf("stand-in: %+v %v", g, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte("#!/bin/sh\necho NVIDIA-SMI has failed >&2\nexit 9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Query(t.Context()); err == nil || !strings.Contains(err.Error(), "NVIDIA-SMI has failed") {
		t.Fatalf("failing nvidia-smi: %v", err)
	}
}
