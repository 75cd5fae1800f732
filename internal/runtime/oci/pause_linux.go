package oci

import (
	"context"
	"encoding/json"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

var _ runtime.Pauser = (*Runtime)(nil)

// Pause freezes every process of sandbox id (runtime.Pauser): `runc pause` and `crun pause`
// freeze the sandbox's cgroup (the v1 freezer here, cgroup.freeze on v2) and return once every
// task is frozen; `runsc pause` stops every task of gVisor's sentry. Pausing a paused sandbox is
// nil.
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
	start := time.Now()
	_, err := r.command(ctx, op, id)
	if err != nil {
		if st, serr := r.rawStatus(ctx, id); serr == nil && st == want {
			return nil
		}
		return r.classify(err, op, id)
	}
	r.log.Debug("sandbox "+op+"d", "sandbox_id", id, "took", time.Since(start))
	return nil
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
