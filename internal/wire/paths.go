package wire

import (
	"net/url"
	"strconv"
)

// NDJSON is the media type of a streamed reply: one JSON object a line.
const NDJSON = "application/x-ndjson"

// SizeHeader carries a file's total size on GET /v1/sandboxes/{id}/files.
const SizeHeader = "X-Agentbox-File-Size"

// The terminal's limits: the size a terminal may have, the most terminal bytes one message
// carries, and the most one message a client sends may hold.
const (
	MaxPTYRows    = 1000
	MaxPTYCols    = 1000
	MaxPTYData    = 32 << 10
	MaxPTYMessage = MaxPTYData + 1024
)

// PoolPath is the REST path of pool name.
func PoolPath(name string) string { return "/v1/pools/" + url.PathEscape(name) }

// RemoteJobPath is the REST path of a machine's jobs, or of one job (id) and below (rest).
func RemoteJobPath(machine, id, rest string) string {
	p := "/v1/machines/" + url.PathEscape(machine) + "/jobs"
	if id != "" {
		p += "/" + url.PathEscape(id) + rest
	}
	return p
}

// PTYRequest opens an interactive terminal in a sandbox (GET /v1/sandboxes/{id}/pty's query).
type PTYRequest struct {
	// Argv is the command; empty runs the user's login shell.
	Argv []string
	Env  map[string]string
	Cwd  string
	// User is "" (the sandbox default) or "root".
	User string
	// Term is TERM (default xterm-256color).
	Term string
	// Rows and Cols are the initial size (1–1000 each; 0 × 0 is 24 × 80).
	Rows, Cols int
}

// PTYExit is how a terminal's command ended.
type PTYExit struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
}

// PTYQuery encodes a terminal request as the endpoint's query.
func PTYQuery(req PTYRequest) url.Values {
	q := url.Values{}
	for _, a := range req.Argv {
		q.Add("arg", a)
	}
	for k, v := range req.Env {
		q.Add("env", k+"="+v)
	}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("user", req.User)
	set("term", req.Term)
	set("cwd", req.Cwd)
	if req.Rows > 0 || req.Cols > 0 {
		q.Set("rows", strconv.Itoa(req.Rows))
		q.Set("cols", strconv.Itoa(req.Cols))
	}
	return q
}
