package wire

import (
	"time"
)

// ConnectionList is a page of a sandbox's connection records, oldest first.
type ConnectionList struct {
	SandboxID   string       `json:"sandbox_id"`
	Connections []Connection `json:"connections"`
	// Next is the cursor for the following page (pass it as after).
	Next int64 `json:"next"`
	// Omitted counts older records not returned when no cursor was given.
	Omitted int64 `json:"omitted,omitempty"`
}

// SecretCallList is a page of a sandbox's secret swaps, oldest first.
type SecretCallList struct {
	SandboxID string       `json:"sandbox_id"`
	Calls     []SecretCall `json:"calls"`
	Next      int64        `json:"next"`
	Omitted   int64        `json:"omitted,omitempty"`
}

// SecretCall is the record of one request that carried a secret's placeholder.
type SecretCall struct {
	SandboxID string    `json:"sandbox_id"`
	Seq       int64     `json:"seq"`
	Time      time.Time `json:"time"`
	Secret    string    `json:"secret"`
	Host      string    `json:"host"`
	Method    string    `json:"method"`
	Path      string    `json:"path"`
	// Replaced is false when the placeholder went to a host the secret does not list (it was
	// left as it was) or the value could not be resolved; Reason says which.
	Replaced bool `json:"replaced"`
	// Scrubbed is how many times the response carried the secret's value, each replaced by
	// its placeholder before it reached the sandbox.
	Scrubbed int64  `json:"scrubbed,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// Exposure is a port of a sandbox reachable as a preview URL.
type Exposure struct {
	SandboxID string `json:"sandbox_id"`
	Port      int    `json:"port"`
	Public    bool   `json:"public"`
	URL       string `json:"url"`
	// AccessToken is given once, in the reply of the expose that made it (private only).
	AccessToken string    `json:"access_token,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
}
