package netlab

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The fixture repositories of the durable-runs tests, served by git.lab over HTTP and HTTPS.
const (
	// TargetRepoPath is the repository an agent (or a run's command) works on:
	// http://git.lab/git/target.git, branch main. Its validation TargetCheck fails until
	// TargetStatusFile says "fixed".
	TargetRepoPath = "/git/target.git"
	// TargetCheck is the target's validation: `sh check.sh` in its directory exits 1 ("status.txt
	// is not fixed" on stderr) before the fixture agent's edit and 0 ("check ok") after.
	TargetCheck      = "check.sh"
	TargetStatusFile = "status.txt"
	// TargetTasksFile is where the fixture agent appends each task it is given, one a line.
	TargetTasksFile = "TASKS.md"

	// AgentRepoPath is the fixture coding agent: http://git.lab/git/agent.git with the refs
	// AgentGoodRef and AgentBadBuildRef (and main = good). Its launcher AgentLauncher is where
	// the oh-my-pi preset calls it (`/bin/sh /workspace/omp/packages/coding-agent/scripts/omp
	// --print -- TASK`, in the target's directory) and is a generic agent_command too: the task
	// comes from the arguments after "--" (or all of them), else OMP_TASK or AGENT_TASK, else
	// stdin. It appends the task to TASKS.md and writes "fixed" to status.txt in the current
	// directory, and prints "fixture agent REF: built=yes|no task=TASK" (built: AgentBuild ran
	// in the agent's directory).
	AgentRepoPath    = "/git/agent.git"
	AgentGoodRef     = "good"
	AgentBadBuildRef = "bad-build"
	AgentLauncher    = "packages/coding-agent/scripts/omp"
	// AgentBuild is the agent's build: `sh build.sh` in its directory exits 0 on good (and
	// leaves .built) and 1 on bad-build ("fixture build failed" on stderr).
	AgentBuild = "build.sh"

	// PrivateRepoPath is a copy of the target that needs HTTP basic auth:
	// https://git.lab/private/lab.git (also over HTTP, for tests of the refusal). The token
	// (GitToken, SetGitToken) is accepted as the password (any user) or as the user name.
	// Without it: 401 with WWW-Authenticate: Basic realm="netlab".
	PrivateRepoPath = "/private/lab.git"
	// maxRecordedAuth bounds the Authorization values the private server keeps.
	maxRecordedAuth = 1000
)

const targetCheckScript = `#!/bin/sh
# The target's validation: passes once status.txt says "fixed".
if grep -qx fixed status.txt; then
	echo "check ok"
	exit 0
fi
echo "status.txt is not fixed" >&2
exit 1
`

const agentLauncherScript = `#!/bin/sh
# netlab's fixture coding agent (ref %s): edits the repository in the current directory.
set -eu
task=""
if [ "${1:-}" = "--print" ]; then shift; fi
if [ "${1:-}" = "--" ]; then shift; fi
if [ $# -gt 0 ]; then task="$*"; fi
if [ -z "$task" ]; then task="${OMP_TASK:-${AGENT_TASK:-}}"; fi
if [ -z "$task" ]; then task="$(cat)"; fi
here="$(cd "$(dirname "$0")/../../.." && pwd)"
built=no
if [ -f "$here/.built" ]; then built=yes; fi
printf '%%s\n' "$task" >> TASKS.md
echo fixed > status.txt
echo "fixture agent %s: built=$built task=$task"
`

const agentBuildGood = `#!/bin/sh
# The fixture agent's build: succeeds and leaves .built.
echo "building fixture agent"
touch .built
echo "fixture build ok"
`

const agentBuildBad = `#!/bin/sh
# The fixture agent's build on bad-build: fails.
echo "building fixture agent"
echo "fixture build failed: bad-build breaks the build on purpose" >&2
exit 1
`

