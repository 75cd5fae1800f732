package runs

import (
	"net/url"
	"strings"
	"time"
)

// artifactHint says how to get a fresh artifact link.
const artifactHint = "ask run_get for a fresh link"

// escapePath escapes each segment of an artifact path for a URL.
func escapePath(p string) string {
	segs := strings.Split(p, "/")
	for i, sg := range segs {
		segs[i] = url.PathEscape(sg)
	}
	return strings.Join(segs, "/")
}

// ArtifactURL signs the download URL of a run's artifact path, valid until expires
// (internal/linksign over run id and path).
func (s *Service) ArtifactURL(runID, path string, expires time.Time) string {
	return s.cfg.BaseURL() + "/v1/runs/" + url.PathEscape(runID) + "/artifacts/" + escapePath(path) +
		"?" + s.signer.Query(expires, runID, path)
}

// VerifyArtifact checks a signed URL's parameters: AUTH_FAILED for a bad signature,
// LINK_EXPIRED past expires.
func (s *Service) VerifyArtifact(runID, path string, expires int64, sig string) error {
	return s.signer.Verify("artifact", artifactHint, expires, sig, runID, path)
}
