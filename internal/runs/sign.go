package runs

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// loadKey reads the 32-byte key that signs artifact URLs, making it once (0600).
func loadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil && len(b) == 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("runs: url key: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, key, 0o600); err != nil {
		return nil, fmt.Errorf("runs: url key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("runs: url key: %w", err)
	}
	return key, nil
}

func (s *Service) sign(runID, path string, expires int64) []byte {
	m := hmac.New(sha256.New, s.key)
	fmt.Fprintf(m, "%s\n%s\n%d", runID, path, expires)
	return m.Sum(nil)
}

// escapePath escapes each segment of an artifact path for a URL.
func escapePath(p string) string {
	segs := strings.Split(p, "/")
	for i, sg := range segs {
		segs[i] = url.PathEscape(sg)
	}
	return strings.Join(segs, "/")
}

// ArtifactURL signs the download URL of a run's artifact path, valid until expires.
func (s *Service) ArtifactURL(runID, path string, expires time.Time) string {
	exp := expires.Unix()
	return s.cfg.BaseURL() + "/v1/runs/" + url.PathEscape(runID) + "/artifacts/" + escapePath(path) +
		"?expires=" + strconv.FormatInt(exp, 10) + "&sig=" + hex.EncodeToString(s.sign(runID, path, exp))
}

// VerifyArtifact checks a signed URL's parameters: AUTH_FAILED for a bad signature,
// LINK_EXPIRED past expires.
func (s *Service) VerifyArtifact(runID, path string, expires int64, sig string) error {
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.sign(runID, path, expires)) {
		return errcode.New(errcode.AuthFailed, "the artifact link's signature does not match (ask run_get for a fresh link)")
	}
	if s.now().Unix() > expires {
		return errcode.New(errcode.LinkExpired, "the artifact link expired at %s (ask run_get for a fresh link)", time.Unix(expires, 0).UTC().Format(time.RFC3339))
	}
	return nil
}
