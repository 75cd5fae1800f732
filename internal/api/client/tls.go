package client

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/agentbox/agentbox/internal/errcode"
)

// TLS is how a client trusts an https server: a CA certificate file (the server's own
// self-signed certificate will do), a pinned SHA-256 fingerprint of the server's certificate,
// or both. Neither: the system's roots.
type TLS struct {
	CACert      string
	Fingerprint string
}

// Fingerprint is the form of a certificate's SHA-256 fingerprint agentbox prints and pins:
// 64 lower-case hex digits of the SHA-256 of its DER bytes.
func Fingerprint(der []byte) string {
	s := sha256.Sum256(der)
	return hex.EncodeToString(s[:])
}

// NormalizeFingerprint accepts a fingerprint as agentbox prints it, or with colons, upper
// case or a "sha256:" prefix, and returns agentbox's form; INVALID_ARGUMENT if it is not one.
func NormalizeFingerprint(fp string) (string, error) {
	f := strings.ToLower(strings.TrimSpace(fp))
	f = strings.TrimPrefix(f, "sha256:")
	f = strings.ReplaceAll(f, ":", "")
	if b, err := hex.DecodeString(f); err != nil || len(b) != sha256.Size {
		return "", errcode.New(errcode.InvalidArgument, "fingerprint %q: give the server certificate's SHA-256 as 64 hex digits (`agentbox serve` prints it; server.json has it)", fp)
	}
	return f, nil
}

// Config returns the tls.Config t describes (nil when t is empty).
func (t TLS) Config() (*tls.Config, error) {
	if t.CACert == "" && t.Fingerprint == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CACert != "" {
		pem, err := os.ReadFile(t.CACert)
		if err != nil {
			return nil, fmt.Errorf("--ca-cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errcode.New(errcode.InvalidArgument, "--ca-cert %s holds no PEM certificate", t.CACert)
		}
		cfg.RootCAs = pool
	}
	if t.Fingerprint != "" {
		pin, err := NormalizeFingerprint(t.Fingerprint)
		if err != nil {
			return nil, err
		}
		// The pin is the trust: a self-signed certificate has no chain to verify. With a CA
		// as well, the chain is verified too.
		cfg.InsecureSkipVerify = t.CACert == ""
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("the server sent no certificate")
			}
			if got := Fingerprint(cs.PeerCertificates[0].Raw); got != pin {
				return fmt.Errorf("the server's certificate has SHA-256 fingerprint %s, not the pinned %s: refusing to talk to it", got, pin)
			}
			return nil
		}
	}
	return cfg, nil
}

// NewTLS is New for an https server trusted as t says.
func NewTLS(baseURL, token string, t TLS) (*Client, error) {
	c := New(baseURL, token)
	cfg, err := t.Config()
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = cfg
		c.hc = &http.Client{Transport: tr}
	}
	return c, nil
}