// git runs git in dir with a fixed identity and no system or user configuration.
func (l *Lab) git(dir string, args ...string) error {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=netlab", "GIT_AUTHOR_EMAIL=netlab@lab",
		"GIT_COMMITTER_NAME=netlab", "GIT_COMMITTER_EMAIL=netlab@lab", "GIT_CONFIG_NOSYSTEM=1", "HOME="+l.dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// commitFiles writes files (path → content; a script when it starts with "#!") into work,
// commits them on the current branch and pushes the branch to bare as each of refs.
func (l *Lab) commitFiles(work, bare, msg string, files map[string]string, refs ...string) error {
	for p, body := range files {
		full := filepath.Join(work, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(body, "#!") {
			mode = 0o755
		}
		if err := os.WriteFile(full, []byte(body), mode); err != nil {
			return err
		}
	}
	if err := l.git(work, "add", "-A"); err != nil {
		return err
	}
	if err := l.git(work, "commit", "-q", "-m", msg); err != nil {
		return err
	}
	for _, ref := range refs {
		if err := l.git(work, "push", "-q", "-f", bare, "HEAD:refs/heads/"+ref); err != nil {
			return err
		}
	}
	return nil
}

// makeFixtures creates the target, agent and private repositories.
func (l *Lab) makeFixtures() error {
	b := make([]byte, 16)
	rand.Read(b)
	l.gitToken = "netlab-token-" + hex.EncodeToString(b)
	l.privDir = filepath.Join(l.dir, "private")
	target := map[string]string{
		"README":         "netlab target repository\n",
		TargetCheck:      targetCheckScript,
		TargetStatusFile: "broken\n",
	}
	for _, r := range []struct{ root, path string }{{l.repoDir, TargetRepoPath}, {l.privDir, PrivateRepoPath}} {
		bare := filepath.Join(r.root, filepath.Base(r.path))
		work := filepath.Join(l.dir, "work-"+strings.ReplaceAll(strings.Trim(r.path, "/"), "/", "-"))
		for _, d := range []string{r.root, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		if err := l.git(r.root, "init", "-q", "--bare", "-b", "main", bare); err != nil {
			return err
		}
		if err := l.git(work, "init", "-q", "-b", "main"); err != nil {
			return err
		}
		if err := l.commitFiles(work, bare, "target", target, "main"); err != nil {
			return err
		}
	}

	bare := filepath.Join(l.repoDir, filepath.Base(AgentRepoPath))
	work := filepath.Join(l.dir, "work-agent")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	if err := l.git(l.repoDir, "init", "-q", "--bare", "-b", "main", bare); err != nil {
		return err
	}
	if err := l.git(work, "init", "-q", "-b", "main"); err != nil {
		return err
	}
	if err := l.commitFiles(work, bare, "fixture agent: good", map[string]string{
		"README":      "netlab fixture coding agent\n",
		".gitignore":  ".built\n",
		AgentLauncher: fmt.Sprintf(agentLauncherScript, AgentGoodRef, AgentGoodRef),
		AgentBuild:    agentBuildGood,
	}, "main", AgentGoodRef); err != nil {
		return err
	}
	return l.commitFiles(work, bare, "fixture agent: bad build", map[string]string{
		AgentLauncher: fmt.Sprintf(agentLauncherScript, AgentBadBuildRef, AgentBadBuildRef),
		AgentBuild:    agentBuildBad,
	}, AgentBadBuildRef)
}

// backend returns git http-backend serving the repositories under root at URL prefix.
func (l *Lab) backend(prefix, root string) http.Handler {
	execPath, err := exec.Command("git", "--exec-path").Output()
	bin := filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend")
	if err != nil {
		bin = "/usr/lib/git-core/git-http-backend"
	}
	return &cgi.Handler{
		Path: bin,
		Root: prefix,
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "HOME=" + l.dir, "GIT_CONFIG_NOSYSTEM=1"},
	}
}

// privateHandler serves PrivateRepoPath to requests with the token in HTTP basic auth.
func (l *Lab) privateHandler() http.Handler {
	be := l.backend("/private", l.privDir)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		l.mu.Lock()
		if auth != "" && len(l.gitAuth) < maxRecordedAuth {
			l.gitAuth = append(l.gitAuth, auth)
		}
		tok := l.gitToken
		l.mu.Unlock()
		user, pass, ok := r.BasicAuth()
		if !ok || (pass != tok && user != tok) {
			l.gitDenied.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="netlab"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		l.gitAccepted.Add(1)
		be.ServeHTTP(w, r)
	})
}

// SetGitDelay makes every request to the git server (public and private) wait d before it is
// served (0: none), so a test can catch a checkout in the act.
func (l *Lab) SetGitDelay(d time.Duration) { l.gitDelay.Store(int64(d)) }

// delayed wraps h with the git delay.
func (l *Lab) delayed(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d := time.Duration(l.gitDelay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// GitToken is the token the private repository accepts now (random per lab until SetGitToken).
func (l *Lab) GitToken() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gitToken
}

// SetGitToken makes tok the private repository's token.
func (l *Lab) SetGitToken(tok string) {
	l.mu.Lock()
	l.gitToken = tok
	l.mu.Unlock()
}

// GitAuth returns the Authorization header values the private repository received (at most
// 1000, oldest first): a test proves the real token reached the server.
func (l *Lab) GitAuth() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.gitAuth...)
}

// GitAuthCounts is how many requests to the private repository were served (accepted) and
// answered 401 (denied).
func (l *Lab) GitAuthCounts() (accepted, denied int64) {
	return l.gitAccepted.Load(), l.gitDenied.Load()
}
