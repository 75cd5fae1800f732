// Package proto is the wire contract between a joined machine's agent and the server (issue
// 17): enrollment's request and reply, the connect handshake (a server nonce signed with the
// machine's ed25519 key), heartbeats, and the bounds both sides check. It imports nothing of
// the server, so the agent builds for every platform.
package proto

import (
	"crypto/ed25519"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/gpu"
)

// Paths on the server.
const (
	JoinPath    = "/v1/machines/join"
	ConnectPath = "/v1/machines/connect"
)

// Bounds on what a machine sends.
const (
	MaxNameLen      = 63       // a machine name or alias
	MaxFactLen      = 64       // platform, arch, agent version
	MaxTokenLen     = 128      // a join token
	MaxJoinBody     = 64 << 10 // POST /v1/machines/join's body
	MaxHandshakeMsg = 4 << 10  // one handshake message either way
	MaxHeartbeat    = 64 << 10 // one heartbeat line
	NonceLen        = 32
)

// JoinRequest enrolls a machine: the join token, the machine's public key (32 bytes, standard
// base64 in JSON), the name it asks for, and its platform facts.
type JoinRequest struct {
	Token     string `json:"token"`
	PublicKey []byte `json:"public_key"`
	Name      string `json:"name"`
	Facts
}

// JoinReply is the enrolled machine's id and name.
type JoinReply struct {
	MachineID string `json:"machine_id"`
	Name      string `json:"name"`
}

// Facts is what a machine reports about itself.
type Facts struct {
	Platform     string    `json:"platform"`
	Arch         string    `json:"arch"`
	AgentVersion string    `json:"agent_version"`
	GPUs         []gpu.GPU `json:"gpus"`
}

// Heartbeat is one line (JSON, newline-terminated) on the heartbeat stream the machine opens
// after connecting. SentAt is the machine's clock (informational; last_seen is the server's
// time of receipt).
type Heartbeat struct {
	Facts
	SentAt time.Time `json:"sent_at"`
}

// Challenge is the server's first handshake message.
type Challenge struct {
	Nonce []byte `json:"nonce"`
}

// Proof answers a Challenge: the machine's id and its signature of SignedBytes.
type Proof struct {
	MachineID string `json:"machine_id"`
	Signature []byte `json:"signature"`
}

// Welcome is the server's last handshake message: either the session starts (Error empty,
// then yamux runs over the connection) or the connection is refused (Code, Error say why;
// Removed when the machine was removed and may never connect again).
type Welcome struct {
	MachineID           string `json:"machine_id,omitempty"`
	HeartbeatIntervalMS int64  `json:"heartbeat_interval_ms,omitempty"`
	Code                string `json:"code,omitempty"`
	Error               string `json:"error,omitempty"`
	Removed             bool   `json:"removed,omitempty"`
}

// SignedBytes is what a machine signs to prove its identity: a fixed context string, its id
// and the server's nonce.
func SignedBytes(machineID string, nonce []byte) []byte {
	return append([]byte("agentbox machine connect v1\n"+machineID+"\n"), nonce...)
}

// Verify reports whether sig is pub's signature of SignedBytes(machineID, nonce).
func Verify(pub []byte, machineID string, nonce, sig []byte) bool {
	return len(pub) == ed25519.PublicKeySize && len(sig) == ed25519.SignatureSize &&
		ed25519.Verify(ed25519.PublicKey(pub), SignedBytes(machineID, nonce), sig)
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`)

// Platforms are the platforms a machine may report.
var Platforms = []string{"linux", "darwin", "windows"}

// reserved are names that would shadow a route under /v1/machines.
var reserved = []string{"join", "connect", "tokens"}

// CheckName reports whether s may be a machine's name or alias: 1–63 characters of lower-case
// letters, digits, '.', '_' and '-', starting and ending with a letter or digit, not an id
// (mc-…) and not a word the REST routes use.
func CheckName(what, s string) error {
	if len(s) > MaxNameLen || !nameRE.MatchString(s) {
		return fmt.Errorf("%s %q: 1–%d characters of lower-case letters, digits, '.', '_' and '-', starting and ending with a letter or digit", what, s, MaxNameLen)
	}
	if strings.HasPrefix(s, "mc-") || slices.Contains(reserved, s) {
		return fmt.Errorf("%s %q: names starting with \"mc-\" (machine ids) and %q are reserved", what, s, reserved)
	}
	return nil
}

// SanitizeName makes a host name into a valid machine name, or "" if nothing is left.
func SanitizeName(host string) string {
	host = strings.ToLower(host)
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	b := []byte{}
	for _, c := range []byte(host) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b = append(b, c)
		}
	}
	s := strings.Trim(string(b), "-_")
	if len(s) > MaxNameLen {
		s = strings.Trim(s[:MaxNameLen], "-_")
	}
	if CheckName("name", s) != nil {
		return ""
	}
	return s
}

// Check reports the first way f breaks the bounds: platform one of Platforms, arch and agent
// version 1–64 printable ASCII characters, GPUs within gpu.Check.
func (f Facts) Check() error {
	if !slices.Contains(Platforms, f.Platform) {
		return fmt.Errorf("platform %q: one of %v", f.Platform, Platforms)
	}
	for _, v := range []struct{ what, s string }{{"arch", f.Arch}, {"agent_version", f.AgentVersion}} {
		if v.s == "" || len(v.s) > MaxFactLen || !utf8.ValidString(v.s) || strings.IndexFunc(v.s, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			return fmt.Errorf("%s %q: 1–%d printable ASCII characters", v.what, v.s, MaxFactLen)
		}
	}
	if err := gpu.Check(f.GPUs); err != nil {
		return fmt.Errorf("gpus: %w", err)
	}
	return nil
}

// YamuxConfig is the session configuration both sides use: keepalives every 15 s, writes
// that stall 15 s end the session, and a 256 KiB stream window so that one bulk stream
// cannot starve interactive ones (shared/notes/deps.md §5).
func YamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 15 * time.Second
	c.ConnectionWriteTimeout = 15 * time.Second
	c.MaxStreamWindowSize = 256 << 10
	c.AcceptBacklog = 64
	c.StreamOpenTimeout = 30 * time.Second
	c.LogOutput = io.Discard
	return c
}
