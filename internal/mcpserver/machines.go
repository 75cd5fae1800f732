package mcpserver

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/machine"
)

// Joined machines: machine_list, machine_status.

// MachineBackend is what the machine tools need: the registry in process (RegistryMachines),
// the REST client over a running serve.
type MachineBackend interface {
	ListMachines(ctx context.Context) ([]machine.Info, error)
	GetMachine(ctx context.Context, ref string) (machine.Info, error)
}

// RegistryMachines adapts a *machine.Registry to MachineBackend.
type RegistryMachines struct{ R *machine.Registry }

// ListMachines implements MachineBackend.
func (r RegistryMachines) ListMachines(ctx context.Context) ([]machine.Info, error) {
	return r.R.List(ctx)
}

// GetMachine implements MachineBackend.
func (r RegistryMachines) GetMachine(ctx context.Context, ref string) (machine.Info, error) {
	return r.R.Get(ctx, ref)
}

// MachineListOut is machine_list's reply.
type MachineListOut struct {
	Machines []machine.Info `json:"machines" jsonschema:"Every joined machine, by name: machine_id, name, aliases, online, platform (linux, darwin, windows), arch, agent_version, last_seen (the server's time of the machine's last heartbeat; null when it never sent one), gpus [{index, name, memory_total_mb, memory_used_mb, utilization_pct}] (last known while offline; -1 where nvidia-smi said N/A), created_at."`
	Count    int            `json:"count" jsonschema:"Number of machines."`
	Online   int            `json:"online" jsonschema:"How many are connected now."`
}

// MachineRefIn is machine_status's arguments.
type MachineRefIn struct {
	Machine string `json:"machine" jsonschema:"The machine's id (mc-…), name or alias (see machine_list)."`
}

const machineDoc = `A joined machine is a computer its owner enrolled with ` + "`agentbox join URL --token T`" + `; it dials the server (no inbound port) and stays connected, reconnecting by itself. online: it is connected now. last_seen is when the server received its last heartbeat (every few seconds while online); it is null before the first and is never the time of your query, so an offline machine's last_seen says how long ago it was last heard from. gpus are its NVIDIA GPUs as nvidia-smi last reported them (kept while it is offline: they may be stale; empty when it has none or no nvidia-smi). Check platform before sending commands: shells and paths differ on windows and darwin.`

func (s *Server) addMachineTools() {
	addTool(s, &mcp.Tool{
		Name:  "machine_list",
		Title: "List joined machines",
		Description: `List the machines joined to this server. Takes no arguments.
` + machineDoc + `
Reply: {machines: [{machine_id, name, aliases, online, platform, arch, agent_version, last_seen, gpus: [{index, name, memory_total_mb, memory_used_mb, utilization_pct}], created_at}], count, online}.`,
		Annotations: &mcp.ToolAnnotations{Title: "List joined machines", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.machineList)
	addTool(s, &mcp.Tool{
		Name:  "machine_status",
		Title: "Show one joined machine",
		Description: `One joined machine by id, name or alias. Arguments: machine (required).
` + machineDoc + `
Reply: {machine_id, name, aliases, online, platform, arch, agent_version, last_seen, gpus, created_at}.
` + errorsDoc("MACHINE_NOT_FOUND (no machine of that id, name or alias: see machine_list)"),
		Annotations: &mcp.ToolAnnotations{Title: "Show one joined machine", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.machineStatus)
}

func (s *Server) machines() (MachineBackend, error) {
	if s.opts.Machines == nil {
		return nil, errcode.New(errcode.UnsupportedOp, "this MCP server has no joined machines: they join `agentbox serve`; run `agentbox mcp` against it")
	}
	return s.opts.Machines, nil
}

func (s *Server) machineList(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (MachineListOut, string, error) {
	mb, err := s.machines()
	if err != nil {
		return MachineListOut{}, "", err
	}
	l, err := mb.ListMachines(ctx)
	if err != nil {
		return MachineListOut{}, "", err
	}
	out := MachineListOut{Machines: l, Count: len(l)}
	for _, m := range l {
		if m.Online {
			out.Online++
		}
	}
	return out, "", nil
}

func (s *Server) machineStatus(ctx context.Context, _ *mcp.CallToolRequest, in MachineRefIn) (machine.Info, string, error) {
	mb, err := s.machines()
	if err != nil {
		return machine.Info{}, "", err
	}
	if in.Machine == "" {
		return machine.Info{}, "", errcode.New(errcode.InvalidArgument, "machine: give a machine's id, name or alias (see machine_list)")
	}
	m, err := mb.GetMachine(ctx, in.Machine)
	return m, "", err
}
