package proto

import (
	"crypto/ed25519"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/gpu"
)

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"a", "gpu-box", "lab.one", "x_1", strings.Repeat("a", MaxNameLen)} {
		if err := CheckName("name", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "A", "-a", "a-", "a b", "mc-1", "join", "connect", "tokens", strings.Repeat("a", MaxNameLen+1), "é"} {
		if CheckName("name", bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for in, want := range map[string]string{"GPU-Box.example.com": "gpu-box", "my host!": "myhost", "---": "", "mc-abc": ""} {
		if got := SanitizeName(in); got != want {
			t.Errorf("SanitizeName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFactsCheck(t *testing.T) {
	good := Facts{Platform: "linux", Arch: "amd64", AgentVersion: "0.1.0", GPUs: []gpu.GPU{{Index: 0, Name: "A", MemoryTotalMB: 1}}}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []Facts{
		{Platform: "plan9", Arch: "amd64", AgentVersion: "1"},
		{Platform: "linux", Arch: "", AgentVersion: "1"},
		{Platform: "linux", Arch: "amd 64", AgentVersion: "1"},
		{Platform: "linux", Arch: "amd64", AgentVersion: strings.Repeat("1", MaxFactLen+1)},
		{Platform: "linux", Arch: "amd64", AgentVersion: "1", GPUs: []gpu.GPU{{Index: 0, Name: "A"}, {Index: 0, Name: "B"}}},
	} {
		if f.Check() == nil {
			t.Errorf("%+v accepted", f)
		}
	}
}

func TestVerify(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	nonce := []byte("0123456789abcdef0123456789abcdef")
	sig := ed25519.Sign(priv, SignedBytes("mc-1", nonce))
	if !Verify(pub, "mc-1", nonce, sig) {
		t.Fatal("a good signature refused")
	}
	if Verify(pub, "mc-2", nonce, sig) || Verify(pub, "mc-1", []byte("other"), sig) || Verify(pub[:31], "mc-1", nonce, sig) || Verify(pub, "mc-1", nonce, sig[:10]) {
		t.Fatal("a signature verified for another id, nonce or a short key/signature")
	}
}
