package runs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Bounds of the spec's smaller fields.
const (
	maxURLLen     = 2048
	maxRefLen     = 256
	maxPathLen    = 1024
	maxArgBytes   = 64 << 10 // one argv's total bytes
	maxEnv        = 256
	maxLabels     = 64
	maxLabelLen   = 256
	maxKeyLen     = 256
	maxStdinBytes = MaxFilesBytes
	maxSecrets    = 32
)

var (
	runIDPattern   = regexp.MustCompile(`^run-[0-9a-f]{12}$`)
	envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	refPattern     = regexp.MustCompile(`^[A-Za-z0-9._/@{}^~+-]+$`)
)

// phaseTimeoutNames are the phases PhaseTimeouts may name.
var phaseTimeoutNames = []string{PhaseCheckout, PhaseSetup, PhaseCommand, PhaseValidation, PhaseAgentBuild}

func invalid(field, format string, args ...any) error {
	return errcode.New(errcode.InvalidArgument, "spec.%s: %s", field, fmt.Sprintf(format, args...)).With("field", "spec."+field)
}

// checkArgv checks one argv: required (or optional when empty is allowed), bounded.
func checkArgv(field string, argv []string, required bool) error {
	if len(argv) == 0 {
		if required {
			return invalid(field, "required: a command as a list of arguments, e.g. [\"make\", \"test\"]")
		}
		return nil
	}
	if len(argv) > MaxArgs {
		return invalid(field, "at most %d arguments; got %d", MaxArgs, len(argv))
	}
	if argv[0] == "" {
		return invalid(field, "the program (first argument) must not be empty")
	}
	n := 0
	for i, a := range argv {
		n += len(a)
		if strings.IndexByte(a, 0) >= 0 || !utf8.ValidString(a) {
			return invalid(fmt.Sprintf("%s[%d]", field, i), "must be UTF-8 without NUL bytes")
		}
	}
	if n > maxArgBytes {
		return invalid(field, "arguments total at most %d bytes; got %d", maxArgBytes, n)
	}
	return nil
}

// cleanRel checks a path relative to a directory: no absolute path, no "..".
func cleanRel(field, p string) (string, error) {
	if p == "" || len(p) > maxPathLen || strings.IndexByte(p, 0) >= 0 || !utf8.ValidString(p) {
		return "", invalid(field, "must be a non-empty UTF-8 path of at most %d bytes", maxPathLen)
	}
	if path.IsAbs(p) {
		return "", invalid(field, "must be relative to dir; got %q", trunc(p, 64))
	}
	c := path.Clean(p)
	if c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return "", invalid(field, "must stay inside dir (no ..); got %q", trunc(p, 64))
	}
	return c, nil
}

func checkAbsDir(field, d string) (string, error) {
	if len(d) > maxPathLen || strings.IndexByte(d, 0) >= 0 || !path.IsAbs(d) || !utf8.ValidString(d) {
		return "", invalid(field, "must be an absolute path of at most %d bytes; got %q", maxPathLen, trunc(d, 64))
	}
	c := path.Clean(d)
	if c == "/" {
		return "", invalid(field, "must not be /")
	}
	return c, nil
}

func (s *Service) checkRepo(field, raw, ref, refField string) error {
	if len(raw) > maxURLLen {
		return invalid(field, "at most %d bytes; got %d", maxURLLen, len(raw))
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.RawQuery != "" || u.Fragment != "" {
		return invalid(field, "must be an http, https or file URL without query or fragment; got %q", trunc(raw, 64))
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return invalid(field, "has no host: %q", trunc(raw, 64))
		}
		if u.User != nil {
			return invalid(field, "must not carry credentials; name a secret in repo_secret instead")
		}
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return invalid(field, "a file URL names a local path (file:///dir); got host %q", u.Host)
		}
		if _, err := s.checkoutDir(u.Path); err != nil {
			return invalid(field, "%v", err)
		}
	default:
		return invalid(field, "must be an http, https or file URL; got scheme %q", trunc(u.Scheme, 16))
	}
	if ref != "" {
		if len(ref) > maxRefLen || !refPattern.MatchString(ref) || strings.HasPrefix(ref, "-") || strings.Contains(ref, "..") {
			return invalid(refField, "must be a branch, tag or commit (letters, digits, ._/-, not starting with -, at most %d bytes); got %q", maxRefLen, trunc(ref, 64))
		}
	}
	return nil
}

