package mitm

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds of secrets.
const (
	MaxSecrets       = 32       // per sandbox
	MaxSecretHosts   = 16       // per secret
	MaxSecretName    = 128      // characters of a secret's (environment variable's) name
	MaxSecretFile    = 64 << 10 // bytes of a file: source
	MaxSecretValue   = 16 << 10 // bytes of a resolved value
	maxFromInMessage = 256
	// PlaceholderPrefix starts every placeholder.
	PlaceholderPrefix = "agentbox-secret-"
)

// Sources says where secrets may come from: the server's own environment variables named
// by EnvAllow and files under Dirs. Anything else is refused, so that a sandbox's creator (a
// prompt-injected agent, say) cannot make the server send its other variables or files.
type Sources struct {
	// EnvAllow are names or globs (path.Match syntax, e.g. OPENAI_*) of the variables a
	// secret may name (--secret-env).
	EnvAllow []string
	// Dirs are directories whose files a secret may name (--secret-dir).
	Dirs []string
	// Getenv reads a variable (nil: os.LookupEnv).
	Getenv func(string) (string, bool)
}

// Validate checks the server's configuration: each EnvAllow entry a name or a glob of one,
// each Dir an absolute path of an existing directory.
func (s Sources) Validate() error {
	for i, p := range s.EnvAllow {
		if p == "" || len(p) > MaxSecretName || strings.Trim(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_*?") != "" {
			return errcode.New(errcode.InvalidArgument,
				"--secret-env %q (entry %d) must be an environment variable name or a glob of one (letters, digits, _, * and ?), 1-%d characters",
				trunc(p), i, MaxSecretName)
		}
		if _, err := path.Match(p, ""); err != nil {
			return errcode.New(errcode.InvalidArgument, "--secret-env %q: %v", trunc(p), err)
		}
	}
	for _, d := range s.Dirs {
		if !filepath.IsAbs(d) {
			return errcode.New(errcode.InvalidArgument, "--secret-dir %q must be an absolute path", trunc(d))
		}
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() {
			return errcode.New(errcode.InvalidArgument, "--secret-dir %q must be an existing directory", trunc(d))
		}
	}
	return nil
}

// Check reports whether from is a source the server allows and can read now: "env:NAME"
// (NAME a variable name allowed by EnvAllow and set) or "file:/abs/path" (inside one of
// Dirs, also after symlinks are resolved; a regular file of at most 64 KiB), whose value
// passes Resolve's checks. Refusals are INVALID_ARGUMENT naming the server flag that would
// allow the source. The value is never part of an error.
func (s Sources) Check(from string) error {
	_, err := s.Resolve(from)
	return err
}

// Resolve reads the value of from now (so a rotated variable or file takes effect on the
// next request): for a file, one trailing newline is trimmed. A value that is empty, longer
// than 16 KiB or holds CR, LF or NUL (which would split a header) is refused.
func (s Sources) Resolve(from string) (string, error) {
	var v string
	switch {
	case strings.HasPrefix(from, "env:"):
		name := from[len("env:"):]
		if err := validName(name); err != nil {
			return "", errcode.New(errcode.InvalidArgument, "secret source %q: %s", trunc(from), err)
		}
		if !s.envAllowed(name) {
			return "", errcode.New(errcode.InvalidArgument,
				"secret source %q is not allowed: the server reads only the variables it is told to; start the server with --secret-env %s",
				from, name)
		}
		get := s.Getenv
		if get == nil {
			get = os.LookupEnv
		}
		val, ok := get(name)
		if !ok {
			return "", errcode.New(errcode.InvalidArgument,
				"secret source %q: the variable %s is not set in the server's environment; set it where the server starts", from, name)
		}
		v = val
	case strings.HasPrefix(from, "file:"):
		val, err := s.readFile(from, from[len("file:"):])
		if err != nil {
			return "", err
		}
		if strings.HasSuffix(val, "\r\n") {
			val = val[:len(val)-2]
		} else if strings.HasSuffix(val, "\n") {
			val = val[:len(val)-1]
		}
		v = val
	default:
		return "", errcode.New(errcode.InvalidArgument,
			`secret source %q must be "env:NAME" (a variable of the server's environment, allowed with --secret-env NAME) or "file:/absolute/path" (under a --secret-dir)`,
			trunc(from))
	}
	switch {
	case v == "":
		return "", errcode.New(errcode.InvalidArgument, "secret source %q: the value is empty", trunc(from))
	case len(v) > MaxSecretValue:
		return "", errcode.New(errcode.InvalidArgument, "secret source %q: the value is %d bytes, more than %d", trunc(from), len(v), MaxSecretValue)
	case strings.ContainsAny(v, "\r\n\x00"):
		return "", errcode.New(errcode.InvalidArgument,
			"secret source %q: the value holds a line break or a NUL byte (a file may end in one newline, nothing more)", trunc(from))
	}
	return v, nil
}

