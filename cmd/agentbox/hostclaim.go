//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/hostlock"
	"github.com/agentbox/agentbox/internal/idclaim"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/statedir"
)

// Ownership of host resources. Everything a server makes on its host is its state dir's: the
// runtimes' roots (bundles, disks and their loop devices and mounts, network namespace files,
// runc's and runsc's state) lie under <state>/runtimes, and its cgroups under a parent of its
// own, derived from the state dir (statedir.Identity). A sweep lists only these, so it never
// touches another server's sandboxes. Two servers never share a state dir (its flock) nor a
// cgroup parent (host locks under /run/agentbox, one per parent a runtime uses): the second
// refuses to start, naming the first's pid.

// cgroupParent is the cgroup parent of a server on cfg.StateDir: --cgroup-parent when given;
// else the legacy shared oci.LegacyCgroupParent while the store has live sandboxes with
// cgroups there (an installation from before the parent was derived: its sandboxes are
// adopted, not left behind, until none is left there); else the state dir's identity.
func cgroupParent(ctx context.Context, explicit, stateDir string, st sandbox.Store, log *slog.Logger) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	legacy, err := legacySandboxes(ctx, st)
	if err != nil {
		return "", err
	}
	if legacy > 0 {
		log.Warn("keeping the legacy cgroup parent: this state dir's sandboxes live under it; new sandboxes go there too until none is left, "+
			"then the next start moves to the state dir's own parent (or pass --cgroup-parent)", "cgroup_parent", oci.LegacyCgroupParent, "sandboxes", legacy)
		return oci.LegacyCgroupParent, nil
	}
	return statedir.Identity(stateDir)
}

// legacySandboxes counts the store's live sandboxes that have a cgroup under one of the
// legacy parents (runtimeParents(oci.LegacyCgroupParent)) in some hierarchy.
func legacySandboxes(ctx context.Context, st sandbox.Store) (int, error) {
	mounts, err := hostinfo.CgroupMounts()
	if err != nil || len(mounts) == 0 {
		return 0, nil // no cgroups here: no sandbox of ours can be there
	}
	hierarchies := make([]string, 0, len(mounts))
	for _, m := range mounts {
		hierarchies = append(hierarchies, m.Path)
	}
	return legacySandboxesIn(ctx, st, hierarchies)
}

// legacySandboxesIn is legacySandboxes over the hierarchies mounted at these paths.
func legacySandboxesIn(ctx context.Context, st sandbox.Store, hierarchies []string) (int, error) {
	live, err := st.ListSandboxes(ctx, sandbox.ListFilter{States: []sandbox.State{sandbox.StateCreating, sandbox.StateRunning,
		sandbox.StateSleeping, sandbox.StateStopping}, Limit: 100000})
	if err != nil {
		return 0, fmt.Errorf("list sandboxes: %w", err)
	}
	n := 0
	for _, sb := range live {
		if sb.ID == "" || filepath.Base(sb.ID) != sb.ID {
			continue
		}
	found:
		for _, h := range hierarchies {
			for _, p := range runtimeParents(oci.LegacyCgroupParent) {
				if _, err := os.Stat(filepath.Join(h, p, sb.ID)); err == nil {
					n++
					break found
				}
			}
		}
	}
	return n, nil
}

// runtimeParents are the cgroup parents newRuntimes gives its runtimes for parent: parent for
// runc, parent-<name> for the others.
func runtimeParents(parent string) []string {
	ps := make([]string, 0, len(runtimeFlavors))
	for _, f := range runtimeFlavors {
		ps = append(ps, runtimeParent(parent, f))
	}
	return append(ps, parent+vmParentSuffix)
}

func runtimeParent(parent string, f oci.Flavor) string {
	if f == oci.FlavorRunc {
		return parent
	}
	return parent + "-" + string(f)
}

// lockCgroupParents takes, for the server's life, the host lock of each cgroup parent its
// runtimes use (cgroup-<parent> under hostlock.Dir): a second server given one of them refuses
// to start, naming the first's pid. Only root makes cgroups; another user's server has none to
// guard (nil, nil).
func lockCgroupParents(parent, stateDir string) (*hostlock.Lock, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	names := make([]string, 0, len(runtimeFlavors))
	for _, p := range runtimeParents(parent) {
		names = append(names, "cgroup-"+p)
	}
	l, err := hostlock.Acquire(hostlock.Dir, "cgroup parent lock", names...)
	if err != nil {
		return nil, fmt.Errorf("%w: another agentbox server on this host uses the cgroup parent %s (or one of its runtimes' %v), "+
			"and two servers sharing one would sweep each other's sandboxes; give this server (state dir %s) another --cgroup-parent, or leave it unset "+
			"to use the state dir's own", err, parent, runtimeParents(parent)[1:], stateDir)
	}
	return l, nil
}

// hostIDClaims are the server's host-wide claims on its sandboxes' user-namespace id ranges
// (idclaim, under /run/agentbox): two servers on one host, each with its own store, never hand
// the same host ids to their sandboxes. Only root maps id ranges; another user's server has
// none to claim (nil).
func hostIDClaims(stateDir string) (sandbox.IDClaimer, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	owner, err := statedir.Identity(stateDir)
	if err != nil {
		return nil, err
	}
	c, err := idclaim.New(idclaim.Dir, owner, stateDir)
	if err != nil {
		return nil, err
	}
	return c, nil
}
