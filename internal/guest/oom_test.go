//go:build linux

package guest_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
)

// TestOOMKill: the agent kills the command holding the most memory — all of its processes —
// and leaves a smaller one running. Not parallel: the agent of a test is not PID 1, so it
// looks at the test binary's descendants, and no other test's commands must run meanwhile.
func TestOOMKill(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs python3")
	}
	a := startAgent(t)
	if res, err := a.c.OOMKill(ctxT(t, 10*time.Second)); err != nil || res.Killed != 0 {
		t.Fatalf("with nothing running: %+v %v", res, err)
	}
	ready := filepath.Join(a.workdir, "ready")
	type result struct {
		res guest.ExecResult
		err error
	}
	big, small := make(chan result, 1), make(chan result, 1)
	go func() {
		// 96 MiB touched, and a forked child of the same command.
		res, err := a.c.Exec(ctxT(t, 60*time.Second), guest.ExecRequest{Argv: []string{"python3", "-c",
			"import os, time\nb = bytearray(96 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nif os.fork() == 0:\n    time.sleep(60)\nopen('ready', 'w').close()\ntime.sleep(60)"}}, nil)
		big <- result{res, err}
	}()
	// The small command outlives the test's waits (a loaded machine took more than 5 s to
	// make the big one ready); it is canceled once the oom-kill is checked.
	smallCtx, cancelSmall := context.WithCancel(ctxT(t, 120*time.Second))
	defer cancelSmall()
	go func() {
		res, err := a.c.Exec(smallCtx, guest.ExecRequest{Argv: []string{"sleep", "100"}}, nil)
		small <- result{res, err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the big command never got ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := a.c.OOMKill(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("oom-kill: %+v", res)
	if res.Killed < 1 || res.Command != "python3" || res.RSSBytes < 96<<20 {
		t.Errorf("oom-kill %+v: want python3 with at least 96 MiB", res)
	}
	select {
	case r := <-big:
		if r.err != nil || r.res.Signal != "SIGKILL" || !r.res.OOMKilled {
			t.Errorf("the big command: %+v %v, want killed by SIGKILL, oom_killed", r.res, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the big command still runs after the oom-kill")
	}
	select {
	case r := <-small:
		t.Fatalf("the small command ended with the big one: %+v %v", r.res, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	cancelSmall()
	select {
	case r := <-small:
		if r.res.OOMKilled {
			t.Errorf("the small command was oom-killed: %+v", r.res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the small command still runs 10 s after its call was canceled")
	}
}
