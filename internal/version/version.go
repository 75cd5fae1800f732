// Package version names this build of agentbox.
package version

// Version is agentbox's release version.
const Version = "0.1.0"
