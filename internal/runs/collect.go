package runs

import (
	"context"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Collect: changed files, diff stat and diff of Dir against its checkout (through a temporary
// index, so the sandbox's own index is untouched), then the artifacts. Idempotent: redone
// after a restart.

// gitScript runs one read-only git query in dir "$1" over a temporary index: "$2" is names,
// stat or diff. Exit 3: not a git repository.
const gitScript = `cd "$1" || exit 3
git rev-parse --verify -q HEAD >/dev/null 2>&1 || exit 3
idx=$(mktemp) || exit 1
trap 'rm -f "$idx"' EXIT
export GIT_INDEX_FILE="$idx"
git read-tree HEAD && git add -A . || exit 1
case "$2" in
names) git diff --cached --name-status -z -M ;;
stat) git diff --cached --stat=200 ;;
diff) git diff --cached --binary ;;
esac
`

// Bounds of collect.
const (
	maxNameStatusBytes = 1 << 20
	maxStatBytes       = 64 << 10
	// maxWalkEntries bounds the directory entries an artifact walk visits, maxWalkDepth its depth.
	maxWalkEntries = 20000
	maxWalkDepth   = 32
)

func (x *exe) collect() error {
	if err := x.setState(Collecting, "collecting changed files and artifacts"); err != nil {
		return err
	}
	i := x.phaseIndex(PhaseCollect)
	if x.r.SandboxID == "" {
		x.r.Phases[i].State, x.r.Phases[i].Error = PhaseSkipped, "no sandbox was created"
		return x.save()
	}
	if err := x.startPhase(i, nil); err != nil {
		return err
	}
	var errs []string
	if err := x.collectChanges(); err != nil {
		if x.ctx.Err() != nil {
			return errShutdown
		}
		errs = append(errs, err.Error())
	}
	if err := x.collectArtifacts(); err != nil {
		if x.ctx.Err() != nil {
			return errShutdown
		}
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		x.endPhase(i, PhaseFailed, nil, strings.Join(errs, "; "))
	} else {
		x.endPhase(i, PhaseSucceeded, nil, "")
	}
	return x.donePhase(i)
}

func (x *exe) phaseIndex(name string) int {
	x.phase(name)
	for i := range x.r.Phases {
		if x.r.Phases[i].Name == name {
			return i
		}
	}
	return -1
}

func (x *exe) git(mode string, max int64) (sandbox.ExecResult, error) {
	ctx, cancel := context.WithTimeout(x.ctx, 3*time.Minute)
	defer cancel()
	return x.s.sb.Exec(ctx, x.r.SandboxID, sandbox.ExecRequest{
		Argv: []string{"sh", "-c", gitScript, "collect", x.r.Spec.Dir, mode}, Timeout: 2 * time.Minute,
		MaxOutputBytes: max, Env: map[string]string{"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"},
	}, nil)
}

func (x *exe) collectChanges() error {
	res, err := x.git("names", maxNameStatusBytes)
	if err != nil {
		return fmt.Errorf("changed files: %w", err)
	}
	if res.ExitCode == 3 {
		return nil // not a git repository: nothing to compare with
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("changed files: git exited %d: %s", res.ExitCode, trunc(res.Stderr, 512))
	}
	files, more := parseNameStatus(string(res.StdoutRaw()))
	x.r.ChangedFiles = files
	var errs []string
	if more || res.Truncated {
		errs = append(errs, fmt.Sprintf("more than %d changed files: the list is cut", len(files)))
	}
	if st, err := x.git("stat", maxStatBytes); err == nil && st.ExitCode == 0 {
		x.r.DiffStat = st.Stdout
	}
	d, err := x.git("diff", MaxDiffBytes)
	if err != nil {
		errs = append(errs, "diff: "+err.Error())
	} else {
		raw := d.StdoutRaw()
		if int64(len(raw)) > MaxDiffBytes {
			raw = raw[:MaxDiffBytes]
		}
		x.r.Diff = strings.ToValidUTF8(string(raw), "\uFFFD")
		x.r.DiffTruncated = d.Truncated || d.StdoutBytes > MaxDiffBytes
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// parseNameStatus parses `git diff --name-status -z -M` (at most MaxChangedFiles).
func parseNameStatus(out string) ([]ChangedFile, bool) {
	tok := strings.Split(out, "\x00")
	files := []ChangedFile{}
	for k := 0; k < len(tok) && tok[k] != ""; {
		st := tok[k]
		k++
		if k >= len(tok) {
			break
		}
		if len(files) >= MaxChangedFiles {
			return files, true
		}
		switch st[0] {
		case 'R', 'C':
			if k+1 >= len(tok) {
				return files, false
			}
			from, to := tok[k], tok[k+1]
			k += 2
			if st[0] == 'R' {
				files = append(files, ChangedFile{Path: to, Status: "renamed", From: from})
			} else {
				files = append(files, ChangedFile{Path: to, Status: "added", From: from})
			}
		default:
			p := tok[k]
			k++
			s := "modified"
			switch st[0] {
			case 'A':
				s = "added"
			case 'D':
				s = "deleted"
			}
			files = append(files, ChangedFile{Path: p, Status: s})
		}
	}
	return files, false
}

// checkGlob checks a pattern's syntax (path.Match's, with ** as a whole segment).
func checkGlob(p string) error {
	for _, seg := range strings.Split(p, "/") {
		if seg == "**" {
			continue
		}
		if _, err := path.Match(seg, ""); err != nil {
			return fmt.Errorf("bad pattern %q", trunc(p, 64))
		}
	}
	return nil
}

func hasMeta(s string) bool { return strings.ContainsAny(s, "*?[\\") }

// matchGlob matches a relative path against a pattern whose ** segments match any number of
// directories.
func matchGlob(pat, name string) bool {
	return matchSegs(strings.Split(pat, "/"), strings.Split(name, "/"))
}

func matchSegs(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for k := 0; k <= len(name); k++ {
				if matchSegs(pat[1:], name[k:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}

// walker lists a sandbox's files under a directory with ListDir, bounded in entries and depth.
type walker struct {
	x       *exe
	visited int
	cut     bool
}

func (w *walker) walk(dir, rel string, depth int, fn func(rel string, fi sandbox.FileInfo)) error {
	if depth > maxWalkDepth || w.visited >= maxWalkEntries {
		w.cut = true
		return nil
	}
	ctx, cancel := context.WithTimeout(w.x.ctx, time.Minute)
	l, err := w.x.s.sb.ListDir(ctx, w.x.r.SandboxID, dir)
	cancel()
	if err != nil {
		return err
	}
	if l.Truncated {
		w.cut = true
	}
	for _, e := range l.Entries {
		w.visited++
		if w.visited > maxWalkEntries {
			w.cut = true
			return nil
		}
		r := e.Name
		if rel != "" {
			r = rel + "/" + e.Name
		}
		switch e.Type {
		case "dir":
			if e.Name == ".git" {
				continue
			}
			if err := w.walk(dir+"/"+e.Name, r, depth+1, fn); err != nil {
				return err
			}
		case "file":
			fn(r, e)
		}
	}
	return nil
}

func (x *exe) collectArtifacts() error {
	if len(x.r.Spec.Artifacts) == 0 {
		return nil
	}
	var (
		arts  []Artifact
		errs  []string
		total int64
		seen  = map[string]bool{}
	)
	for _, pat := range x.r.Spec.Artifacts {
		pat = path.Clean(pat)
		segs := strings.Split(pat, "/")
		base := []string{}
		for _, sg := range segs[:len(segs)-1] {
			if hasMeta(sg) || sg == "**" {
				break
			}
			base = append(base, sg)
		}
		var matches []string
		sizes := map[string]int64{}
		if !hasMeta(pat) {
			ctx, cancel := context.WithTimeout(x.ctx, time.Minute)
			fi, err := x.s.sb.Stat(ctx, x.r.SandboxID, x.r.Spec.Dir+"/"+pat)
			cancel()
			if err == nil && fi.Type == "file" {
				matches, sizes[pat] = []string{pat}, fi.Size
			}
		} else {
			w := &walker{x: x}
			start := x.r.Spec.Dir
			if len(base) > 0 {
				start += "/" + strings.Join(base, "/")
			}
			err := w.walk(start, strings.Join(base, "/"), 0, func(rel string, fi sandbox.FileInfo) {
				if matchGlob(pat, rel) {
					matches = append(matches, rel)
					sizes[rel] = fi.Size
				}
			})
			if err != nil && !errcode.Is(err, errcode.FileNotFound) {
				errs = append(errs, fmt.Sprintf("%s: listing: %v", pat, err))
				continue
			}
			if w.cut {
				errs = append(errs, fmt.Sprintf("%s: the search stopped at %d entries or depth %d", pat, maxWalkEntries, maxWalkDepth))
			}
		}
		if len(matches) == 0 {
			errs = append(errs, fmt.Sprintf("%s: matched no file", pat))
			continue
		}
		for _, m := range matches {
			if seen[m] {
				continue
			}
			seen[m] = true
			if len(arts) >= MaxArtifacts {
				errs = append(errs, fmt.Sprintf("%s: over %d artifacts, not collected", m, MaxArtifacts))
				continue
			}
			if sizes[m] > MaxArtifactBytes {
				errs = append(errs, fmt.Sprintf("%s: %d bytes, over the bound of %d per artifact", m, sizes[m], MaxArtifactBytes))
				continue
			}
			if total+sizes[m] > MaxRunArtifacts {
				errs = append(errs, fmt.Sprintf("%s: the run's artifacts would pass %d bytes", m, MaxRunArtifacts))
				continue
			}
			a, err := x.fetchArtifact(m, len(arts))
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", m, err))
				continue
			}
			total += a.Size
			arts = append(arts, a)
		}
	}
	if arts == nil {
		arts = []Artifact{}
	}
	x.r.Artifacts, x.r.ArtifactErrors = arts, errs
	return nil
}

func (x *exe) fetchArtifact(rel string, n int) (Artifact, error) {
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Minute)
	defer cancel()
	rc, _, err := x.s.sb.ReadFile(ctx, x.r.SandboxID, x.r.Spec.Dir+"/"+rel, 0, 0, MaxArtifactBytes)
	if err != nil {
		return Artifact{}, err
	}
	defer rc.Close()
	w, err := x.s.blobs.create(x.s.blobs.artifactPath(x.r.ID, n))
	if err != nil {
		return Artifact{}, err
	}
	if _, err := io.Copy(w, io.LimitReader(rc, MaxArtifactBytes+1)); err != nil {
		w.abort()
		return Artifact{}, err
	}
	if w.n > MaxArtifactBytes {
		w.abort()
		return Artifact{}, fmt.Errorf("over the bound of %d bytes", MaxArtifactBytes)
	}
	sum := w.sha()
	size := w.n
	if err := w.commit(); err != nil {
		return Artifact{}, err
	}
	return Artifact{Path: rel, Size: size, SHA256: sum}, nil
}

// cleanup destroys the sandbox (or keeps it for KeepTTLSeconds).
func (x *exe) cleanup() error {
	if err := x.setState(Cleaning, "cleaning up"); err != nil {
		return err
	}
	i := x.phaseIndex(PhaseCleanup)
	if x.r.SandboxID == "" {
		x.r.Phases[i].State, x.r.Phases[i].Error = PhaseSkipped, "no sandbox was created"
		return x.save()
	}
	if err := x.startPhase(i, nil); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(x.ctx, 5*time.Minute)
	defer cancel()
	if x.r.Spec.Retention == RetentionKeep {
		// Extend adds to the expiry: keep it at least KeepTTLSeconds from now (the sandbox's
		// TTL may already reach further; it cannot be shortened).
		sb, err := x.s.sb.Get(ctx, x.r.SandboxID)
		if err == nil {
			want := x.s.now().Add(time.Duration(x.r.Spec.KeepTTLSeconds) * time.Second)
			if need := want.Sub(sb.ExpiresAt); need > 0 {
				sb, err = x.s.sb.Extend(ctx, x.r.SandboxID, int64((need+time.Second-1)/time.Second))
			} else if sb.State != sandbox.StateRunning {
				err = fmt.Errorf("sandbox %s is %s", sb.ID, sb.State)
			}
		}
		if err != nil {
			if x.ctx.Err() != nil {
				return errShutdown
			}
			x.endPhase(i, PhaseFailed, nil, "keeping the sandbox: "+err.Error())
			return x.donePhase(i)
		}
		exp := sb.ExpiresAt.UTC()
		x.r.SandboxKept, x.r.KeptUntil = true, &exp
		x.endPhase(i, PhaseSucceeded, nil, "")
		return x.donePhase(i)
	}
	if _, err := x.s.sb.Destroy(ctx, x.r.SandboxID); err != nil && !errcode.Is(err, errcode.SandboxNotFound) {
		if x.ctx.Err() != nil {
			return errShutdown
		}
		x.r.CleanupFailed, x.r.CleanupError = true, trunc(err.Error(), 1024)
		x.endPhase(i, PhaseFailed, nil, "destroying the sandbox: "+err.Error())
		return x.donePhase(i)
	}
	x.endPhase(i, PhaseSucceeded, nil, "")
	return x.donePhase(i)
}
