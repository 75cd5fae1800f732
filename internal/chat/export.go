package chat

import (
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/wire"
)

// Markdown renders a conversation as a Markdown transcript: its record, then every message
// (the system prompt folded away), tool calls with their arguments and results in code blocks.
func Markdown(d wire.ConversationDetail) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", orDash(d.Title))
	fmt.Fprintf(&b, "- conversation: `%s`\n- model: `%s` at %s\n", d.ID, d.Model, d.Endpoint)
	if d.SandboxID != "" {
		fmt.Fprintf(&b, "- sandbox: `%s`\n", d.SandboxID)
	}
	fmt.Fprintf(&b, "- messages: %d; tokens: %d prompt, %d completion\n- started %s, last message %s\n\n",
		d.Messages, d.PromptTokens, d.CompletionTokens, d.CreatedAt.UTC().Format(time.RFC3339), d.UpdatedAt.UTC().Format(time.RFC3339))
	for _, m := range d.Transcript {
		switch m.Role {
		case "system":
			fmt.Fprintf(&b, "<details><summary>system prompt</summary>\n\n%s\n\n</details>\n\n", m.Content)
		case "user":
			fmt.Fprintf(&b, "## User\n\n%s\n\n", m.Content)
		case "assistant":
			fmt.Fprintf(&b, "## Assistant")
			if m.DurationMS > 0 || m.CompletionTokens > 0 {
				fmt.Fprintf(&b, " (%d ms, %d+%d tokens)", m.DurationMS, m.PromptTokens, m.CompletionTokens)
			}
			b.WriteString("\n\n")
			if m.Content != "" {
				fmt.Fprintf(&b, "%s\n\n", m.Content)
			}
			for _, tc := range m.ToolCalls {
				fmt.Fprintf(&b, "**Tool call** `%s` (`%s`):\n\n%s\n", tc.Name, tc.ID, fence("json", tc.Arguments))
			}
		case "tool":
			status := "result"
			if m.IsError {
				status = "error"
			}
			fmt.Fprintf(&b, "**Tool %s** `%s` (`%s`, %d ms", status, m.Tool, m.ToolCallID, m.DurationMS)
			if m.Truncated {
				fmt.Fprintf(&b, ", cut from %d bytes", m.OutputBytes)
			}
			fmt.Fprintf(&b, "):\n\n%s\n", fence("", m.Content))
		}
	}
	return b.String()
}

// Text renders a conversation for the terminal (agentbox chat show).
func Text(d wire.ConversationDetail) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %s\nmodel %s at %s; sandbox %s; %d messages, %d+%d tokens\n\n", d.ID, d.Title, d.Model, d.Endpoint, orDash(d.SandboxID),
		d.Messages, d.PromptTokens, d.CompletionTokens)
	for _, m := range d.Transcript {
		switch m.Role {
		case "system":
			continue
		case "user":
			fmt.Fprintf(&b, "> %s\n", m.Content)
		case "assistant":
			if m.Content != "" {
				fmt.Fprintf(&b, "%s\n", m.Content)
			}
			for _, tc := range m.ToolCalls {
				fmt.Fprintf(&b, "→ %s %s\n", tc.Name, tc.Arguments)
			}
		case "tool":
			mark := "←"
			if m.IsError {
				mark = "✗"
			}
			fmt.Fprintf(&b, "%s %s: %s\n", mark, m.Tool, m.Content)
		}
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// fence puts s in a code block whose fence is longer than any run of backticks in it.
func fence(lang, s string) string {
	f := "```"
	for strings.Contains(s, f) {
		f += "`"
	}
	return f + lang + "\n" + strings.TrimRight(s, "\n") + "\n" + f + "\n"
}
