package image

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/agentbox/agentbox/internal/errcode"
)

// parsedRef is a reference as the cache uses it.
type parsedRef struct {
	ref    name.Reference // nil for a bare digest
	name   string         // normalised: "docker.io/library/python:3.12-slim" or "host/repo@sha256:…"
	repo   string         // normalised repository ("docker.io/library/python")
	tag    string         // "" for a digest reference
	digest string         // "sha256:…" for a digest reference
	local  bool           // a bare digest: only the cache can have it
}

var bareDigest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// refForm is the form a bad reference is told to use.
const refForm = "expected NAME[:TAG] or NAME@sha256:DIGEST (python:3.12-slim, ghcr.io/org/img:tag, name@sha256:…)"

func (s *Store) parse(ref string) (parsedRef, error) {
	if len(ref) > MaxRefBytes {
		return parsedRef{}, errcode.New(errcode.InvalidArgument, "image reference is %d bytes; it must be at most %d (%s)", len(ref), MaxRefBytes, refForm)
	}
	if bareDigest.MatchString(ref) {
		return parsedRef{name: ref, digest: ref, local: true}, nil
	}
	if ref == "" || ref == Host || strings.TrimSpace(ref) != ref {
		return parsedRef{}, errcode.New(errcode.InvalidArgument, "image reference %q is not valid: %s", ref, refForm).With("ref", ref)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return parsedRef{}, errcode.Wrap(errcode.InvalidArgument, err, "image reference %q is not valid: %s", ref, refForm).With("ref", ref)
	}
	if s.insecure(r.Context().RegistryStr()) {
		if r, err = name.ParseReference(ref, name.Insecure); err != nil {
			return parsedRef{}, errcode.Wrap(errcode.InvalidArgument, err, "image reference %q is not valid: %s", ref, refForm).With("ref", ref)
		}
	}
	p := parsedRef{ref: r, repo: normRepo(r.Context())}
	switch t := r.(type) {
	case name.Tag:
		p.tag = t.TagStr()
		p.name = p.repo + ":" + p.tag
	case name.Digest:
		p.digest = t.DigestStr()
		p.name = p.repo + "@" + p.digest
	}
	return p, nil
}

// normRepo is a repository's name as the cache writes it (Docker Hub as "docker.io").
func normRepo(r name.Repository) string {
	reg := r.RegistryStr()
	if reg == name.DefaultRegistry {
		reg = "docker.io"
	}
	return reg + "/" + r.RepositoryStr()
}

// insecure reports whether a registry is reached over plain HTTP: a loopback address, or
// "localhost", or one the operator lists.
func (s *Store) insecure(host string) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil && a.IsLoopback() {
		return true
	}
	for _, i := range s.opts.Insecure {
		if i == host || i == h {
			return true
		}
	}
	return false
}

// staticKeychain holds the operator's --registry-auth credentials.
type staticKeychain []RegistryAuth

func (k staticKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	reg := res.RegistryStr()
	for _, a := range k {
		if a.Host == reg || (reg == name.DefaultRegistry && (a.Host == "docker.io" || a.Host == "registry-1.docker.io")) {
			return &authn.Basic{Username: a.Username, Password: a.Password}, nil
		}
	}
	return authn.Anonymous, nil
}

// Bounds of a registry exchange (a whole pull is bounded by its caller's context and, per
// layer, LayerStallTimeout).
const (
	RegistryDialTimeout   = 10 * time.Second
	RegistryHeaderTimeout = 60 * time.Second
)

var registryTransport = func() http.RoundTripper {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: RegistryDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = RegistryDialTimeout
	t.ResponseHeaderTimeout = RegistryHeaderTimeout
	return t
}()

func (s *Store) remoteOpts(ctx context.Context) []remote.Option {
	return []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(s.keychain),
		remote.WithPlatform(s.platform), remote.WithUserAgent("agentbox"), remote.WithTransport(registryTransport)}
}

// pullError types an error of a registry exchange.
func pullError(ctx context.Context, ref string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errcode.As(err); ok {
		return err
	}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return errcode.Wrap(errcode.ImagePullFailed, err, "pulling %q: cancelled", ref).With("reason", "cancelled").With("ref", ref)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		for _, d := range terr.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode:
				return errcode.Wrap(errcode.ImageNotFound, err, "the registry has no image %q", ref).With("ref", ref)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return errcode.Wrap(errcode.ImagePullFailed, err, "the registry refused the credentials for %q (give them with --registry-auth or docker login)", ref).With("reason", ReasonUnauthorized).With("ref", ref)
			}
		}
		switch terr.StatusCode {
		case 401, 403:
			return errcode.Wrap(errcode.ImagePullFailed, err, "the registry refused the credentials for %q (give them with --registry-auth or docker login)", ref).With("reason", ReasonUnauthorized).With("ref", ref)
		case 404:
			return errcode.Wrap(errcode.ImageNotFound, err, "the registry has no image %q", ref).With("ref", ref)
		}
		return errcode.Wrap(errcode.ImagePullFailed, err, "the registry answered %d for %q", terr.StatusCode, ref).With("reason", ReasonUnreachable).With("ref", ref)
	}
	if strings.Contains(err.Error(), "error verifying") {
		return errcode.Wrap(errcode.ImagePullFailed, err, "a blob of %q does not match its digest", ref).With("reason", ReasonDigestMismatch).With("ref", ref)
	}
	return errcode.Wrap(errcode.ImagePullFailed, err, "the registry of %q could not be reached", ref).With("reason", ReasonUnreachable).With("ref", ref)
}
