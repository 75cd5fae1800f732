package mitm

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
)

func TestSources(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "secrets")
	outside := filepath.Join(root, "outside")
	os.Mkdir(dir, 0o700)
	os.Mkdir(outside, 0o700)
	write := func(p, v string) string {
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write(filepath.Join(dir, "token"), "file-value-1\n")
	write(filepath.Join(dir, "crlf"), "file-value-2\r\n")
	write(filepath.Join(dir, "two-lines"), "line1\nline2\n")
	write(filepath.Join(dir, "big"), strings.Repeat("a", MaxSecretFile+1))
	write(filepath.Join(dir, "long"), strings.Repeat("a", MaxSecretValue+1))
	write(filepath.Join(outside, "shadow"), "outside-value")
	os.Symlink(filepath.Join(outside, "shadow"), filepath.Join(dir, "escape"))
	os.Symlink(filepath.Join(dir, "token"), filepath.Join(dir, "alias"))
	os.Mkdir(filepath.Join(dir, "sub"), 0o700)
	// a dir given through a symlink still holds its files
	os.Symlink(dir, filepath.Join(root, "via-link"))

	env := map[string]string{"OPENAI_API_KEY": "env-value", "OPENAI_CRLF": "a\r\nb", "OPENAI_NUL": "a\x00b",
		"OPENAI_EMPTY": "", "HOME_SECRET": "home-value", "OPENAI_LONG": strings.Repeat("b", MaxSecretValue+1)}
	s := Sources{EnvAllow: []string{"OPENAI_*"}, Dirs: []string{filepath.Join(root, "via-link")},
		Getenv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}

	for from, want := range map[string]string{
		"env:OPENAI_API_KEY":                             "env-value",
		"file:" + filepath.Join(dir, "token"):            "file-value-1",
		"file:" + filepath.Join(dir, "crlf"):             "file-value-2",
		"file:" + filepath.Join(dir, "alias"):            "file-value-1",
		"file:" + filepath.Join(dir, "../secrets/token"): "file-value-1",
	} {
		got, err := s.Resolve(from)
		if err != nil || got != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", from, got, err, want)
		}
		if err := s.Check(from); err != nil {
			t.Errorf("Check(%q): %v", from, err)
		}
	}

	for from, wantMsg := range map[string]string{
		"env:HOME_SECRET":    "start the server with --secret-env HOME_SECRET",
		"env:OPENAI_MISSING": "not set",
		"env:1BAD":           "[A-Za-z_][A-Za-z0-9_]*",
		"env:OPENAI_CRLF":    "line break",
		"env:OPENAI_NUL":     "NUL",
		"env:OPENAI_EMPTY":   "empty",
		"env:OPENAI_LONG":    "more than 16384",
		"file:" + filepath.Join(outside, "shadow"):        "start the server with --secret-dir " + outside,
		"file:" + filepath.Join(dir, "escape"):            "resolves (through a symlink) outside",
		"file:" + filepath.Join(dir, "big"):               "at most 65536",
		"file:" + filepath.Join(dir, "long"):              "more than 16384",
		"file:" + filepath.Join(dir, "two-lines"):         "line break",
		"file:" + filepath.Join(dir, "sub"):               "not a regular file",
		"file:" + filepath.Join(dir, "nope"):              "no such file",
		"file:" + filepath.Join(dir, "../outside/shadow"): "--secret-dir",
		"file:relative/token":                             "absolute",
		"vault:kv/openai":                                 `must be "env:NAME"`,
		"OPENAI_API_KEY":                                  `must be "env:NAME"`,
	} {
		err := s.Check(from)
		if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(err.Error(), wantMsg) {
			t.Errorf("Check(%q) = %v; want INVALID_ARGUMENT with %q", from, err, wantMsg)
			continue
		}
		for _, v := range []string{"outside-value", "home-value", "a\r\nb", "line1", "env-value"} {
			if strings.Contains(err.Error(), v) {
				t.Errorf("Check(%q) error holds a value: %v", from, err)
			}
		}
	}
	// a server with no secret dirs names the flag
	if err := (Sources{}).Check("file:" + filepath.Join(dir, "token")); !strings.Contains(fmt.Sprint(err), "--secret-dir "+dir) {
		t.Errorf("no dirs: %v", err)
	}
	// rotation: the file is read at every Resolve
	write(filepath.Join(dir, "token"), "rotated\n")
	if v, _ := s.Resolve("file:" + filepath.Join(dir, "token")); v != "rotated" {
		t.Errorf("after rotation: %q", v)
	}
	for _, bad := range []Sources{{EnvAllow: []string{"OPENAI-*"}}, {EnvAllow: []string{"[A"}}, {Dirs: []string{"rel"}},
		{Dirs: []string{filepath.Join(root, "none")}}} {
		if err := bad.Validate(); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("Validate(%+v) = %v", bad, err)
		}
	}
}

