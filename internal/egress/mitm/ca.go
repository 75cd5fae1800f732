package mitm

import (
	"bytes"
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Files of a CA directory.
const (
	CACertFile = "ca.pem"     // the CA certificate, 0644
	CAKeyFile  = "ca-key.pem" // its ECDSA P-256 key (PKCS #8), 0600
	caLockFile = "ca.lock"    // serialises creators (flock)
)

// Bounds of the CA.
const (
	caValidity = 10 * 365 * 24 * time.Hour
	// LeafCacheSize is how many hosts' leaf certificates a CA keeps.
	LeafCacheSize = 1024
	leafValidity  = 24 * time.Hour
	leafBackdate  = time.Hour
	// a cached leaf is replaced once less than this is left of its validity
	leafRefresh = 2 * time.Hour
	// maxPEMFile bounds what LoadOrCreateCA reads of ca.pem and ca-key.pem.
	maxPEMFile = 64 << 10
	// maxHostRoots bounds the host's roots file CABundle reads.
	maxHostRoots = 16 << 20
)

// DefaultHostRoots is the host's PEM bundle of trusted roots CABundle starts from.
const DefaultHostRoots = "/etc/ssl/certs/ca-certificates.crt"

// CA is a server's egress CA: it issues, on demand, the leaf certificates the interceptor
// shows a sandbox for the hosts its secrets name. The sandbox trusts it through its CA bundle.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte

	mu       sync.Mutex
	leafMax  int
	leaves   map[string]*list.Element // host → element of lru, whose Value is *leafEntry
	lru      *list.List               // front: most recently used
	inflight map[string]*leafCall
	issued   atomic.Int64 // leaves issued (tests)
}

type leafEntry struct {
	host      string
	cert      *tls.Certificate
	refreshAt time.Time
}

type leafCall struct {
	done chan struct{}
	cert *tls.Certificate
	err  error
}