// checkoutDir resolves a file:// path and checks it is under one of Config.CheckoutDirs, both
// lexically and after resolving symlinks; it returns the resolved path.
func (s *Service) checkoutDir(p string) (string, error) {
	if len(s.cfg.CheckoutDirs) == 0 {
		return "", fmt.Errorf("this server allows no file:// repositories (start it with --checkout-dir DIR)")
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("a file URL needs an absolute path; got %q", trunc(p, 64))
	}
	c := filepath.Clean(p)
	real, err := filepath.EvalSymlinks(c)
	if err != nil {
		return "", fmt.Errorf("repository %q cannot be read", trunc(c, 128))
	}
	for _, d := range s.cfg.CheckoutDirs {
		d = filepath.Clean(d)
		rd, err := filepath.EvalSymlinks(d)
		if err != nil {
			continue
		}
		if within(d, c) && within(rd, real) {
			return real, nil
		}
	}
	return "", fmt.Errorf("%q is not under a directory this server allows (--checkout-dir)", trunc(c, 128))
}

func within(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// validate checks a spec fully (INVALID_ARGUMENT naming spec.<field>) and returns it with its
// defaults applied.
func (s *Service) validate(spec Spec) (Spec, error) {
	if spec.RepoURL != "" {
		if err := s.checkRepo("repo_url", spec.RepoURL, spec.Ref, "ref"); err != nil {
			return spec, err
		}
	} else if spec.Ref != "" {
		return spec, invalid("ref", "given without repo_url")
	}
	if spec.RepoSecret != "" {
		if spec.RepoURL == "" {
			return spec, invalid("repo_secret", "given without repo_url")
		}
		if _, ok := spec.Secrets[spec.RepoSecret]; !ok {
			return spec, invalid("repo_secret", "names no secret of spec.secrets: %q", trunc(spec.RepoSecret, 64))
		}
	}
	if spec.Dir == "" {
		spec.Dir = "/workspace"
	}
	d, err := checkAbsDir("dir", spec.Dir)
	if err != nil {
		return spec, err
	}
	spec.Dir = d
	if len(spec.Files) > MaxFiles {
		return spec, invalid("files", "at most %d files; got %d", MaxFiles, len(spec.Files))
	}
	total := 0
	for p, content := range spec.Files {
		if _, err := cleanRel("files", p); err != nil {
			return spec, err
		}
		if !utf8.ValidString(content) {
			return spec, invalid("files", "the content of %q is not UTF-8", trunc(p, 64))
		}
		total += len(content)
	}
	if total > MaxFilesBytes {
		return spec, invalid("files", "contents total at most %d bytes; got %d", MaxFilesBytes, total)
	}
	if a := spec.Agent; a != nil {
		if a.RepoURL == "" {
			return spec, invalid("agent.repo_url", "required")
		}
		if err := s.checkRepo("agent.repo_url", a.RepoURL, a.Ref, "agent.ref"); err != nil {
			return spec, err
		}
		if a.Dir == "" {
			return spec, invalid("agent.dir", "required (an absolute path)")
		}
		ad, err := checkAbsDir("agent.dir", a.Dir)
		if err != nil {
			return spec, err
		}
		if ad == spec.Dir || within(ad, spec.Dir) || within(spec.Dir, ad) {
			return spec, invalid("agent.dir", "must not overlap dir %q", spec.Dir)
		}
		if err := checkArgv("agent.build_command", a.BuildCommand, false); err != nil {
			return spec, err
		}
		if a.RepoSecret != "" {
			if _, ok := spec.Secrets[a.RepoSecret]; !ok {
				return spec, invalid("agent.repo_secret", "names no secret of spec.secrets: %q", trunc(a.RepoSecret, 64))
			}
		}
		ac := *a
		ac.Dir = ad
		spec.Agent = &ac
	}
	if err := checkArgv("setup", spec.Setup, false); err != nil {
		return spec, err
	}
	if err := checkArgv("command", spec.Command, true); err != nil {
		return spec, err
	}
	if len(spec.ValidationCommands) > MaxValidations {
		return spec, invalid("validation_commands", "at most %d; got %d", MaxValidations, len(spec.ValidationCommands))
	}
	for i, v := range spec.ValidationCommands {
		if err := checkArgv(fmt.Sprintf("validation_commands[%d]", i), v, true); err != nil {
			return spec, err
		}
	}
	if len(spec.Stdin) > maxStdinBytes {
		return spec, invalid("stdin", "at most %d bytes; got %d", maxStdinBytes, len(spec.Stdin))
	}
	if len(spec.Artifacts) > MaxArtifacts {
		return spec, invalid("artifacts", "at most %d patterns; got %d", MaxArtifacts, len(spec.Artifacts))
	}
	for i, a := range spec.Artifacts {
		c, err := cleanRel(fmt.Sprintf("artifacts[%d]", i), a)
		if err != nil {
			return spec, err
		}
		if err := checkGlob(c); err != nil {
			return spec, invalid(fmt.Sprintf("artifacts[%d]", i), "%v", err)
		}
	}
	if len(spec.Env) > maxEnv {
		return spec, invalid("env", "at most %d variables; got %d", maxEnv, len(spec.Env))
	}
	for k, v := range spec.Env {
		if !envNamePattern.MatchString(k) || len(k) > maxKeyLen {
			return spec, invalid("env", "%q is not a variable name", trunc(k, 64))
		}
		if strings.IndexByte(v, 0) >= 0 || len(v) > maxArgBytes {
			return spec, invalid("env", "the value of %s has a NUL byte or is over %d bytes", k, maxArgBytes)
		}
	}
	if len(spec.Secrets) > maxSecrets {
		return spec, invalid("secrets", "at most %d; got %d", maxSecrets, len(spec.Secrets))
	}
	for k := range spec.Secrets {
		if !envNamePattern.MatchString(k) || len(k) > maxKeyLen {
			return spec, invalid("secrets", "%q is not a variable name", trunc(k, 64))
		}
	}
	if spec.Network != nil && spec.Network.Policy != nil {
		if _, err := egress.ParsePolicy(*spec.Network.Policy); err != nil {
			return spec, invalid("network", "%v", err)
		}
	}
	if spec.CPU < 0 || spec.MemoryMB < 0 || spec.DiskMB < 0 {
		return spec, invalid("cpu", "cpu, memory_mb and disk_mb must not be negative")
	}
	if len(spec.Image) > maxPathLen || len(spec.Runtime) > 64 {
		return spec, invalid("image", "image at most %d bytes, runtime at most 64", maxPathLen)
	}
	if spec.TimeoutSeconds == 0 {
		spec.TimeoutSeconds = int64(DefaultTimeout / time.Second)
	}
	if spec.TimeoutSeconds < 1 || spec.TimeoutSeconds > int64(MaxTimeout/time.Second) {
		return spec, invalid("timeout_seconds", "must be between 1 and %d; got %d", int64(MaxTimeout/time.Second), spec.TimeoutSeconds)
	}
	for k, v := range spec.PhaseTimeouts {
		ok := false
		for _, n := range phaseTimeoutNames {
			ok = ok || n == k
		}
		if !ok {
			return spec, invalid("phase_timeout_seconds", "unknown phase %q (one of %s)", trunc(k, 32), strings.Join(phaseTimeoutNames, ", "))
		}
		if v < 1 || v > spec.TimeoutSeconds {
			return spec, invalid("phase_timeout_seconds."+k, "must be between 1 and the run's timeout_seconds (%d); got %d", spec.TimeoutSeconds, v)
		}
	}
	switch spec.Retention {
	case "":
		spec.Retention = RetentionDestroy
	case RetentionDestroy, RetentionKeep:
	default:
		return spec, invalid("retention", "must be %q or %q; got %q", RetentionDestroy, RetentionKeep, trunc(spec.Retention, 32))
	}
	if spec.KeepTTLSeconds == 0 && spec.Retention == RetentionKeep {
		spec.KeepTTLSeconds = int64(DefaultKeepTTL / time.Second)
	}
	if spec.KeepTTLSeconds < 0 || spec.KeepTTLSeconds > int64(MaxKeepTTL/time.Second) {
		return spec, invalid("keep_ttl_seconds", "must be between 1 and %d; got %d", int64(MaxKeepTTL/time.Second), spec.KeepTTLSeconds)
	}
	if len(spec.Labels) > maxLabels {
		return spec, invalid("labels", "at most %d; got %d", maxLabels, len(spec.Labels))
	}
	for k, v := range spec.Labels {
		if k == "" || len(k) > maxLabelLen || len(v) > maxLabelLen || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return spec, invalid("labels", "keys (non-empty) and values at most %d bytes of UTF-8; got %q", maxLabelLen, trunc(k, 64))
		}
	}
	if len(spec.IdempotencyKey) > maxKeyLen || !utf8.ValidString(spec.IdempotencyKey) {
		return spec, invalid("idempotency_key", "at most %d bytes of UTF-8", maxKeyLen)
	}
	return spec, nil
}

