// Package mountns starts a command in a mount namespace of its own, private from the host's, that
// a setup function has changed first (an overlay mounted, a file bound over another): what the
// command sees, the host never does, and nothing is left mounted when the command ends, however
// this process ends.
package mountns

import (
	"fmt"
	"os/exec"
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// Start starts cmd in a new mount namespace, private from the host's, that setup has changed.
// The namespace is made on a dedicated OS thread that the child is forked from and that exits
// afterwards, so neither this process nor the host sees it; it ends with the child.
func Start(cmd *exec.Cmd, setup func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the goroutine's end terminates the thread and its namespace.
		goruntime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread is never terminated (Go wedges it instead), and /proc/self is
			// its view: this process would see the private namespace's mounts from then on.
			// Keep the main thread pinned here, so that the retry lands on another thread.
			defer goruntime.UnlockOSThread()
			errc <- Start(cmd, setup)
			return
		}
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("unshare mount namespace: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errc <- fmt.Errorf("make mounts private: %w", err)
			return
		}
		if err := setup(); err != nil {
			errc <- err
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}
