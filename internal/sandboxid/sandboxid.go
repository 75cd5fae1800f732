// Package sandboxid is the one definition of a sandbox id: "sb-" and 12 lowercase hex digits.
// Every host resource of a sandbox (container, bundle, disk, cgroups) is named from its id, so
// every layer that takes an id from outside checks it with Valid before using it in a path; the
// control plane, the runtimes and the clients all share this package instead of copies of the
// pattern. It imports only errcode (Check's typed error).
package sandboxid

import (
	"crypto/rand"
	"encoding/hex"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Prefix starts every sandbox id.
const Prefix = "sb-"

// hexDigits is how many lowercase hex digits follow Prefix (6 random bytes).
const hexDigits = 12

// Len is the length of every sandbox id.
const Len = len(Prefix) + hexDigits

// New returns a fresh random sandbox id.
func New() string {
	var b [hexDigits / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return Prefix + hex.EncodeToString(b[:])
}

// Valid reports whether id has the shape New produces: Prefix and 12 lowercase hex digits,
// nothing else (so it is safe as one path component).
func Valid(id string) bool {
	if len(id) != Len || id[:len(Prefix)] != Prefix {
		return false
	}
	for _, c := range []byte(id[len(Prefix):]) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// maxQuoted is how much of a malformed id Check quotes back.
const maxQuoted = 64

// Check returns nil for an id that is Valid, and otherwise the one error every layer gives a
// malformed sandbox id: INVALID_ARGUMENT naming the argument (details.argument "sandbox_id")
// and the shape ids have, quoting the id (its first 64 bytes).
func Check(id string) error {
	if Valid(id) {
		return nil
	}
	if len(id) > maxQuoted {
		id = id[:maxQuoted] + "…"
	}
	return errcode.New(errcode.InvalidArgument, "sandbox_id %q is malformed: a sandbox id is %q and %d lowercase hex digits, like sb-0123456789ab (sandbox_create returns it; sandbox_list and `agentbox ls` show it)",
		id, Prefix, hexDigits).With("argument", "sandbox_id")
}