func TestValidateSpecsAndPrepare(t *testing.T) {
	ok := func() []egress.Secret {
		return []egress.Secret{{Name: "OPENAI_API_KEY", From: "env:OPENAI_API_KEY", Hosts: []string{"API.OpenAI.com.", "*.example.com", "192.0.2.1"}},
			{Name: "_b", From: "env:OPENAI_B", Hosts: []string{"b.example"}}}
	}
	if err := ValidateSpecs(ok()); err != nil {
		t.Fatal(err)
	}
	many := make([]egress.Secret, MaxSecrets+1)
	for i := range many {
		many[i] = egress.Secret{Name: fmt.Sprintf("S%d", i), From: "env:X", Hosts: []string{"a.com"}}
	}
	hosts17 := make([]string, MaxSecretHosts+1)
	for i := range hosts17 {
		hosts17[i] = fmt.Sprintf("h%d.com", i)
	}
	cases := map[string][]egress.Secret{
		"at most 32":           many,
		"[A-Za-z_]":            {{Name: "1X", Hosts: []string{"a.com"}}},
		"1-128":                {{Name: strings.Repeat("A", 129), Hosts: []string{"a.com"}}},
		"proxy or CA variable": {{Name: "https_proxy", Hosts: []string{"a.com"}}},
		"given twice":          {{Name: "A", Hosts: []string{"a.com"}}, {Name: "A", Hosts: []string{"b.com"}}},
		"1-16 needed":          {{Name: "A", Hosts: hosts17}},
		"secrets.A.hosts: 0":   {{Name: "A"}},
		"secrets.A.hosts[1]":   {{Name: "A", Hosts: []string{"a.com", "a.com:443"}}},
		"no port, no scheme":   {{Name: "A", Hosts: []string{"https://a.com"}}},
		`hosts[0] "*"`:         {{Name: "A", Hosts: []string{"*"}}},
		`hosts[0] "a.*.com"`:   {{Name: "A", Hosts: []string{"a.*.com"}}},
	}
	for want, in := range cases {
		if err := ValidateSpecs(in); !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}

	s := Sources{EnvAllow: []string{"OPENAI_*"}, Getenv: func(k string) (string, bool) { return "v", true }}
	in := ok()
	out, err := s.Prepare(in)
	if err != nil {
		t.Fatal(err)
	}
	if in[0].Hosts[0] != "API.OpenAI.com." || in[0].Placeholder != "" {
		t.Fatal("Prepare changed its input")
	}
	re := regexp.MustCompile(`^agentbox-secret-[0-9a-f]{32}$`)
	if out[0].Name != "OPENAI_API_KEY" || out[0].Hosts[0] != "api.openai.com" || !re.MatchString(out[0].Placeholder) ||
		!re.MatchString(out[1].Placeholder) || out[0].Placeholder == out[1].Placeholder {
		t.Fatalf("Prepare = %+v", out)
	}
	if _, err := s.Prepare([]egress.Secret{{Name: "A", From: "env:HOME", Hosts: []string{"a.com"}}}); !strings.Contains(fmt.Sprint(err), "secrets.A.from") ||
		!strings.Contains(fmt.Sprint(err), "--secret-env HOME") {
		t.Fatalf("Prepare with a refused source: %v", err)
	}
	if NewPlaceholder() == NewPlaceholder() {
		t.Fatal("placeholders repeat")
	}
}

func TestHostListed(t *testing.T) {
	hosts := []string{"api.example.com", "*.svc.example"}
	for h, want := range map[string]bool{"api.example.com": true, "API.EXAMPLE.COM.": true, "example.com": false,
		"a.svc.example": true, "a.b.svc.example": true, "svc.example": false, "xsvc.example": false} {
		if HostListed(hosts, h) != want {
			t.Errorf("HostListed(%q) = %v", h, !want)
		}
	}
}
