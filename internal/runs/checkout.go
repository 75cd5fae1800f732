package runs

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Checkout: a constant script run as the phase's job, with the url, ref, dir and mode as its
// arguments (never interpolated). Mode "shallow" fetches the ref alone at depth 1; a server
// that serves no shallow fetch (dumb HTTP) gets the ref alone in full, and a commit the server
// will not serve by id gets every branch and tag fetched, the ref then resolved as a commit, a
// branch or a tag. Mode "bundle" fetches from a bundle file the host made of a file://
// repository. A fetch that fails is tried again three times, 1, 2 and 4 s apart (a network cut,
// or the server — whose egress proxy carries the fetch — restarting mid-fetch, does not fail
// the run). The last line of its stdout is the resolved commit.
const checkoutScript = `set -eu
url="$1"; ref="$2"; dir="$3"; mode="$4"
want="${ref:-HEAD}"
mkdir -p "$dir"
cd "$dir"
git init -q .
depth="--depth=1"
if [ "$mode" = bundle ]; then depth=""; fi
fetch() {
  if git fetch -q $depth "$url" "$want"; then
    git checkout -q --detach FETCH_HEAD
    return
  fi
  if [ -n "$depth" ]; then
    echo "a shallow fetch of $want failed; fetching it in full" >&2
    if git fetch -q "$url" "$want"; then
      git checkout -q --detach FETCH_HEAD
      return
    fi
  fi
  echo "fetching $want alone failed; fetching every branch and tag" >&2
  git fetch -q "$url" "+refs/heads/*:refs/remotes/origin/*" "+refs/tags/*:refs/tags/*" || return 1
  for c in "$want" "refs/remotes/origin/${want#refs/heads/}" "refs/tags/${want#refs/tags/}"; do
    if commit=$(git rev-parse -q --verify "$c^{commit}"); then
      git checkout -q --detach "$commit"
      return
    fi
  done
  echo "$want is no commit, branch or tag of $url" >&2
  return 1
}
for wait in 1 2 4 0; do
  if fetch; then git rev-parse HEAD; exit 0; fi
  [ "$wait" = 0 ] && exit 128
  echo "fetch failed; trying again in ${wait}s" >&2
  sleep "$wait"
done
`

// maxBundleBytes bounds the bundle of a file:// repository.
const maxBundleBytes = 1 << 30

var commitPattern = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

func isNetworkRepo(raw string) bool {
	return strings.HasPrefix(raw, "http://") || strings.HasPrefix(raw, "https://")
}

func repoHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Host
}

// checkoutHosts are the hosts the checkouts need (http and https repositories).
func (x *exe) checkoutHosts() []string {
	var hosts []string
	if isNetworkRepo(x.r.Spec.RepoURL) {
		hosts = append(hosts, repoHost(x.r.Spec.RepoURL))
	}
	if a := x.r.Spec.Agent; a != nil && isNetworkRepo(a.RepoURL) {
		hosts = append(hosts, repoHost(a.RepoURL))
	}
	return hosts
}

// ownPolicy is the run's own network policy (an empty allow list for none).
func (x *exe) ownPolicy() egress.Policy {
	if n := x.r.Spec.Network; n != nil && n.Policy != nil {
		return egress.Policy{Allow: append([]string{}, n.Policy.Allow...), Deny: append([]string{}, n.Policy.Deny...)}
	}
	return egress.Policy{Allow: []string{}, Deny: []string{}}
}

// createNetwork is the sandbox's network at create: the run's, with the checkout's hosts added
// while they are needed.
func (x *exe) createNetwork() *sandbox.Network {
	hosts := x.checkoutHosts()
	if len(hosts) == 0 {
		return x.r.Spec.Network
	}
	p := x.ownPolicy()
	p.Allow = append(p.Allow, hosts...)
	return &sandbox.Network{Policy: &p}
}

// createSecrets are the spec's secrets, a repository secret's hosts defaulting to its repo's.
func (x *exe) createSecrets() map[string]sandbox.SecretSpec {
	if len(x.r.Spec.Secrets) == 0 {
		return nil
	}
	out := make(map[string]sandbox.SecretSpec, len(x.r.Spec.Secrets))
	for k, v := range x.r.Spec.Secrets {
		out[k] = v
	}
	fill := func(name, repo string) {
		if v, ok := out[name]; ok && name != "" && len(v.Hosts) == 0 {
			if h := repoHost(repo); h != "" {
				if hn, _, err := splitHostPort(h); err == nil {
					h = hn
				}
				v.Hosts = []string{h}
				out[name] = v
			}
		}
	}
	fill(x.r.Spec.RepoSecret, x.r.Spec.RepoURL)
	if a := x.r.Spec.Agent; a != nil {
		fill(a.RepoSecret, a.RepoURL)
	}
	return out
}

