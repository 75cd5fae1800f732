package config

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// ServerInfo is what a running server publishes in its state dir so that clients on the same
// machine (the CLI, `agentbox mcp`) can find it.
type ServerInfo struct {
	URL string `json:"url"`
	PID int    `json:"pid"`
	// TLS: the SHA-256 fingerprint of the server's certificate, and the file of a
	// self-signed one, which local clients pin and trust without being told.
	TLSFingerprint string `json:"tls_fingerprint,omitempty"`
	TLSCert        string `json:"tls_cert,omitempty"`
}

// LocalServerInfo returns the ServerInfo a server on this machine published for url (in the
// default state dirs or stateDir), if one did.
func LocalServerInfo(url string, stateDirs ...string) (ServerInfo, bool) {
	for _, dir := range append(stateDirs, DefaultStateDir(), "/var/lib/agentbox") {
		if info, err := ReadServerInfo(dir); err == nil && info.URL != "" && info.URL == url {
			return info, true
		}
	}
	return ServerInfo{}, false
}

// ServerInfoPath is where a server of stateDir publishes its ServerInfo.
func ServerInfoPath(stateDir string) string { return filepath.Join(stateDir, "server.json") }

// WriteServerInfo publishes info atomically.
func WriteServerInfo(stateDir string, info ServerInfo) error {
	b, _ := json.Marshal(info)
	tmp := ServerInfoPath(stateDir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, ServerInfoPath(stateDir))
}

// ReadServerInfo reads a published ServerInfo.
func ReadServerInfo(stateDir string) (ServerInfo, error) {
	var info ServerInfo
	b, err := os.ReadFile(ServerInfoPath(stateDir))
	if err != nil {
		return info, err
	}
	err = json.Unmarshal(b, &info)
	return info, err
}

// ServerURL is the URL a client should use: AGENTBOX_URL, else the server published in the
// default state dir, else the default address.
func ServerURL() string {
	if u := os.Getenv("AGENTBOX_URL"); u != "" {
		return u
	}
	for _, dir := range []string{DefaultStateDir(), "/var/lib/agentbox"} {
		if info, err := ReadServerInfo(dir); err == nil && info.URL != "" {
			return info.URL
		}
	}
	return "http://" + DefaultListen
}
