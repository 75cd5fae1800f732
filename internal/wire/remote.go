package wire

import "time"

// The replies and requests of joined machines: the machines themselves, remote exec, screenshots
// and the file relay (blobs).

// GPU is one of a joined machine's GPUs as it last reported it (-1 where nvidia-smi said N/A).
type GPU struct {
	Index          int    `json:"index"`
	Name           string `json:"name"`
	MemoryTotalMB  int64  `json:"memory_total_mb"`
	MemoryUsedMB   int64  `json:"memory_used_mb"`
	UtilizationPct int    `json:"utilization_pct"`
}

// Machine is a joined machine as replies carry it (never its public key).
type Machine struct {
	ID      string   `json:"machine_id"`
	Name    string   `json:"name"`
	Aliases []string `json:"aliases"`
	// Platform (linux, darwin, windows), Arch (GOARCH), AgentVersion and GPUs are what the
	// machine last reported; GPUs are kept while it is offline.
	Platform     string `json:"platform"`
	Arch         string `json:"arch"`
	AgentVersion string `json:"agent_version"`
	GPUs         []GPU  `json:"gpus"`
	// LastSeen is when the server received the machine's last heartbeat; nil before the first.
	LastSeen  *time.Time `json:"last_seen"`
	CreatedAt time.Time  `json:"created_at"`
	// RemovedAt is set when the machine was removed: its key is refused from then on.
	RemovedAt *time.Time `json:"removed_at,omitempty"`
	// Online says the machine's connection is up on this server.
	Online bool `json:"online"`
}

// MachineList is the reply of GET /v1/machines.
type MachineList struct {
	Machines []Machine `json:"machines"`
}

// AliasRequest is the body of POST /v1/machines/{ref}/aliases.
type AliasRequest struct {
	Alias string `json:"alias"`
}

// AgentInfo is the reply of GET /v1/machines/{ref}/agent: who the machine's agent is.
type AgentInfo struct {
	Hostname     string    `json:"hostname"`
	Platform     string    `json:"platform"`
	Arch         string    `json:"arch"`
	AgentVersion string    `json:"agent_version"`
	PID          int       `json:"pid"`
	StartedAt    time.Time `json:"started_at"`
}

// RemoteExecRequest is the body of POST /v1/machines/{ref}/exec.
type RemoteExecRequest struct {
	// Command is the script, in the dialect Shell names.
	Command string `json:"command"`
	// Shell: sh | bash on POSIX, cmd | powershell on Windows; "" for the machine's default.
	Shell string `json:"shell,omitempty"`
	// Env is added to (and overrides) the agent's environment. Refused with Elevated.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the absolute directory the command runs in; "": the agent's.
	Cwd string `json:"cwd,omitempty"`
	// TimeoutMS bounds the run: 1,000–3,600,000; nil for the server's default.
	TimeoutMS *int64 `json:"timeout_ms,omitempty"`
	// Elevated runs the command as root (or, on Windows, only when the agent runs elevated).
	Elevated bool `json:"elevated,omitempty"`
}

// Why a remote exec's result is partial.
const (
	RemoteExecTimeout      = "timeout"
	RemoteExecDisconnected = "disconnected"
)

// RemoteExecResult is the reply of POST /v1/machines/{ref}/exec.
type RemoteExecResult struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// ExitCode is nil when unknown (cut short); 128+N for a command killed by signal N.
	ExitCode *int `json:"exit_code"`
	Partial  bool `json:"partial"`
	// Truncated: the command wrote more than the server keeps; TotalBytes is how much it wrote.
	Truncated  bool  `json:"truncated"`
	TotalBytes int64 `json:"total_bytes"`
	DurationMS int64 `json:"duration_ms"`
	// Reason says why a partial result is partial: RemoteExecTimeout or RemoteExecDisconnected.
	Reason string `json:"reason,omitempty"`
	// Shell is the dialect the script ran in.
	Shell string `json:"shell,omitempty"`
}

// Screenshot is the reply of GET /v1/machines/{ref}/screenshot: the shot (its PNG in base64)
// and its caption.
type Screenshot struct {
	PNG []byte `json:"png"`
	// Display names what was captured (":1" on X11, "1" on macOS, "\\.\DISPLAY1" on Windows).
	Display string `json:"display"`
	// Screen is the index of the screen (monitor) captured, of Screens.
	Screen  int `json:"screen"`
	Screens int `json:"screens"`
	// Displays lists the displays the machine has, when known.
	Displays []string  `json:"displays,omitempty"`
	Width    int       `json:"width"`
	Height   int       `json:"height"`
	TakenAt  time.Time `json:"taken_at"`
	Platform string    `json:"platform"`
	// Caption says what the image is: which display, how many, the resolution, when.
	Caption string `json:"caption"`
}

// Blob is a blob of the file relay as replies carry it (POST /v1/blobs, a remote pull).
type Blob struct {
	BlobID string `json:"blob_id"`
	// URL downloads the blob without any other credential until LinkExpiresAt.
	URL       string    `json:"url"`
	Size      int64     `json:"size"`
	SHA256    string    `json:"sha256"`
	Name      string    `json:"name"`
	ExpiresAt time.Time `json:"expires_at"` // when the blob is deleted
	// LinkExpiresAt is when URL stops working.
	LinkExpiresAt time.Time `json:"link_expires_at"`
	Source        string    `json:"source"`
	MachineID     string    `json:"machine_id,omitempty"`
	Path          string    `json:"path,omitempty"`
}

// BlobPush is the reply of POST /v1/machines/{ref}/push: the file a blob was written to.
type BlobPush struct {
	BlobID    string `json:"blob_id"`
	MachineID string `json:"machine_id"`
	Machine   string `json:"machine"`
	DestPath  string `json:"dest_path"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
	// Mode is the written file's permission bits (octal); Replaced says whether a file or
	// symlink stood there before; Owner is the replaced file's uid:gid when it was kept.
	Mode     string `json:"mode"`
	Replaced bool   `json:"replaced"`
	Owner    string `json:"owner,omitempty"`
}

// RemotePullRequest is the body of POST /v1/machines/{ref}/pull.
type RemotePullRequest struct {
	Path string `json:"path"`
}

// RemotePushRequest is the body of POST /v1/machines/{ref}/push.
type RemotePushRequest struct {
	BlobID   string `json:"blob_id"`
	DestPath string `json:"dest_path"`
}