func splitHostPort(h string) (string, string, error) {
	u, err := url.Parse("//" + h)
	if err != nil {
		return "", "", err
	}
	return u.Hostname(), u.Port(), nil
}

// narrowNetwork puts the sandbox back on the run's own policy once the checkouts are done.
func (x *exe) narrowNetwork() error {
	if x.narrowed || len(x.checkoutHosts()) == 0 || x.r.SandboxID == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(x.ctx, opTimeout)
	defer cancel()
	if x.s.cfg.Network == nil {
		return errcode.New(errcode.UnsupportedOp, "this server has no network feature to restore run %s's sandbox's policy with", x.r.ID)
	}
	if _, err := x.s.cfg.Network.UpdateNetwork(ctx, x.r.SandboxID, x.ownPolicy()); err != nil {
		return fmt.Errorf("restoring the run's network policy after the checkout: %w", err)
	}
	x.narrowed = true
	return nil
}

// checkoutPhase checks repo at ref out into dir inside the sandbox, as a job.
func (x *exe) checkoutPhase(i int, repo, ref, secret, dir string) error {
	mode, src := "shallow", repo
	shown := []string{"git-checkout", repo, ref, dir}
	if err := x.startPhase(i, shown); err != nil {
		return err
	}
	env := map[string]string{"GIT_TERMINAL_PROMPT": "0"}
	if strings.HasPrefix(repo, "file:") {
		u, _ := url.Parse(repo)
		bundle, err := x.uploadBundle(u.Path, x.r.Phases[i].Name)
		if err != nil {
			return x.failPhase(i, err.Error())
		}
		mode, src = "bundle", bundle
	} else if secret != "" {
		ctx, cancel := context.WithTimeout(x.ctx, opTimeout)
		sb, err := x.s.sb.Get(ctx, x.r.SandboxID)
		cancel()
		if err != nil {
			return x.failPhase(i, "reading the sandbox's secrets: "+err.Error())
		}
		ph := ""
		for _, sc := range sb.Secrets {
			if sc.Name == secret {
				ph = sc.Placeholder
			}
		}
		if ph == "" {
			return x.failPhase(i, "the sandbox has no secret "+secret)
		}
		for k, v := range basicAuthEnv(ph) {
			env[k] = v
		}
	}
	argv := []string{"sh", "-c", checkoutScript, "git-checkout", src, ref, dir, mode}
	x.r.Phases[i].Argv = nil
	return x.jobPhaseStarted(i, argv, shown, "/", env, PhaseCheckout) // the script makes dir
}

// uploadBundle bundles a file:// repository on the host (under CheckoutDirs, checked again
// now) and writes it into the sandbox, returning its path there.
func (x *exe) uploadBundle(p, phase string) (string, error) {
	real, err := x.s.checkoutDir(p)
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp("", "agentbox-bundle-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	file := filepath.Join(tmp, "repo.bundle")
	ctx, cancel := context.WithDeadline(x.cctx, x.phaseDeadline(PhaseCheckout))
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", "-c", "core.fsmonitor=false", "-c", "safe.directory=*", "-C", real, "bundle", "create", file, "--all")
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0"}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{b: &stderr, n: 4096}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("bundling %s: %v: %s", real, err, strings.TrimSpace(stderr.String()))
	}
	st, err := os.Stat(file)
	if err != nil {
		return "", err
	}
	if st.Size() > maxBundleBytes {
		return "", fmt.Errorf("the repository's bundle is %d bytes, over the bound of %d", st.Size(), maxBundleBytes)
	}
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	dst := "/tmp/.agentbox-" + x.r.ID + "-" + phase + ".bundle"
	if _, err := x.s.sb.WriteFile(ctx, x.r.SandboxID, dst, 0o600, f); err != nil {
		return "", fmt.Errorf("uploading the bundle: %w", err)
	}
	return dst, nil
}

type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// commitOf reads the resolved commit from a checkout phase's output (its last line).
func commitOf(p Phase) string {
	lines := strings.Split(strings.TrimSpace(p.Stdout), "\n")
	c := strings.TrimSpace(lines[len(lines)-1])
	if commitPattern.MatchString(c) {
		return c
	}
	return ""
}

// basicAuthEnv is git's configuration (GIT_CONFIG_*, never argv) sending the secret's
// placeholder as HTTP Basic credentials; the egress proxy swaps the placeholder inside them for
// the value, which never exists in the sandbox.
func basicAuthEnv(placeholder string) map[string]string {
	return map[string]string{
		"GIT_CONFIG_COUNT":   "1",
		"GIT_CONFIG_KEY_0":   "http.extraHeader",
		"GIT_CONFIG_VALUE_0": "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+placeholder)),
	}
}
