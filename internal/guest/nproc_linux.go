package guest

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pidsReserve is how many of the sandbox's pids (its cgroup's pids.max) are kept for the agent:
// the Go runtime dies when it cannot start a thread, so a fork bomb must never take them all.
const pidsReserve = 64

// ReservePids caps RLIMIT_NPROC (soft and hard, so no command can raise it back) below the
// sandbox's pids.max, leaving pidsReserve for the agent. Commands inherit the limit. In a user
// namespace the count is per sandbox and per user: a fork bomb of the agent user stops at the
// limit while the agent (root inside) keeps the cgroup's remaining pids. It does nothing when
// the sandbox has no pids limit (or it cannot be read, as under gVisor, which enforces its own).
func ReservePids(log *slog.Logger) {
	pidsMax := readPidsMax()
	if pidsMax <= 0 {
		return
	}
	limit := uint64(max(pidsMax-pidsReserve, pidsMax/2))
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		log.Warn("guest: cannot reserve pids for the agent", "err", err)
	}
}

func readPidsMax() int64 {
	for _, p := range []string{"/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err == nil && n > 0 {
			return n
		}
	}
	return 0
}

// LimitFileSize caps RLIMIT_FSIZE, soft and hard, at bytes (never raising it): no file the
// agent or a command writes grows past it (a write past it fails with EFBIG; a command that
// does not ignore SIGXFSZ dies of it), and without CAP_SYS_RESOURCE nothing it runs can raise
// it back. The local runtimes set the same limit through the OCI spec; a pod has no field for
// it, so the kubernetes runtime passes it to the agent (guest --fsize-mb).
func LimitFileSize(bytes int64) error {
	var cur unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &cur); err != nil {
		return fmt.Errorf("getrlimit FSIZE: %w", err)
	}
	limit := min(uint64(bytes), cur.Max)
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		return fmt.Errorf("setrlimit FSIZE %d: %w", limit, err)
	}
	return nil
}