// LoadOrCreateCA loads the CA of dir (ca.pem and ca-key.pem), creating it the first time:
// the directory (0700) if missing, an ECDSA P-256 key written 0600 and a certificate valid 10
// years written 0644, each written to a temporary file and renamed into place. Concurrent
// creators (goroutines or processes) are serialised by a lock file, so all of them end with
// the same CA. A key without its certificate (a crash between the two renames) gets a new
// certificate for the same key; an expired certificate is reissued for the same key.
func LoadOrCreateCA(dir string) (*CA, error) {
	if dir == "" {
		return nil, errors.New("egress CA: no directory given")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, caLockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	defer lock.Close()
	if err := lockFile(lock); err != nil {
		return nil, fmt.Errorf("egress CA: lock %s: %w", lock.Name(), err)
	}
	defer unlockFile(lock)

	keyPath, certPath := filepath.Join(dir, CAKeyFile), filepath.Join(dir, CACertFile)
	key, err := readKey(keyPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, fmt.Errorf("egress CA: %w", err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, fmt.Errorf("egress CA: %w", err)
		}
		if err := writeAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	default:
		// a key readable by others is tightened, not trusted as it is
		if fi, err := os.Stat(keyPath); err == nil && fi.Mode().Perm() != 0o600 {
			if err := os.Chmod(keyPath, 0o600); err != nil {
				return nil, fmt.Errorf("egress CA: %w", err)
			}
		}
	}
	cert, certPEM, err := readCert(certPath, key)
	if err != nil {
		// missing, expired or not this key's: a new certificate for the key
		if certPEM, err = newCACert(key); err != nil {
			return nil, err
		}
		if err := writeAtomic(certPath, certPEM, 0o644); err != nil {
			return nil, err
		}
		if cert, certPEM, err = readCert(certPath, key); err != nil {
			return nil, err
		}
	}
	return &CA{cert: cert, key: key, certPEM: certPEM, leafMax: LeafCacheSize,
		leaves: map[string]*list.Element{}, lru: list.New(), inflight: map[string]*leafCall{}}, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPEMFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxPEMFile {
		return nil, fmt.Errorf("egress CA: %s is larger than %d bytes", path, maxPEMFile)
	}
	return b, nil
}

func readKey(path string) (*ecdsa.PrivateKey, error) {
	b, err := readBounded(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("egress CA: %s holds no PEM block; move it away to make a new CA", path)
	}
	var k any
	switch blk.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(blk.Bytes)
	default:
		err = fmt.Errorf("PEM block type %q", blk.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("egress CA: %s: %w; move it away to make a new CA", path, err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("egress CA: %s is not an ECDSA key; move it away to make a new CA", path)
	}
	return ek, nil
}

// readCert reads the CA certificate at path and checks it is a CA for key, valid now.
func readCert(path string, key *ecdsa.PrivateKey) (*x509.Certificate, []byte, error) {
	b, err := readBounded(path)
	if err != nil {
		return nil, nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, nil, errors.New("no certificate")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, nil, err
	}
	pub, ok := c.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) || !c.IsCA {
		return nil, nil, errors.New("not this key's CA")
	}
	if now := time.Now(); now.After(c.NotAfter) || now.Before(c.NotBefore) {
		return nil, nil, errors.New("expired")
	}
	return c, pem.EncodeToMemory(blk), nil
}

func newCACert(key *ecdsa.PrivateKey) ([]byte, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown host"
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{CommonName: "agentbox egress CA (" + host + ")", Organization: []string{"agentbox"}},
		NotBefore:             now.Add(-leafBackdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func randSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n.Add(n, big.NewInt(1))
}

// writeAtomic writes b to path through a temporary file in the same directory and a rename.
func writeAtomic(path string, b []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("egress CA: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("egress CA: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("egress CA: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// CertPEM returns the CA certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.certPEM) }

// Certificate returns the parsed CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Leaf returns a certificate for host (a DNS name or an IP address) signed by the CA: an
// ECDSA P-256 key, valid from an hour ago for 24 hours, host its only subject alternative
// name. Leaves are cached (the LeafCacheSize most recently used hosts) and reissued before
// they expire; concurrent calls for one host issue one certificate.
func (ca *CA) Leaf(host string) (*tls.Certificate, error) {
	now := time.Now()
	ca.mu.Lock()
	if el, ok := ca.leaves[host]; ok {
		e := el.Value.(*leafEntry)
		if now.Before(e.refreshAt) {
			ca.lru.MoveToFront(el)
			ca.mu.Unlock()
			return e.cert, nil
		}
	}
	if c, ok := ca.inflight[host]; ok {
		ca.mu.Unlock()
		<-c.done
		return c.cert, c.err
	}
	c := &leafCall{done: make(chan struct{})}
	ca.inflight[host] = c
	ca.mu.Unlock()

	c.cert, c.err = ca.issue(host, now)

	ca.mu.Lock()
	delete(ca.inflight, host)
	if c.err == nil {
		e := &leafEntry{host: host, cert: c.cert, refreshAt: c.cert.Leaf.NotAfter.Add(-leafRefresh)}
		if el, ok := ca.leaves[host]; ok {
			el.Value = e
			ca.lru.MoveToFront(el)
		} else {
			ca.leaves[host] = ca.lru.PushFront(e)
		}
		for ca.lru.Len() > ca.leafMax {
			old := ca.lru.Back()
			ca.lru.Remove(old)
			delete(ca.leaves, old.Value.(*leafEntry).host)
		}
	}
	ca.mu.Unlock()
	close(c.done)
	return c.cert, c.err
}

func (ca *CA) cached() int {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.lru.Len()
}

func (ca *CA) issue(host string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{CommonName: host},
		NotBefore:             now.Add(-leafBackdate),
		NotAfter:              now.Add(leafValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("egress CA: leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca.issued.Add(1)
	return &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// CABundle returns the PEM bundle a sandbox trusts (runtime.Spec.CABundle): the host's roots
// file (hostRoots; "" means DefaultHostRoots; a missing file contributes nothing) followed by
// the CA's certificate. The roots file is read up to 16 MiB.
func CABundle(ca *CA, hostRoots string) ([]byte, error) {
	if hostRoots == "" {
		hostRoots = DefaultHostRoots
	}
	var b []byte
	f, err := os.Open(hostRoots)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("egress CA bundle: %w", err)
	default:
		b, err = io.ReadAll(io.LimitReader(f, maxHostRoots+1))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("egress CA bundle: %w", err)
		}
		if len(b) > maxHostRoots {
			return nil, fmt.Errorf("egress CA bundle: %s is larger than %d MiB", hostRoots, maxHostRoots>>20)
		}
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	b = append(b, "# agentbox egress CA\n"...)
	return append(b, ca.certPEM...), nil
}
