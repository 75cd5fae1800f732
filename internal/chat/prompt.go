package chat

import (
	_ "embed"
	"strings"
)

// skill is docs/skills/agentbox/SKILL.md (TestSkillInSync keeps the copy equal): the skill
// that teaches a model agentbox's tools is the loop's system prompt too.
//
//go:embed skill.md
var skill string

// chatPreamble says what is particular to this loop.
const chatPreamble = `You are agentbox chat, an assistant that answers the user's questions by calling agentbox's
tools. This conversation has one sandbox of its own: tools that take a sandbox_id get it filled
in when you leave it out, and the sandbox is destroyed at the end, so do not create or destroy
sandboxes yourself unless asked. Prefer run_python for computing and data work, and execute_sql
for questions about agentbox's own records (audit_log, sandboxes, jobs, runs, conversations).
Answer briefly, with the numbers you found.

`

// DefaultSystemPrompt is the system prompt unless --system overrides it: the preamble and the
// agentbox skill (without its front matter).
func DefaultSystemPrompt() string {
	body := skill
	if strings.HasPrefix(body, "---\n") {
		if i := strings.Index(body[4:], "\n---\n"); i >= 0 {
			body = body[4+i+5:]
		}
	}
	return chatPreamble + strings.TrimSpace(body) + "\n"
}