func (s Sources) envAllowed(name string) bool {
	for _, p := range s.EnvAllow {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

func (s Sources) readFile(from, p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", errcode.New(errcode.InvalidArgument, "secret source %q: the path must be absolute", trunc(from))
	}
	clean := filepath.Clean(p)
	fix := "start the server with --secret-dir " + filepath.Dir(clean)
	if len(s.Dirs) == 0 {
		return "", errcode.New(errcode.InvalidArgument, "secret source %q is not allowed: the server reads no files for secrets; %s", trunc(from), fix)
	}
	// Lexically first: a path outside every dir is refused without looking at it, so the
	// refusal says nothing about what exists there.
	var dirs []string
	lexical := false
	for _, d := range s.Dirs {
		dc := filepath.Clean(d)
		dirs = append(dirs, dc)
		if r, err := filepath.EvalSymlinks(dc); err == nil && r != dc {
			dirs = append(dirs, r)
		}
	}
	for _, d := range dirs {
		lexical = lexical || within(clean, d)
	}
	if !lexical {
		return "", errcode.New(errcode.InvalidArgument, "secret source %q is not allowed: it is outside the server's secret dirs (%s); %s",
			trunc(from), strings.Join(s.Dirs, ", "), fix)
	}
	real, err := filepath.EvalSymlinks(clean)
	if err != nil {
		if os.IsNotExist(err) {
			return "", errcode.New(errcode.InvalidArgument, "secret source %q: no such file", trunc(from))
		}
		return "", errcode.New(errcode.InvalidArgument, "secret source %q cannot be read by the server", trunc(from))
	}
	if !slices.ContainsFunc(dirs, func(d string) bool { return within(real, d) }) {
		return "", errcode.New(errcode.InvalidArgument,
			"secret source %q is not allowed: it resolves (through a symlink) outside the server's secret dirs (%s)",
			trunc(from), strings.Join(s.Dirs, ", "))
	}
	f, err := openNoFollow(real)
	if err != nil {
		return "", errcode.New(errcode.InvalidArgument, "secret source %q cannot be read by the server", trunc(from))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return "", errcode.New(errcode.InvalidArgument, "secret source %q is not a regular file", trunc(from))
	}
	if fi.Size() > MaxSecretFile {
		return "", errcode.New(errcode.InvalidArgument, "secret source %q is %d bytes; a secret file holds at most %d", trunc(from), fi.Size(), MaxSecretFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretFile+1))
	if err != nil {
		return "", errcode.New(errcode.InvalidArgument, "secret source %q cannot be read by the server", trunc(from))
	}
	if len(b) > MaxSecretFile {
		return "", errcode.New(errcode.InvalidArgument, "secret source %q holds more than %d bytes", trunc(from), MaxSecretFile)
	}
	return string(b), nil
}

// within reports whether p is dir or below it (both clean).
func within(p, dir string) bool {
	if p == dir {
		return true
	}
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return strings.HasPrefix(p, dir+string(filepath.Separator))
}

func trunc(s string) string {
	if len(s) > maxFromInMessage {
		return s[:maxFromInMessage] + "…"
	}
	return s
}

// NewPlaceholder returns a fresh placeholder: "agentbox-secret-" and 32 random hex digits,
// derived from nothing.
func NewPlaceholder() string {
	b := make([]byte, 16)
	rand.Read(b)
	return PlaceholderPrefix + hex.EncodeToString(b)
}

// reserved names the control plane sets in an egress sandbox; a secret named so would undo
// the sandbox's proxy or CA settings.
var reserved = []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE",
	"REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"}

func validName(name string) error {
	if name == "" || len(name) > MaxSecretName {
		return fmt.Errorf("the name must be 1-%d characters", MaxSecretName)
	}
	for i, c := range name {
		if c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9' {
			continue
		}
		return fmt.Errorf("the name must match [A-Za-z_][A-Za-z0-9_]*")
	}
	return nil
}

