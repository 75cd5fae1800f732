package oci

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// TestAwaitSave: a checkpoint command of a sandbox (a process whose command line names this
// runtime's --root, the checkpoint verb and the id last, as a dead server's `runsc checkpoint`
// does) is waited for until it ends; another sandbox's, or none, is not waited for.
func TestAwaitSave(t *testing.T) {
	rt := newRunc(t)
	const id, other = "sb-0123456789ab", "sb-ba9876543210"
	// sh -c SCRIPT NAME ARGS…: the shell's own command line carries the rest. It runs until its
	// stdin is closed, so nothing here depends on how fast a loaded host is.
	cmd := exec.Command("sh", "-c", "read x; true", "runsc", "--root", rt.stateDir(), "checkpoint", "--image-path", "/nonexistent", id)
	end, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	defer func() { cmd.Process.Kill(); <-done }()
	for deadline := time.Now().Add(5 * time.Second); !rt.saveInFlight(id); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the checkpoint command is never seen in flight")
		}
	}
	if err := rt.AwaitSave(t.Context(), other); err != nil || exited(done, cmd.Process.Pid) {
		t.Fatalf("AwaitSave of another sandbox = %v; want nil without waiting for this checkpoint (ended: %v)", err, exited(done, cmd.Process.Pid))
	}
	awaited := make(chan error, 1)
	go func() { awaited <- rt.AwaitSave(t.Context(), id) }()
	select {
	case err := <-awaited:
		t.Fatalf("AwaitSave returned (%v) with the checkpoint still running", err)
	case <-time.After(100 * time.Millisecond):
	}
	end.Close() // the checkpoint ends
	if err := <-awaited; err != nil {
		t.Fatal(err)
	}
	// Ended: reaped (done), or a zombie not yet reaped by cmd.Wait's goroutine (its cmdline,
	// which AwaitSave reads, is empty from its exit on).
	if !exited(done, cmd.Process.Pid) {
		t.Fatal("AwaitSave returned with the checkpoint still running")
	}
	if rt.saveInFlight(id) {
		t.Fatal("still in flight after AwaitSave")
	}
}

// TestFinishReleaseRefusals: a running sandbox's release is not finished (CONFLICT), and one
// with no disk anywhere is not finished (ok false), nothing written.
func TestFinishReleaseRefusals(t *testing.T) {
	rt := newRunc(t)
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	runtimetest.Start(t, rt, spec)
	id := spec.ID
	dir := t.TempDir()
	if _, ok, err := rt.FinishRelease(t.Context(), id, dir, runtime.IDMap{}); ok || errcode.Of(err) != errcode.Conflict {
		t.Fatalf("FinishRelease of a running sandbox = %v, %v; want CONFLICT", ok, err)
	}
	if _, ok, err := rt.FinishRelease(t.Context(), "sb-000000000000", dir, runtime.IDMap{}); ok || err != nil {
		t.Fatalf("FinishRelease with no disk = %v, %v; want not ok, no error", ok, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("FinishRelease refused but wrote %v", ents)
	}
}

// exited reports whether child pid has ended: done is closed (reaped), or its /proc entry is
// gone or a zombie's.
func exited(done <-chan struct{}, pid int) bool {
	select {
	case <-done:
		return true
	default:
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')') // the command name may hold spaces and parentheses
	return i > 0 && len(b) > i+2 && b[i+2] == 'Z'
}
