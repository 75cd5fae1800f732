package wire

import (
	"time"
)

// FileInfo describes one file in a sandbox.
type FileInfo struct {
	Path string `json:"path"`
	Name string `json:"name"`
	// Type is "file", "dir", "symlink" or "other".
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is the permission bits in octal, e.g. "0644".
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"mod_time"`
	// LinkTarget is set for symlinks.
	LinkTarget string `json:"link_target,omitempty"`
}

// DirList is a bounded directory listing, sorted by name.
type DirList struct {
	Path      string     `json:"path"`
	Entries   []FileInfo `json:"entries"`
	Truncated bool       `json:"truncated"`
	Total     int        `json:"total"`
}
