package hostlock_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/hostlock"
)

// TestAcquire: a lock held by another process is refused naming that process's pid, all or
// none (the first of two names is not left held); released or its holder dead, it is free; a
// released lock's file is gone.
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
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("released locks left %v", ents)
	}
	if _, err := hostlock.Acquire(dir, "thing", "../x"); err == nil {
		t.Fatal("a path was taken for a name")
	}
}

// TestAcquireRace: acquirers racing with releases (which remove the file) never hold one name
// twice at once.
func TestAcquireRace(t *testing.T) {
	dir := t.TempDir()
	var holders, most, taken atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 300 {
				l, err := hostlock.Acquire(dir, "thing", "x")
				if err != nil {
					if !errors.Is(err, hostlock.ErrHeld) {
						t.Error(err)
						return
					}
					continue
				}
				taken.Add(1)
				n := holders.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(20 * time.Microsecond) // let another open the file this one removes
				holders.Add(-1)
				l.Release()
			}
		})
	}
	wg.Wait()
	if most.Load() != 1 || taken.Load() == 0 {
		t.Fatalf("at most %d holders at once (%d acquisitions); want 1", most.Load(), taken.Load())
	}
}
