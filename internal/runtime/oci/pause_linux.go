package oci

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

var _ runtime.Pauser = (*Runtime)(nil)

// Pause freezes every process of sandbox id (runtime.Pauser): `runc pause` and `crun pause`
// freeze the sandbox's cgroup (the v1 freezer here, cgroup.freeze on v2), and Pause returns
// once every task is frozen (runc waits for it, crun may not: waitFrozen); `runsc pause` stops
// every task of gVisor's sentry. Pausing a paused sandbox is nil.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.pauseOrResume(ctx, id, "pause", "paused")
}

// Resume thaws what Pause froze (runtime.Pauser); resuming a running sandbox is nil.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.pauseOrResume(ctx, id, "resume", "running")
}

// pauseOrResume runs the OCI runtime's op; if it fails because the container already is in
// the state op leads to, that is success.
func (r *Runtime) pauseOrResume(ctx context.Context, id, op, want string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := r.checkAvailable(); err != nil {
		return err
	}
	if !r.stateExists(id) {
		return errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	// The marker says a pause may be in force: a server killed before its Resume leaves it, and
	// Adopt resumes such a sandbox (nothing but a commit pauses one).
	marker := filepath.Join(r.sandboxDir(id), pausedMarker)
	if op == "pause" {
		if err := os.WriteFile(marker, nil, 0o600); err != nil {
			return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot mark sandbox %s paused", id)
		}
	}
	start := time.Now()
	_, err := r.command(ctx, op, id)
	if err != nil {
		if st, serr := r.rawStatus(ctx, id); serr == nil && st == want {
			err = nil
		} else {
			return r.classify(err, op, id)
		}
	}
	if op == "pause" {
		if err := r.waitFrozen(ctx, id); err != nil {
			if _, rerr := r.command(context.WithoutCancel(ctx), "resume", id); rerr == nil {
				_ = os.Remove(marker)
			}
			return err
		}
	}
	if op == "resume" {
		_ = os.Remove(marker)
	}
	r.log.Debug("sandbox "+op+"d", "sandbox_id", id, "took", time.Since(start))
	return nil
}

// freezeWait bounds how long Pause waits for a freezing cgroup to be frozen.
const freezeWait = 5 * time.Second

// waitFrozen returns once every task of sandbox id's cgroup is frozen. `crun pause` on a v1
// freezer can return while freezer.state still says FREEZING (a task the kernel has not
// stopped yet: a writer on a loaded host, seen in TestPause), and a caller that then copies the
// sandbox's files would copy them under a writer still running. As runc does, FROZEN is written
// again until the state says FROZEN; on v2, cgroup.events says "frozen 1" once the kernel is
// done. Past freezeWait it fails, and Pause thaws what it froze.
func (r *Runtime) waitFrozen(ctx context.Context, id string) error {
	if r.flavor == FlavorGVisor {
		return nil // runsc pause stops the sentry's tasks, not the cgroup
	}
	deadline := time.Now().Add(freezeWait)
	for {
		done, state, rewrite := r.freezeState(id)
		if done {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return errcode.New(errcode.RuntimeUnavailable, "sandbox %s did not freeze within %s (its cgroup says %s); try again", id, freezeWait, state)
		}
		if rewrite != "" {
			_ = os.WriteFile(rewrite, []byte("FROZEN"), 0)
		}
		time.Sleep(time.Millisecond)
	}
}

// freezeState reads sandbox id's freezer: whether it is wholly frozen (or has no freezer to
// read), what it says, and the v1 file to write FROZEN to again ("" on v2).
func (r *Runtime) freezeState(id string) (done bool, state, rewrite string) {
	for _, mnt := range r.cgroupMounts {
		dir := filepath.Join(mnt, cgroupPath(r.cgroupParent, id))
		f := filepath.Join(dir, "freezer.state")
		if b, err := os.ReadFile(f); err == nil {
			state = strings.TrimSpace(string(b))
			return state == "FROZEN", state, f
		}
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.events")); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "frozen "); ok {
					return v == "1", "frozen " + v, ""
				}
			}
		}
	}
	return true, "", ""
}

// pausedMarker, in a sandbox's directory, is written before a Pause and removed after its
// Resume.
const pausedMarker = "paused"

// resumeIfPaused resumes sandbox id if a Pause may still be in force (its marker is there): a
// server killed during a commit leaves the sandbox frozen, and the restarted server's Adopt
// thaws it.
func (r *Runtime) resumeIfPaused(ctx context.Context, id string) error {
	if _, err := os.Stat(filepath.Join(r.sandboxDir(id), pausedMarker)); err != nil {
		return nil
	}
	r.log.Warn("sandbox was left paused (a commit's server died); resuming it", "sandbox_id", id)
	return r.Resume(ctx, id)
}

// rawStatus is the OCI runtime's own word for the container's status (created, running, paused,
// stopped).
func (r *Runtime) rawStatus(ctx context.Context, id string) (string, error) {
	out, err := r.command(ctx, "state", id)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", err
	}
	return st.Status, nil
}

// frozen reports whether sandbox id's cgroup is frozen (runc and crun pause): its v1
// freezer.state, or cgroup.freeze on v2. A file read, cheap enough for every Stop.
func (r *Runtime) frozen(id string) bool {
	if r.flavor == FlavorGVisor {
		return false // runsc pause stops the sentry's tasks, not the cgroup
	}
	for _, mnt := range r.cgroupMounts {
		dir := filepath.Join(mnt, cgroupPath(r.cgroupParent, id))
		if b, err := os.ReadFile(filepath.Join(dir, "freezer.state")); err == nil {
			return strings.TrimSpace(string(b)) != "THAWED"
		}
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.freeze")); err == nil {
			return strings.TrimSpace(string(b)) == "1"
		}
	}
	return false
}
