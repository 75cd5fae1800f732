package linksign_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/linksign"
)

func TestSignVerify(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	path := filepath.Join(t.TempDir(), "key")
	s, err := linksign.Load(path, clock)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 32 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	exp := now.Add(time.Hour).Unix()
	sig := s.Sign(exp, "blob", "b-1")
	if err := s.Verify("blob", "hint", exp, sig, "blob", "b-1"); err != nil {
		t.Fatalf("fresh link: %v", err)
	}
	// Another name, another expiry, a bad hex: AUTH_FAILED.
	for _, tc := range []struct {
		exp   int64
		sig   string
		parts []string
	}{
		{exp, sig, []string{"blob", "b-2"}},
		{exp + 1, sig, []string{"blob", "b-1"}},
		{exp, "zz", []string{"blob", "b-1"}},
	} {
		if err := s.Verify("blob", "hint", tc.exp, tc.sig, tc.parts...); !errcode.Is(err, errcode.AuthFailed) {
			t.Errorf("Verify(%v) = %v, want AUTH_FAILED", tc.parts, err)
		}
	}
	// A reloaded key verifies what the first signed; past expiry: LINK_EXPIRED.
	s2, err := linksign.Load(path, func() time.Time { return now.Add(time.Hour + time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Verify("blob", "hint", exp, sig, "blob", "b-1"); !errcode.Is(err, errcode.LinkExpired) {
		t.Fatalf("expired link: %v", err)
	}
	// Another key refuses it.
	s3 := linksign.New(make([]byte, 32), clock)
	if err := s3.Verify("blob", "hint", exp, sig, "blob", "b-1"); !errcode.Is(err, errcode.AuthFailed) {
		t.Fatalf("other key: %v", err)
	}
}
