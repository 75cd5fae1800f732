// Package linksign signs download links that are their own credential: an HMAC-SHA256 over what
// the link names and when it expires, with a 32-byte key kept 0600 on the server. A link is
// checked for its signature first (AUTH_FAILED), then for its expiry (LINK_EXPIRED). Run
// artifacts (internal/runs) and relay blobs (internal/blobs) sign with it, each with its own key.
package linksign

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Signer signs and verifies links. It is safe for concurrent use.
type Signer struct {
	key []byte
	now func() time.Time
}

// New returns a Signer with key (32 bytes) and clock now (nil: time.Now).
func New(key []byte, now func() time.Time) *Signer {
	if now == nil {
		now = time.Now
	}
	return &Signer{key: key, now: now}
}

// Load reads the 32-byte key at path, making it once (0600, written to a temporary name then
// renamed), and returns a Signer with it.
func Load(path string, now func() time.Time) (*Signer, error) {
	key, err := loadKey(path)
	if err != nil {
		return nil, err
	}
	return New(key, now), nil
}

func loadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil && len(b) == 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("linksign: key: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, key, 0o600); err != nil {
		return nil, fmt.Errorf("linksign: key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("linksign: key: %w", err)
	}
	return key, nil
}

// mac is the HMAC of parts, each followed by a newline, then expires.
func (s *Signer) mac(expires int64, parts []string) []byte {
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{'\n'})
	}
	m.Write([]byte(strconv.FormatInt(expires, 10)))
	return m.Sum(nil)
}

// Sign returns the hex signature of parts valid until expires (a unix time). Parts are joined
// by newlines (runs' original format), so every part but the last must be newline-free (ids).
func (s *Signer) Sign(expires int64, parts ...string) string {
	return hex.EncodeToString(s.mac(expires, parts))
}

// Query returns "expires=…&sig=…" for parts, valid until expires.
func (s *Signer) Query(expires time.Time, parts ...string) string {
	exp := expires.Unix()
	return "expires=" + strconv.FormatInt(exp, 10) + "&sig=" + s.Sign(exp, parts...)
}

// Verify checks sig over parts and expires: AUTH_FAILED for a bad signature, LINK_EXPIRED past
// expires. what names the link in the message ("artifact"), hint says how to get a fresh one.
func (s *Signer) Verify(what, hint string, expires int64, sig string, parts ...string) error {
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(expires, parts)) {
		return errcode.New(errcode.AuthFailed, "the %s link's signature does not match (%s)", what, hint)
	}
	if s.now().Unix() > expires {
		return errcode.New(errcode.LinkExpired, "the %s link expired at %s (%s)", what, time.Unix(expires, 0).UTC().Format(time.RFC3339), hint).
			With("expired_at", time.Unix(expires, 0).UTC().Format(time.RFC3339))
	}
	return nil
}

// ParseExpires reads a link's expires parameter: AUTH_FAILED when it is not a unix time.
func ParseExpires(what, v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, errcode.New(errcode.AuthFailed, "the %s link's expires must be a unix time; use the link as it was given", what)
	}
	return n, nil
}
