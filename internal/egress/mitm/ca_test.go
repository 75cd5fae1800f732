package mitm

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestLoadOrCreateCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "egress")
	// concurrent creators all end with one CA
	const n = 8
	cas := make([]*CA, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); cas[i], errs[i] = LoadOrCreateCA(dir) }()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if !bytes.Equal(cas[i].CertPEM(), cas[0].CertPEM()) {
			t.Fatalf("creator %d has another CA", i)
		}
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil || !bytes.Equal(again.CertPEM(), cas[0].CertPEM()) {
		t.Fatalf("a second load made another CA (%v)", err)
	}
	for name, mode := range map[string]os.FileMode{CACertFile: 0o644, CAKeyFile: 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != mode {
			t.Fatalf("%s: %v mode %v, want %v", name, err, fi.Mode().Perm(), mode)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*.tmp")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	c := again.Certificate()
	host, _ := os.Hostname()
	if !c.IsCA || c.MaxPathLen != 0 || !c.MaxPathLenZero || c.KeyUsage != x509.KeyUsageCertSign ||
		c.Subject.CommonName != fmt.Sprintf("agentbox egress CA (%s)", host) ||
		c.NotAfter.Sub(time.Now()) < 9*365*24*time.Hour {
		t.Fatalf("CA certificate: IsCA %v MaxPathLen %d usage %v CN %q until %v", c.IsCA, c.MaxPathLen, c.KeyUsage, c.Subject.CommonName, c.NotAfter)
	}

	// a key readable by others is tightened
	os.Chmod(filepath.Join(dir, CAKeyFile), 0o644)
	if _, err := LoadOrCreateCA(dir); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, CAKeyFile)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v after load", fi.Mode().Perm())
	}

	// a key without its certificate (a crash between the renames): a new certificate, same key
	leafBefore, err := again.Leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, CACertFile))
	re, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(re.CertPEM())
	if _, err := leafBefore.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "api.example.com"}); err != nil {
		t.Fatalf("the recreated certificate does not verify the key's leaves: %v", err)
	}

	// a broken key is an error that says what to do, not a silent new CA
	os.WriteFile(filepath.Join(dir, CAKeyFile), []byte("garbage"), 0o600)
	if _, err := LoadOrCreateCA(dir); err == nil {
		t.Fatal("a garbage key loaded")
	}
}

func TestLeaf(t *testing.T) {
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	now := time.Now()
	l, err := ca.Leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	c := l.Leaf
	if d := now.Add(-time.Hour).Sub(c.NotBefore); d < -time.Minute || d > time.Minute {
		t.Fatalf("NotBefore %v", c.NotBefore)
	}
	if d := now.Add(24 * time.Hour).Sub(c.NotAfter); d < -time.Minute || d > time.Minute {
		t.Fatalf("NotAfter %v", c.NotAfter)
	}
	if len(c.DNSNames) != 1 || c.DNSNames[0] != "api.example.com" || c.IsCA {
		t.Fatalf("leaf names %v IsCA %v", c.DNSNames, c.IsCA)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: "api.example.com"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: "other.example.com"}); err == nil {
		t.Fatal("the leaf verifies for another host")
	}
	ipLeaf, err := ca.Leaf("192.0.2.7")
	if err != nil || len(ipLeaf.Leaf.IPAddresses) != 1 || len(ipLeaf.Leaf.DNSNames) != 0 {
		t.Fatalf("IP leaf: %v", err)
	}
}

func TestLeafCacheBounded(t *testing.T) {
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if ca.leafMax != LeafCacheSize || LeafCacheSize != 1024 {
		t.Fatalf("cache size %d", ca.leafMax)
	}
	ca.leafMax = 4
	first, _ := ca.Leaf("h0.example.com")
	if again, _ := ca.Leaf("h0.example.com"); again != first || ca.issued.Load() != 1 {
		t.Fatal("a cached leaf was issued again")
	}
	for i := range 10 {
		if _, err := ca.Leaf(fmt.Sprintf("h%d.example.com", i)); err != nil {
			t.Fatal(err)
		}
		if n := ca.cached(); n > 4 {
			t.Fatalf("cache holds %d leaves, bound 4", n)
		}
	}
	if again, _ := ca.Leaf("h0.example.com"); again == first {
		t.Fatal("the least recently used leaf was not evicted")
	}
	// concurrent requests for one new host issue one leaf
	before := ca.issued.Load()
	var wg sync.WaitGroup
	got := make([]any, 16)
	for i := range 16 {
		wg.Add(1)
		go func() { defer wg.Done(); l, _ := ca.Leaf("burst.example.com"); got[i] = l }()
	}
	wg.Wait()
	if n := ca.issued.Load() - before; n != 1 {
		t.Fatalf("16 concurrent requests issued %d leaves", n)
	}
	for i := range got {
		if got[i] != got[0] {
			t.Fatal("concurrent requests got different leaves")
		}
	}
}

func TestCABundle(t *testing.T) {
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	other, _ := LoadOrCreateCA(t.TempDir())
	roots := filepath.Join(t.TempDir(), "roots.pem")
	os.WriteFile(roots, bytes.TrimRight(other.CertPEM(), "\n"), 0o644) // no final newline
	b, err := CABundle(ca, roots)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatal("bundle is not PEM")
	}
	for _, c := range []*CA{ca, other} {
		if !bytes.Contains(b, c.CertPEM()) && !bytes.Contains(b, bytes.TrimRight(c.CertPEM(), "\n")) {
			t.Fatal("bundle misses a certificate")
		}
	}
	l, _ := ca.Leaf("x.example.com")
	if _, err := l.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "x.example.com"}); err != nil {
		t.Fatal(err)
	}
	b, err = CABundle(ca, filepath.Join(t.TempDir(), "missing.pem"))
	if err != nil || !bytes.HasSuffix(b, ca.CertPEM()) {
		t.Fatalf("missing roots: %v", err)
	}
}
