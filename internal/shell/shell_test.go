package shell

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/agentbox/agentbox/internal/errcode"
)

// TestCLIXMLSamples decodes the recorded samples of PowerShell 5.1 and 7 (testdata/*.clixml)
// into the text beside them (*.txt), and returns every near-miss (verbatim_*) unchanged.
func TestCLIXMLSamples(t *testing.T) {
	samples, _ := filepath.Glob("testdata/*.clixml")
	if len(samples) < 3 {
		t.Fatalf("only %d samples", len(samples))
	}
	for _, in := range samples {
		raw, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(strings.TrimSuffix(in, ".clixml") + ".txt")
		if err != nil {
			t.Fatal(err)
		}
		got, ok := DecodeCLIXML(raw)
		if !ok || !bytes.Equal(got, want) {
			t.Errorf("%s: ok=%v\n got %q\nwant %q", in, ok, got, want)
		}
		if bytes.Contains(got, []byte("Preparing modules")) || bytes.Contains(got, []byte("_x000D_")) {
			t.Errorf("%s: progress or escapes left in %q", in, got)
		}
		// Two blocks back to back (a second #< CLIXML header) decode to both texts.
		if got2, ok := DecodeCLIXML(append(append(slices.Clip(raw), "\r\n"...), raw...)); !ok || !bytes.Equal(got2, append(slices.Clip(want), want...)) {
			t.Errorf("%s twice: ok=%v got %q", in, ok, got2)
		}
		// Any cut of the framing is not the framing: verbatim.
		for _, n := range []int{len(raw) / 3, len(raw) - 3} {
			if got, ok := DecodeCLIXML(raw[:n]); ok || !bytes.Equal(got, raw[:n]) {
				t.Errorf("%s cut at %d: ok=%v got %q", in, n, ok, got)
			}
		}
	}
	verbatim, _ := filepath.Glob("testdata/verbatim_*.txt")
	if len(verbatim) < 5 {
		t.Fatalf("only %d verbatim samples", len(verbatim))
	}
	for _, in := range verbatim {
		raw, _ := os.ReadFile(in)
		if got, ok := DecodeCLIXML(raw); ok || !bytes.Equal(got, raw) {
			t.Errorf("%s: ok=%v, got %q, want it verbatim", in, ok, got)
		}
	}
	for _, s := range []string{"", "#< CLIXML", "#< CLIXML\r\n", "#< CLIXMLx\r\n<Objs/>"} {
		if got, ok := DecodeCLIXML([]byte(s)); ok || string(got) != s {
			t.Errorf("%q: ok=%v got %q", s, ok, got)
		}
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"a_x000D__x000A_b":  "a\r\nb",
		"_x005F_x0041_":     "_x0041_",
		"_xD83D__xDE00_":    "😀",
		"_x00e9_t_x00E9_":   "été",
		"_x12G4_ _x12_ _x_": "_x12G4_ _x12_ _x_",
		"plain":             "plain",
	} {
		if got := unescapeCLIXML(in); got != want {
			t.Errorf("%q: got %q want %q", in, got, want)
		}
	}
}

func TestResolve(t *testing.T) {
	for _, c := range []struct{ goos, name, want string }{
		{"linux", "", "sh"}, {"linux", "bash", "bash"}, {"darwin", "sh", "sh"},
		{"windows", "", "powershell"}, {"windows", "cmd", "cmd"}, {"windows", "powershell", "powershell"},
	} {
		d, err := Resolve(c.goos, c.name)
		if err != nil || string(d) != c.want {
			t.Errorf("%s %q: %q %v", c.goos, c.name, d, err)
		}
	}
	for _, c := range []struct{ goos, name, names string }{
		{"linux", "cmd", "sh, bash"}, {"darwin", "powershell", "sh, bash"},
		{"windows", "bash", "powershell, cmd"}, {"linux", "zsh", "sh, bash"},
	} {
		_, err := Resolve(c.goos, c.name)
		if errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(errcode.Message(err), c.names) {
			t.Errorf("%s %q: %v, want INVALID_ARGUMENT naming %s", c.goos, c.name, err, c.names)
		}
	}
}

func TestCommand(t *testing.T) {
	script := `echo "a b" & echo ^& 'c' | findstr "%PATH%"`
	if s := Command(Sh, "echo hi"); !slices.Equal(s.Args, []string{"sh", "-c", "echo hi"}) || s.CmdLine != "" {
		t.Errorf("sh: %+v", s)
	}
	if s := Command(Bash, "echo hi"); !slices.Equal(s.Args, []string{"bash", "-c", "echo hi"}) {
		t.Errorf("bash: %+v", s)
	}
	// cmd receives the script exactly as written between the outer quotes /s strips.
	if s := Command(Cmd, script); s.CmdLine != `cmd.exe /d /s /c "`+script+`"` {
		t.Errorf("cmd: %q", s.CmdLine)
	}
	s := Command(PowerShell, "Write-Output 'é😀'; exit 3")
	if !slices.Equal(s.Args[:4], []string{"powershell.exe", "-NoProfile", "-NonInteractive", "-EncodedCommand"}) {
		t.Fatalf("powershell: %+v", s)
	}
	b, err := base64.StdEncoding.DecodeString(s.Args[4])
	if err != nil || len(b)%2 != 0 {
		t.Fatal(err, len(b))
	}
	u := make([]uint16, len(b)/2)
	for i := range u {
		u[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
	}
	if got := string(utf16.Decode(u)); got != "Write-Output 'é😀'; exit 3" {
		t.Errorf("decoded %q", got)
	}
}
