package mcpserver

import (
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// Text renderings of tool results: what a client that shows only text content gives the model.
// They carry the data a model needs (ids, states, output), not every field.

func summary(in SandboxInfo) string {
	parts := []string{in.State}
	parts = append(parts, fmt.Sprintf("%s on %s, %s isolation, %g cpu, %d MiB memory", in.Image, in.Runtime, in.Isolation, in.CPU, in.MemoryMB))
	if !finished(stateOf(in)) {
		parts = append(parts, "expires in "+(time.Duration(in.ExpiresInSeconds)*time.Second).String())
	}
	if in.Reason != "" {
		parts = append(parts, "reason: "+in.Reason)
	}
	return strings.Join(parts, "; ")
}

func stateOf(in SandboxInfo) sandbox.State { return sandbox.State(in.State) }

func summaryLine(in SandboxInfo) string { return in.SandboxID + ": " + summary(in) }

func renderList(l SandboxList) string {
	if l.Count == 0 {
		return "No sandboxes held by this server. Create one with sandbox_create."
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d sandbox(es):\n", l.Count)
	ended := 0
	for _, sb := range l.Sandboxes {
		b.WriteString(summaryLine(sb) + "\n")
		if finished(stateOf(sb)) {
			ended++
		}
	}
	if ended > 0 {
		fmt.Fprintf(&b, "(%d finished sandbox(es) are reported this once and will not be listed again.)\n", ended)
	}
	return strings.TrimRight(b.String(), "\n")
}

func renderHealth(h HealthOut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "agentbox %s: %s", h.Version, h.Status)
	if h.ControlPlane != "" {
		fmt.Fprintf(&b, " (%s)", h.ControlPlane)
	}
	b.WriteString("\n")
	for _, r := range h.Runtimes {
		avail := "available"
		if !r.Available {
			avail = "unavailable: " + r.Reason
		}
		fmt.Fprintf(&b, "runtime %s: %s isolation, %s\n", r.Name, r.Isolation, avail)
	}
	c := h.Capacity
	budget := func(used, total float64, unit string) string {
		if total <= 0 {
			return fmt.Sprintf("%g%s used (unbounded)", used, unit)
		}
		return fmt.Sprintf("%g of %g%s used", used, total, unit)
	}
	fmt.Fprintf(&b, "capacity: %d of %d sandboxes live, %d free; cpu %s; memory %s; disk %s\n",
		c.Live, c.MaxSandboxes, c.Free, budget(c.CPUUsed, c.CPUBudget, " cores"), budget(float64(c.MemoryUsedMB), float64(c.MemoryBudgetMB), " MiB"),
		budget(float64(c.DiskUsedMB), float64(c.DiskBudgetMB), " MiB"))
	b.WriteString(renderList(SandboxList{Sandboxes: h.Sandboxes, Count: h.Count}))
	return b.String()
}

func renderExec(o ExecOut, maxOut int64) string {
	var b strings.Builder
	switch {
	case o.TimedOut:
		fmt.Fprintf(&b, "timed out after %d ms: the command was killed (exit_code %d)\n", o.DurationMs, o.ExitCode)
	case o.OOMKilled:
		fmt.Fprintf(&b, "out of memory: the sandbox reached its memory_mb and the command was killed by %s (exit_code %d) after %d ms\n", o.Signal, o.ExitCode, o.DurationMs)
	case o.Signal != "":
		fmt.Fprintf(&b, "killed by %s (exit_code %d) after %d ms\n", o.Signal, o.ExitCode, o.DurationMs)
	default:
		fmt.Fprintf(&b, "exit_code %d (%d ms)\n", o.ExitCode, o.DurationMs)
	}
	section := func(name, text string, total int64) {
		if total == 0 {
			fmt.Fprintf(&b, "%s: (empty)\n", name)
			return
		}
		if int64(len(text)) < total {
			fmt.Fprintf(&b, "%s (%d of %d bytes kept):\n", name, len(text), total)
		} else {
			fmt.Fprintf(&b, "%s:\n", name)
		}
		b.WriteString(text)
		if !strings.HasSuffix(text, "\n") {
			b.WriteString("\n")
		}
	}
	section("stdout", o.Stdout, o.StdoutBytes)
	section("stderr", o.Stderr, o.StderrBytes)
	if o.Truncated {
		if maxOut == 0 {
			maxOut = 1 << 20
		}
		fmt.Fprintf(&b, "output was truncated at %d bytes per stream: redirect it to a file and page through it with file_read, or filter it (grep, tail)\n", maxOut)
	}
	return strings.TrimRight(b.String(), "\n")
}

func renderRead(o FileReadOut) string {
	head := fmt.Sprintf("%s: bytes %d-%d of %d", o.Path, o.Offset, o.Offset+o.Bytes, o.Size)
	if !o.EOF {
		head += fmt.Sprintf(" (more: next_offset %d)", o.NextOffset)
	}
	if o.Content != nil {
		return head + "\n" + *o.Content
	}
	return head + " (binary, base64):\n" + *o.ContentBase64
}

func renderDir(o FileListOut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d entries", o.Path, o.Total)
	if o.Truncated {
		fmt.Fprintf(&b, " (first %d shown)", len(o.Entries))
	}
	b.WriteString("\n")
	for _, e := range o.Entries {
		switch e.Type {
		case "dir":
			fmt.Fprintf(&b, "%s %s/\n", e.Mode, e.Name)
		case "symlink":
			fmt.Fprintf(&b, "%s %s -> %s\n", e.Mode, e.Name, e.LinkTarget)
		default:
			fmt.Fprintf(&b, "%s %s (%d bytes)\n", e.Mode, e.Name, e.Size)
		}
	}
	return strings.TrimRight(b.String(), "\n")
}
