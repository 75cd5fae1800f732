// Package podpath names the paths inside a kubernetes sandbox's pod (the same as the local
// runtimes') and the agent user's uid: what the kubernetes runtime writes into its pods and
// what the agent's in-pod commands (internal/guestcmd, built into the lean agentbox-guest) read,
// without either importing the other.
package podpath

const (
	// BinDir is the directory the agent binary is installed in (an emptyDir or image volume).
	BinDir = "/.agentbox/bin"
	// Binary is the agent binary in the pod.
	Binary = BinDir + "/agentbox"
	// RunDir holds the agent's socket.
	RunDir = "/.agentbox/run"
	// Socket is the agent's unix socket.
	Socket = RunDir + "/agent.sock"
	// AgentUID is the user commands run as unless they name another (the local runtimes' agent).
	AgentUID = 1000
)