// NormalizeHost returns a secret's host entry as matched: lower case, no trailing dot.
func NormalizeHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

func validHost(h string) error {
	if _, err := netip.ParseAddr(h); err == nil {
		return nil
	}
	name, wild := strings.CutPrefix(h, "*.")
	if wild && !strings.Contains(name, ".") {
		return fmt.Errorf("is a wildcard over a whole top-level domain; name at least two labels after *. (*.example.com)")
	}
	if len(name) == 0 || len(name) > 253 {
		return fmt.Errorf("must be a host name (1-253 characters), a *.wildcard of one, or an IP address")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("must be a host name (labels of 1-63 letters, digits and inner hyphens), a *.wildcard of one, or an IP address; no port, no scheme")
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("must be a host name (letters, digits, hyphens), a *.wildcard of one, or an IP address; no port, no scheme")
			}
		}
	}
	return nil
}

// ValidateSpecs checks a create's secrets (Name, From, Hosts, Body; Placeholder ignored):
// at most 32; each Name an environment variable name ([A-Za-z_][A-Za-z0-9_]*, at most 128
// characters, unique, none of the proxy and CA variables the sandbox's network sets); 1-16
// Hosts, each a host name, a "*." wildcard of one or an IP address (no port), normalised in
// place to lower case. It does not look at the sources (Sources.Check does).
func ValidateSpecs(secrets []egress.Secret) error {
	if len(secrets) > MaxSecrets {
		return errcode.New(errcode.InvalidArgument, "secrets: %d given, at most %d per sandbox", len(secrets), MaxSecrets)
	}
	seen := map[string]bool{}
	for i := range secrets {
		s := &secrets[i]
		if err := validName(s.Name); err != nil {
			return errcode.New(errcode.InvalidArgument, "secrets: %q: %s", trunc(s.Name), err)
		}
		if slices.ContainsFunc(reserved, func(r string) bool { return strings.EqualFold(r, s.Name) }) {
			return errcode.New(errcode.InvalidArgument, "secrets.%s: the name is the sandbox's own proxy or CA variable; choose another name", s.Name)
		}
		if seen[s.Name] {
			return errcode.New(errcode.InvalidArgument, "secrets.%s: given twice", s.Name)
		}
		seen[s.Name] = true
		if len(s.Hosts) == 0 || len(s.Hosts) > MaxSecretHosts {
			return errcode.New(errcode.InvalidArgument, "secrets.%s.hosts: %d given, 1-%d needed (the hosts the value may be sent to)",
				s.Name, len(s.Hosts), MaxSecretHosts)
		}
		for j, h := range s.Hosts {
			n := NormalizeHost(h)
			if err := validHost(n); err != nil {
				return errcode.New(errcode.InvalidArgument, "secrets.%s.hosts[%d] %q %s", s.Name, j, trunc(h), err)
			}
			s.Hosts[j] = n
		}
	}
	return nil
}

// Prepare validates a create's secrets (ValidateSpecs), checks every source (Check), and
// returns them sorted by name, each with a fresh placeholder. Nothing in the result holds a
// value.
func (s Sources) Prepare(secrets []egress.Secret) ([]egress.Secret, error) {
	out := make([]egress.Secret, len(secrets))
	for i, sec := range secrets {
		sec.Hosts = slices.Clone(sec.Hosts)
		out[i] = sec
	}
	if err := ValidateSpecs(out); err != nil {
		return nil, err
	}
	for i := range out {
		if err := s.Check(out[i].From); err != nil {
			e, _ := errcode.As(err)
			return nil, errcode.New(errcode.InvalidArgument, "secrets.%s.from: %s", out[i].Name, e.Message)
		}
		out[i].Placeholder = NewPlaceholder()
	}
	slices.SortFunc(out, func(a, b egress.Secret) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// HostListed reports whether host (normalised) is one of hosts: equal to an entry, or below
// a "*.example.com" entry (any depth; example.com itself is not).
func HostListed(hosts []string, host string) bool {
	host = NormalizeHost(host)
	for _, h := range hosts {
		h = NormalizeHost(h)
		if suffix, ok := strings.CutPrefix(h, "*"); ok {
			if strings.HasSuffix(host, suffix) && len(host) > len(suffix) {
				return true
			}
		} else if h == host {
			return true
		}
	}
	return false
}
