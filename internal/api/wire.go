package api

import (
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/remotejobs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/screenshot"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/watch"
	"github.com/agentbox/agentbox/internal/wire"
)

// The conversions from the domain and store types to the wire types of the replies
// (internal/wire): a store row is never a reply, so a field added to a record is not published
// until it is added here.

// SandboxList is the reply of GET /v1/sandboxes.
type SandboxList = wire.SandboxList

// wireSandbox is a sandbox's record as replies carry it: the names of its environment variables
// and secrets, never their values; no runtime handle.
func wireSandbox(sb sandbox.Sandbox) wire.Sandbox {
	return wire.Sandbox{
		ID: sb.ID, State: wire.State(sb.State), Image: sb.Image, ImageDigest: sb.ImageDigest,
		Runtime: sb.Runtime, Isolation: sb.Isolation, CPU: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB, PidsLimit: sb.PidsLimit,
		EnvNames: sb.EnvVarNames(), Labels: sb.Labels,
		CreatedAt: sb.CreatedAt, UpdatedAt: sb.UpdatedAt, ExpiresAt: sb.ExpiresAt,
		Error: sb.Error, Hardening: sb.Hardening, Owner: sb.Owner, IdempotencyKey: sb.IdempotencyKey, Node: sb.Node,
		Network: wireNetwork(sb.Network), SecretNames: sb.SecretVarNames(),
		FromSnapshot: sb.FromSnapshot, AutoWake: sb.AutoWake, TTLWhileSleeping: sb.TTLWhileSleeping,
		OnExpiry: sb.OnExpiry, TTLSeconds: sb.TTLSeconds,
		SleepSnapshot: sb.SleepSnapshot, SleptAt: sb.SleptAt, FromPool: sb.FromPool, Pool: sb.Pool, Version: sb.Version,
	}
}

// wireSandboxes converts a list (never nil: an empty list is [] on the wire).
func wireSandboxes(l []sandbox.Sandbox) []wire.Sandbox {
	out := make([]wire.Sandbox, len(l))
	for i, sb := range l {
		out[i] = wireSandbox(sb)
	}
	return out
}

// wireJoinToken is a join token's record as replies carry it (the store keeps only its hash).
func wireJoinToken(t store.JoinToken) wire.JoinToken {
	return wire.JoinToken{ID: t.ID, Prefix: t.Prefix, CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt,
		Uses: t.Uses, UsesLeft: t.UsesLeft, RevokedAt: t.RevokedAt}
}

// wireRuntimes are the runtimes' capabilities as replies carry them.
func wireRuntimes(l []runtime.Capabilities) []wire.Capabilities {
	if l == nil {
		return nil
	}
	out := make([]wire.Capabilities, len(l))
	for i, c := range l {
		out[i] = wire.Capabilities{Name: c.Name, Available: c.Available, Reason: c.Reason, Version: c.Version,
			Isolation: string(c.Isolation), CgroupMode: c.CgroupMode, Images: c.Images, OCIImageReason: c.OCIImageReason,
			NetworkModes: c.NetworkModes, EgressReason: c.EgressReason, TransparentEgressReason: c.TransparentEgressReason,
			Hardening: c.Hardening, UserNamespaces: c.UserNamespaces, IDMappedFiles: c.IDMappedFiles,
			HostIDPerSandbox: c.HostIDPerSandbox, Snapshots: c.Snapshots, MemorySnapshotReason: c.MemorySnapshotReason}
	}
	return out
}

func wireNetwork(n sandbox.Network) wire.Network {
	if n.Policy == nil {
		return wire.Network{}
	}
	return wire.Network{Policy: &wire.Policy{Allow: n.Policy.Allow, Deny: n.Policy.Deny}}
}

// wireMachine is a joined machine as replies carry it (never its public key).
func wireMachine(i machine.Info) wire.Machine {
	m := i.Machine
	var gpus []wire.GPU
	if m.GPUs != nil {
		gpus = make([]wire.GPU, len(m.GPUs))
		for j, g := range m.GPUs {
			gpus[j] = wire.GPU(g)
		}
	}
	return wire.Machine{ID: m.ID, Name: m.Name, Aliases: m.Aliases, Platform: m.Platform, Arch: m.Arch,
		AgentVersion: m.AgentVersion, GPUs: gpus, LastSeen: m.LastSeen, CreatedAt: m.CreatedAt, RemovedAt: m.RemovedAt,
		Online: i.Online}
}

// wireMachines converts a list (nil stays nil: the reply said null before).
func wireMachines(l []machine.Info) []wire.Machine {
	if l == nil {
		return nil
	}
	out := make([]wire.Machine, len(l))
	for i, m := range l {
		out[i] = wireMachine(m)
	}
	return out
}

// wireScreenshot is a shot and its caption.
func wireScreenshot(s *screenshot.Shot) wire.Screenshot {
	return wire.Screenshot{PNG: s.PNG, Display: s.Display, Screen: s.Screen, Screens: s.Screens, Displays: s.Displays,
		Width: s.Width, Height: s.Height, TakenAt: s.TakenAt, Platform: s.Platform, Caption: s.Caption()}
}

// wireRemoteJobList is a machine's jobs as the reply carries them.
func wireRemoteJobList(l remotejobs.List) wire.RemoteJobList {
	out := wire.RemoteJobList{Omitted: l.Omitted}
	if l.Jobs != nil {
		out.Jobs = make([]wire.RemoteJob, len(l.Jobs))
		for i, j := range l.Jobs {
			out.Jobs[i] = wire.RemoteJob(j)
		}
	}
	return out
}

// wireEvent is a recorded event as replies and watch streams carry it.
func wireEvent(e sandbox.Event) wire.Event {
	return wire.Event{Seq: e.Seq, SandboxID: e.SandboxID, Type: e.Type, From: wire.State(e.From), To: wire.State(e.To),
		Reason: e.Reason, At: e.At}
}

// wireEvents converts a list (nil stays nil).
func wireEvents(l []sandbox.Event) []wire.Event {
	if l == nil {
		return nil
	}
	out := make([]wire.Event, len(l))
	for i, e := range l {
		out[i] = wireEvent(e)
	}
	return out
}

// wireWatchMessage is one message of a watch stream as the server-sent event's data carries it.
func wireWatchMessage(m watch.Message) wire.WatchMessage {
	out := wire.WatchMessage{SandboxID: m.SandboxID, Stream: m.Stream, Kind: m.Kind, Seq: m.Seq, At: m.At,
		State: wire.State(m.State), JobID: m.JobID, Data: m.Data, Offset: m.Offset, Metrics: m.Metrics,
		Missed: m.Missed, Reason: m.Reason}
	if m.Event != nil {
		e := wireEvent(*m.Event)
		out.Event = &e
	}
	if m.Connection != nil {
		c := wireConnection(*m.Connection)
		out.Connection = &c
	}
	return out
}
