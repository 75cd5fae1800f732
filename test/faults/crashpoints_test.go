package faults

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/faultpoint"
	"github.com/agentbox/agentbox/internal/testenv"
)

// buildCrashBinary builds the agentbox binary with its crash points (-tags faultpoints) in the
// background, beside the campaign, so the crash_point fault can start once it is there; the
// lean agent beside it, where a server looks for it (the same sandboxes' agent as the plain
// server's).
func (c *campaign) buildCrashBinary() {
	dir := filepath.Join(c.base, "faultpoints")
	out := filepath.Join(dir, "agentbox")
	cmd := exec.Command("go", "build", "-tags", "faultpoints", "-o", dir+string(filepath.Separator), "./cmd/agentbox", "./cmd/agentbox-guest")
	cmd.Dir = testenv.ModuleRoot(c.t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	go func() {
		b, err := cmd.CombinedOutput()
		if err != nil {
			c.t.Errorf("build agentbox -tags faultpoints: %v\n%s", err, b)
			return
		}
		c.fpBin.Store(out)
	}()
}

// crashPoint restarts the server with its crash points armed at one of them (AGENTBOX_FAULTPOINT)
// and lets the clients go on until the server dies there (up to 20 s), then starts it again
// normally: a crash between two steps of a create, destroy, snapshot, fork, run or pool refill.
func (c *campaign) crashPoint(ctx context.Context, rng *rand.Rand) {
	bin, _ := c.fpBin.Load().(string)
	if bin == "" { // a plain SIGKILL instead, until the build is there
		c.faults.add("crash_point:binary_not_built_yet:server_kill_instead")
		c.serverKill(ctx, rng)
		return
	}
	// Each point in turn, in an order the seed shuffles, so that a few crash faults try several.
	if len(c.points) == 0 {
		for _, i := range rng.Perm(len(faultpoint.Points)) {
			c.points = append(c.points, faultpoint.Points[i])
		}
	}
	name := c.points[0]
	c.points = c.points[1:]
	c.srvMu.Lock()
	p := c.srv
	c.srvMu.Unlock()
	p.kill()
	if err := c.startWith(bin, faultpoint.EnvVar+"="+name); err != nil {
		c.violate("crash_point %s: the server does not start: %v", name, err)
	}
	c.srvMu.Lock()
	p = c.srv
	c.srvMu.Unlock()
	hit := false
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if p.exited() {
			hit = true
			break
		}
	}
	if hit {
		if !strings.Contains(c.logs.String(), "faultpoint: crashing at "+name) {
			c.violate("crash_point %s: the server exited, not at its crash point: %v", name, p.cmd.ProcessState)
		}
		c.faults.add("crash_point:" + name)
	} else {
		c.faults.add("crash_point:" + name + ":not_reached")
		p.kill()
	}
	if err := c.start(); err != nil {
		c.violate("after crash point %s the server does not start again: %v", name, err)
		if err := c.start(); err != nil {
			c.t.Fatalf("the server does not start again: %v\n%s", err, tail(c.logs.String(), 20000))
		}
	}
}
