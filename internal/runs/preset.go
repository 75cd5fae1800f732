package runs

// The agent presets of agent_compare/agent_test: the conventions of one coding agent (where
// its checkout goes, how it is built, how it is given a task). Generic runs know nothing of
// them; they live only here.

// Where agent_compare/agent_test put things inside each run's sandbox.
const (
	// CompareTargetDir is the target repository's checkout and every phase's working
	// directory (the agent runs there).
	CompareTargetDir = "/workspace/target"
	// GenericAgentDir is the agent's checkout without a preset.
	GenericAgentDir = "/workspace/agent"
)

// PresetOMP is the oh-my-pi preset (the seed behaviour of AIec's OMP adapter).
const PresetOMP = "omp"

// agentPreset is one agent's conventions.
type agentPreset struct {
	// AgentDir is where the agent's repository is checked out (and built).
	AgentDir string
	// Build is the default build command, run in AgentDir.
	Build []string
	// Invocation is the default command given the task (one literal argument, never a shell
	// string), run in CompareTargetDir.
	Invocation func(task string) []string
}

// presets by name ("" is the generic form: no defaults, agent_command and build_command
// required).
var presets = map[string]agentPreset{
	PresetOMP: {
		AgentDir: "/workspace/omp",
		Build:    []string{"sh", "-c", "bun install && bun run build"},
		Invocation: func(task string) []string {
			return []string{"/bin/sh", "/workspace/omp/packages/coding-agent/scripts/omp", "--print", "--", task}
		},
	},
}

// Environment variables that carry the task to an agent_command override (which also gets it
// on stdin).
const (
	EnvOMPTask   = "OMP_TASK"
	EnvAgentTask = "AGENT_TASK"
)