// newRunID returns "run-" and 12 lowercase hex digits.
func newRunID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "run-" + hex.EncodeToString(b[:])
}

// plannedPhases lists a spec's phases, all pending.
func plannedPhases(spec Spec) []Phase {
	var names []string
	names = append(names, PhaseSandbox)
	if spec.RepoURL != "" {
		names = append(names, PhaseCheckout)
	}
	if len(spec.Files) > 0 {
		names = append(names, PhaseFiles)
	}
	if spec.Agent != nil {
		names = append(names, PhaseAgentCheckout)
		if len(spec.Agent.BuildCommand) > 0 {
			names = append(names, PhaseAgentBuild)
		}
	}
	if len(spec.Setup) > 0 {
		names = append(names, PhaseSetup)
	}
	names = append(names, PhaseCommand)
	for i := range spec.ValidationCommands {
		names = append(names, fmt.Sprintf("%s[%d]", PhaseValidation, i))
	}
	names = append(names, PhaseCollect, PhaseCleanup)
	ph := make([]Phase, len(names))
	for i, n := range names {
		ph[i] = Phase{Name: n, State: PhasePending}
	}
	return ph
}

// newRun returns the queued record of a validated spec (owner from ctx).
func (s *Service) newRun(ctx context.Context, spec Spec, batchID string) Run {
	now := s.stamp()
	return Run{
		ID: newRunID(), Owner: sandbox.OwnerFrom(ctx), BatchID: batchID, State: Queued,
		Reason: "waiting for a worker", Spec: spec, Phases: plannedPhases(spec),
		ChangedFiles: []ChangedFile{}, Artifacts: []Artifact{},
		CreatedAt: now, UpdatedAt: now, Version: 1,
	}
}

// firstEvent is a new run's first event.
func (s *Service) firstEvent(r Run) Event {
	return Event{RunID: r.ID, Time: r.CreatedAt, To: Queued, Reason: "run recorded"}
}

func (s *Service) stamp() time.Time { return s.now().UTC().Truncate(time.Millisecond) }

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
