package hostlock_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/hostlock"
)

// TestAcquire: a lock held by another process is refused naming that process's pid, all or
// none (the first of two names is not left held); released or its holder dead, it is free.
func TestAcquire(t *testing.T) {
	if os.Getenv("HOSTLOCK_HOLD") != "" {
		l, err := hostlock.Acquire(os.Getenv("HOSTLOCK_DIR"), "thing", os.Getenv("HOSTLOCK_HOLD"))
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		fmt.Println("HELD")
		time.Sleep(time.Minute)
		l.Release()
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAcquire$")
	cmd.Env = append(os.Environ(), "HOSTLOCK_HOLD=b", "HOSTLOCK_DIR="+dir)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf) != "HELD\n" {
		t.Fatalf("holder: %q %v", buf, err)
	}
	_, err := hostlock.Acquire(dir, "thing", "a", "b")
	if !errors.Is(err, hostlock.ErrHeld) || !strings.Contains(err.Error(), fmt.Sprintf("thing b is held by another agentbox server (pid %d", cmd.Process.Pid)) ||
		!strings.Contains(err.Error(), filepath.Join(dir, "b.lock")) {
		t.Fatalf("held elsewhere: %v", err)
	}
	a, err := hostlock.Acquire(dir, "thing", "a")
	if err != nil {
		t.Fatalf("a was left held by the refused Acquire: %v", err)
	}
	if _, err := hostlock.Acquire(dir, "thing", "a"); !errors.Is(err, hostlock.ErrHeld) {
		t.Fatalf("a second lock of a in one process: %v", err)
	}
	a.Release()
	cmd.Process.Kill()
	cmd.Wait()
	l, err := hostlock.Acquire(dir, "thing", "a", "b")
	if err != nil {
		t.Fatalf("after release and the holder's death: %v", err)
	}
	l.Release()
	if _, err := hostlock.Acquire(dir, "thing", "../x"); err == nil {
		t.Fatal("a path was taken for a name")
	}
}
