package runs

import (
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The checkout script against every kind of server users have — smart HTTP (git's own
// http-backend), dumb HTTP (a static file server over a bare repository, which serves no shallow
// fetch), a file:// path and a bundle — with branch, tag, commit, refs/heads/… and empty
// (HEAD) refs. It runs the script as the checkout phase does, with the host's git.
func TestCheckoutScriptServers(t *testing.T) {
	backend := "/usr/lib/git-core/git-http-backend"
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git on this machine")
	}
	if _, err := os.Stat(backend); err != nil {
		t.Skipf("no git http-backend at %s", backend)
	}
	dir := t.TempDir()
	work := filepath.Join(dir, "work")
	git := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t",
			"GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	os.MkdirAll(work, 0o755)
	git(work, "init", "-q", "-b", "main")
	commit := func(msg string) string {
		os.WriteFile(filepath.Join(work, "file"), []byte(msg+"\n"), 0o644)
		git(work, "add", ".")
		git(work, "commit", "-qm", msg)
		return git(work, "rev-parse", "HEAD")
	}
	first := commit("first") // on no branch's tip later: fetchable only by id
	tagged := commit("tagged")
	git(work, "tag", "-a", "v1", "-m", "release one")
	mainTip := commit("main tip")
	git(work, "checkout", "-q", "-b", "dev")
	devTip := commit("dev tip")
	git(work, "checkout", "-q", "main")

	repos := filepath.Join(dir, "repos")
	bare := filepath.Join(repos, "repo.git")
	os.MkdirAll(repos, 0o755)
	git(repos, "clone", "-q", "--bare", work, bare)
	git(bare, "update-server-info") // what a dumb server needs: info/refs, objects/info/packs
	bundle := filepath.Join(dir, "repo.bundle")
	git(work, "bundle", "create", "-q", bundle, "--all")

	smart := httptest.NewServer(&cgi.Handler{Path: backend, Root: "/git",
		Env: []string{"GIT_PROJECT_ROOT=" + repos, "GIT_HTTP_EXPORT_ALL=1"}})
	t.Cleanup(smart.Close) // the parallel subtests run after this function returns
	dumb := httptest.NewServer(http.StripPrefix("/repo.git", http.FileServer(http.Dir(bare))))
	t.Cleanup(dumb.Close)

	servers := []struct{ name, url, mode string }{
		{"smart-http", smart.URL + "/git/repo.git", "shallow"},
		{"dumb-http", dumb.URL + "/repo.git", "shallow"},
		{"file-path", "file://" + bare, "shallow"},
		{"bundle", bundle, "bundle"},
	}
	refs := []struct{ name, ref, want string }{
		{"branch", "main", mainTip},
		{"other-branch", "dev", devTip},
		{"full-branch-ref", "refs/heads/dev", devTip},
		{"annotated-tag", "v1", tagged},
		{"commit", first, first},
		{"head", "", mainTip},
	}
	for _, sv := range servers {
		for _, rf := range refs {
			t.Run(sv.name+"/"+rf.name, func(t *testing.T) {
				t.Parallel()
				into := filepath.Join(t.TempDir(), "src")
				cmd := exec.Command("sh", "-c", checkoutScript, "git-checkout", sv.url, rf.ref, into, sv.mode)
				cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0")
				var stderr strings.Builder
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("checkout of %q from %s: %v\n%s", rf.ref, sv.url, err, stderr.String())
				}
				lines := strings.Split(strings.TrimSpace(string(out)), "\n")
				if got := lines[len(lines)-1]; got != rf.want {
					t.Fatalf("checkout of %q resolved to %s, want %s\n%s", rf.ref, got, rf.want, stderr.String())
				}
				if head := git(into, "rev-parse", "HEAD"); head != rf.want {
					t.Fatalf("HEAD is %s, want %s", head, rf.want)
				}
			})
		}
	}
	// A ref that names nothing fails (after its retries), saying so.
	t.Run("missing-ref", func(t *testing.T) {
		t.Parallel()
		cmd := exec.Command("sh", "-c", checkoutScript, "git-checkout", dumb.URL+"/repo.git", "no-such-branch", filepath.Join(t.TempDir(), "src"), "shallow")
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("checkout of a missing branch succeeded: %s", out)
		}
		if !strings.Contains(string(out), "no-such-branch is no commit, branch or tag of") {
			t.Fatalf("the failure does not name the ref: %s", out)
		}
	})
}
