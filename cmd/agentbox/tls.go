package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
)

// serveTLS is serve's TLS and exposure flags.
type serveTLS struct {
	cert, key       string
	selfSigned      bool
	plaintext       bool
	allowPrivateNet bool
}

func (t *serveTLS) register(fs *flag.FlagSet) {
	fs.StringVar(&t.cert, "tls-cert", "", "serve HTTPS with this PEM certificate (chain) file; needs --tls-key")
	fs.StringVar(&t.key, "tls-key", "", "the PEM private key of --tls-cert")
	fs.BoolVar(&t.selfSigned, "tls-self-signed", false, "serve HTTPS with a self-signed ECDSA certificate kept under <state-dir>/tls (made on first use; SANs: the listen host, 127.0.0.1, ::1, localhost, *.localhost for preview URLs); its SHA-256 fingerprint is printed and published in server.json")
	fs.BoolVar(&t.plaintext, "insecure-plaintext", false, "allow plain HTTP on a private-network --listen address (keys and tokens cross the network in clear text); a public address is refused without TLS")
}

func (t *serveTLS) enabled() bool { return t.selfSigned || t.cert != "" }

// checkListen applies the exposure rules to the listen address: loopback needs nothing; any
// other needs --allow-remote; a private-network one needs --allow-private-network and TLS or
// --insecure-plaintext; a public one (any non-private IP, the unspecified address, a host
// name) needs TLS, with no way around it.
func (t *serveTLS) checkListen(listen string, allowRemote bool) error {
	if (t.cert == "") != (t.key == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if t.selfSigned && t.cert != "" {
		return errors.New("--tls-self-signed and --tls-cert are alternatives: give one")
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q must be host:port: %v", listen, err)
	}
	if config.IsLoopback(host) {
		return nil
	}
	if !allowRemote {
		return fmt.Errorf("--listen %q is not loopback: add --allow-remote (with TLS) to serve beyond this machine", listen)
	}
	ip, err := netip.ParseAddr(host)
	private := err == nil && config.PrivateNetwork(netip.PrefixFrom(ip, ip.BitLen()))
	if private && !t.allowPrivateNet {
		return fmt.Errorf("--listen %q is a private-network address: add --allow-private-network to serve on it", listen)
	}
	if t.enabled() {
		return nil
	}
	if !private {
		return fmt.Errorf("--listen %q is reachable beyond this machine and its network: serve it with TLS (--tls-cert/--tls-key or --tls-self-signed); plain HTTP is refused on a public address", listen)
	}
	if !t.plaintext {
		return fmt.Errorf("--listen %q needs TLS (--tls-cert/--tls-key or --tls-self-signed), or --insecure-plaintext to send keys in clear text on the private network", listen)
	}
	return nil
}

// config loads or makes the certificate; the fingerprint is its leaf's SHA-256 and certFile
// the PEM file clients can trust (the self-signed one; "" for --tls-cert's).
func (t *serveTLS) config(stateDir, listenHost string) (cfg *tls.Config, fingerprint, certFile string, err error) {
	certPath, keyPath := t.cert, t.key
	if t.selfSigned {
		dir := filepath.Join(stateDir, "tls")
		certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
		if err := ensureSelfSigned(dir, certPath, keyPath, listenHost); err != nil {
			return nil, "", "", err
		}
		certFile = certPath
	}
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, "", "", fmt.Errorf("TLS certificate %s / key %s: %w", certPath, keyPath, err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}, client.Fingerprint(pair.Certificate[0]), certFile, nil
}

// sans are the names a self-signed certificate is made for.
func sans(listenHost string) (dns []string, ips []net.IP) {
	dns = []string{"localhost", "*.localhost"} // *.localhost: preview URLs
	ips = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	if ip := net.ParseIP(listenHost); ip != nil {
		if !ip.IsUnspecified() && !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	} else if listenHost != "" && listenHost != "localhost" {
		dns = append(dns, listenHost)
	}
	return dns, ips
}

// ensureSelfSigned keeps a self-signed certificate in certPath/keyPath (key 0600) that is
// valid for a week more at least and names listenHost; else it makes a new one.
func ensureSelfSigned(dir, certPath, keyPath, listenHost string) error {
	if b, err := os.ReadFile(certPath); err == nil {
		if blk, _ := pem.Decode(b); blk != nil {
			if c, err := x509.ParseCertificate(blk.Bytes); err == nil && time.Now().Add(7*24*time.Hour).Before(c.NotAfter) && coversHost(c, listenHost) {
				if _, err := os.Stat(keyPath); err == nil {
					return nil
				}
			}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	dns, ips := sans(listenHost)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "agentbox serve (self-signed)"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true, DNSNames: dns, IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return writeFileAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func coversHost(c *x509.Certificate, host string) bool {
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return true
	}
	return host == "" || c.VerifyHostname(host) == nil
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// clientTLS is the TLS flags of the CLI's client commands and `agentbox mcp`.
type clientTLS struct{ caCert, fingerprint string }

func (t *clientTLS) register(fs *flag.FlagSet) {
	fs.StringVar(&t.caCert, "ca-cert", os.Getenv("AGENTBOX_CA_CERT"), "trust an https server whose certificate chains to this PEM file (e.g. the server's <state-dir>/tls/cert.pem) (default $AGENTBOX_CA_CERT)")
	fs.StringVar(&t.fingerprint, "fingerprint", os.Getenv("AGENTBOX_FINGERPRINT"), "pin the https server's certificate by its SHA-256 fingerprint (`agentbox serve` prints it) (default $AGENTBOX_FINGERPRINT; a local server's server.json is used without it)")
}

// forURL is the trust for url: the flags, else what a local server published for it.
func (t clientTLS) forURL(url string, stateDirs ...string) client.TLS {
	out := client.TLS{CACert: t.caCert, Fingerprint: t.fingerprint}
	if out.CACert == "" && out.Fingerprint == "" {
		if info, ok := config.LocalServerInfo(url, stateDirs...); ok {
			out.Fingerprint = info.TLSFingerprint
		}
	}
	return out
}
