package guest

import (
	"log/slog"
	"time"
)

// ServerConfig configures the in-sandbox agent.
type ServerConfig struct {
	// Socket is the unix socket path to listen on.
	Socket string
	// Workdir is the default working directory and base of relative paths (default /workspace).
	Workdir string
	Logger  *slog.Logger
	// ShutdownGrace is how long Run lets in-flight requests finish once its context ends before
	// it kills the commands still running and closes every connection (default 5 s).
	ShutdownGrace time.Duration
	// DefaultUser is who runs a command whose request names no user, and who owns the files
	// and directories the files API creates (so commands can change them). Nil runs commands
	// as the agent itself and leaves new files to it. Setting it needs the agent to run as
	// root: `agentbox guest` sets the sandbox's `agent` user (uid 1000) there.
	DefaultUser *User
	// Env is the base environment of commands, over the agent's own (a request's env still
	// overrides it). The real agent leaves it nil: its process environment is the sandbox's.
	Env map[string]string
	// Embedded runs the agent inside a host process that is not a sandbox (the fake runtime,
	// tests of the control plane) without changing that process: commands run as the
	// process's own user with no credential change and no exec tag even when it is root
	// (`user: "root"` is refused and DefaultUser must be nil), the agent waits only for the
	// commands it starts (one wait4 per command) instead of collecting every child of the
	// process, and it does not make the process a child subreaper. Orphans a command leaves go
	// to whoever reaps the process's orphans; a timeout or cancel kills the command's process
	// group only. The real agent (`agentbox guest`) never sets it.
	Embedded bool
	// JobsDir is where detached jobs keep their output and exit records (default
	// DefaultJobsDir, on the sandbox's disk; an embedded agent's default is a temp dir that
	// Run removes when it returns).
	JobsDir string
	// CommandCgroup, when set, is a cgroup v2 directory every command, job and terminal starts
	// in (clone3's CLONE_INTO_CGROUP), the agent itself staying outside it: its pids.max bounds
	// the commands' tasks without a fork bomb starving the agent. Linux only; the vm runtime's
	// init makes it (the container runtimes bound the sandbox's cgroup from the host instead).
	CommandCgroup string
}

// User is an account inside the sandbox that commands run as.
type User struct {
	Name string
	UID  uint32
	GID  uint32
	// Home is the user's HOME.
	Home string
}

// rootUser is the account of `user: "root"` requests.
func rootUser() User { return User{Name: "root", UID: 0, GID: 0, Home: "/root"} }
