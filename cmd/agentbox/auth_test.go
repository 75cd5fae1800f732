package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/testenv"
)

// cli runs the agentbox binary with AGENTBOX_TOKEN=token; it returns stdout, stderr and the
// exit code.
func cli(t *testing.T, token string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(testenv.Binary(t), args...)
	cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+token, "AGENTBOX_URL=", "AGENTBOX_FINGERPRINT=", "AGENTBOX_CA_CERT=")
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestServeTLSKeysScopes: `agentbox serve --tls-self-signed` keeps its certificate (key 0600,
// SANs 127.0.0.1 and localhost) and publishes its fingerprint; the CLI reaches it with the
// pinned fingerprint or the certificate as --ca-cert, and refuses a wrong pin or no trust; API
// keys made with `agentbox token create` act within their scopes on real sandboxes; a revoked
// key is refused at once; `agentbox mcp` bridges to the TLS server using server.json's
// fingerprint, with the key's scope.
func TestServeTLSKeysScopes(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abtls")
	srv := testenv.StartServer(t, dir, testToken, "--tls-self-signed")
	if !strings.HasPrefix(srv.URL, "https://127.0.0.1:") || len(srv.Fingerprint) != 64 {
		t.Fatalf("server.json: url %q fingerprint %q", srv.URL, srv.Fingerprint)
	}
	if !strings.Contains(srv.Logs.String(), "fingerprint "+srv.Fingerprint) {
		t.Fatalf("serve did not print its fingerprint:\n%s", srv.Logs)
	}
	certPath := filepath.Join(dir, "tls", "cert.pem")
	if st, err := os.Stat(filepath.Join(dir, "tls", "key.pem")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	b, _ := os.ReadFile(certPath)
	blk, _ := pem.Decode(b)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil || cert.VerifyHostname("127.0.0.1") != nil || cert.VerifyHostname("localhost") != nil {
		t.Fatalf("certificate SANs: %v %v %v", err, cert.IPAddresses, cert.DNSNames)
	}
	pin := []string{"--server", srv.URL, "--fingerprint", srv.Fingerprint}

	// Trust: the pin, the CA file; not a wrong pin, not nothing.
	if _, errs, code := cli(t, testToken, append([]string{"sandbox", "ls"}, pin...)...); code != 0 {
		t.Fatalf("pinned: %d %s", code, errs)
	}
	if _, errs, code := cli(t, testToken, "sandbox", "ls", "--server", srv.URL, "--ca-cert", certPath); code != 0 {
		t.Fatalf("--ca-cert: %d %s", code, errs)
	}
	wrong := strings.Repeat("0", 64)
	if _, errs, code := cli(t, testToken, "sandbox", "ls", "--server", srv.URL, "--fingerprint", wrong); code == 0 || !strings.Contains(errs, "not the pinned "+wrong) {
		t.Fatalf("wrong pin: %d %s", code, errs)
	}
	if _, errs, code := cli(t, testToken, "sandbox", "ls", "--server", srv.URL); code == 0 || !strings.Contains(errs, "certificate") {
		t.Fatalf("no trust: %d %s", code, errs)
	}

	// Keys, created with the server's token (the admin key); the key is printed last.
	mk := func(name, scope string) string {
		out, errs, code := cli(t, testToken, append([]string{"token", "create", "--scope", scope, name}, pin...)...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		key := lines[len(lines)-1]
		if code != 0 || !strings.HasPrefix(key, "abk_") || !strings.Contains(errs, "shown once") {
			t.Fatalf("token create %s: %d %q %s", name, code, out, errs)
		}
		return key
	}
	readKey, opKey := mk("dash", "read"), mk("ci", "operate")
	out, errs, code := cli(t, opKey, append([]string{"sandbox", "create"}, pin...)...)
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sb-") {
		t.Fatalf("operate create: %d %q %s", code, out, errs)
	}
	if out, errs, code := cli(t, opKey, append(append([]string{"exec"}, pin...), id, "--", "echo", "over-tls")...); code != 0 || strings.TrimSpace(out) != "over-tls" {
		t.Fatalf("operate exec: %d %q %s", code, out, errs)
	}
	if _, errs, code := cli(t, readKey, append(append([]string{"exec"}, pin...), id, "--", "true")...); code == 0 || !strings.Contains(errs, "PERMISSION_DENIED") || !strings.Contains(errs, "needs scope operate") {
		t.Fatalf("read exec: %d %s", code, errs)
	}
	if _, errs, code := cli(t, readKey, append([]string{"sandbox", "create"}, pin...)...); code == 0 || !strings.Contains(errs, "PERMISSION_DENIED") {
		t.Fatalf("read create: %d %s", code, errs)
	}
	if _, errs, code := cli(t, opKey, append([]string{"token", "create", "x"}, pin...)...); code == 0 || !strings.Contains(errs, "needs scope admin") {
		t.Fatalf("operate token create: %d %s", code, errs)
	}
	// Every key is a principal: the read key lists none of the operate key's sandboxes, the
	// server's token (the admin) lists them all.
	if out, _, code := cli(t, readKey, append([]string{"sandbox", "ls"}, pin...)...); code != 0 || strings.Contains(out, id) {
		t.Fatalf("read ls: %d %q, want none of another key's", code, out)
	}
	if out, _, code := cli(t, testToken, append([]string{"sandbox", "ls"}, pin...)...); code != 0 || !strings.Contains(out, id) {
		t.Fatalf("admin ls: %d %q", code, out)
	}
	if out, errs, code := cli(t, testToken, append([]string{"token", "ls"}, pin...)...); code != 0 || !strings.Contains(out, "dash") || !strings.Contains(out, "operate") {
		t.Fatalf("token ls: %d %q %s", code, out, errs)
	}

	// agentbox mcp over TLS, trusting the server.json fingerprint, with the read key's scope.
	mcpCmd := exec.Command(testenv.Binary(t), "mcp", "--state-dir", dir)
	mcpCmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+readKey, "AGENTBOX_FINGERPRINT=", "AGENTBOX_CA_CERT=")
	s := open(t, &mcp.CommandTransport{Command: mcpCmd}, "")
	res := s.call("sandbox_get", map[string]any{"sandbox_id": id}, nil)
	if txt := res.Content[0].(*mcp.TextContent).Text; !res.IsError || !strings.Contains(txt, "SANDBOX_NOT_FOUND") {
		t.Fatalf("mcp bridge, read key, sandbox_get of another key's sandbox: %v %s", res.IsError, txt)
	}
	var list mcpserver.SandboxList
	s.ok("sandbox_list", map[string]any{}, &list)
	res = s.call("sandbox_create", map[string]any{}, nil)
	if txt := res.Content[0].(*mcp.TextContent).Text; !res.IsError || !strings.Contains(txt, "PERMISSION_DENIED") {
		t.Fatalf("mcp bridge, read key, sandbox_create: %v %s", res.IsError, txt)
	}

	// Revocation: refused at the next request.
	if _, errs, code := cli(t, testToken, append([]string{"token", "revoke", "ci"}, pin...)...); code != 0 {
		t.Fatalf("revoke: %d %s", code, errs)
	}
	if _, errs, code := cli(t, opKey, append([]string{"sandbox", "ls"}, pin...)...); code == 0 || !strings.Contains(errs, "revoked") {
		t.Fatalf("revoked key: %d %s", code, errs)
	}
	if _, err := srv.Client().Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
}

// TestServeExposureRules: beyond loopback, serve needs --allow-remote; a public address
// without TLS is refused outright (--insecure-plaintext or not); a private one needs
// --allow-private-network and TLS or --insecure-plaintext. Each refusal exits 2 before
// anything starts; so does an --egress-allow-cidr naming a private range without
// --allow-private-network.
func TestServeExposureRules(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:0"}, "--allow-remote"},
		{[]string{"--listen", "0.0.0.0:0", "--allow-remote"}, "plain HTTP is refused on a public address"},
		{[]string{"--listen", "0.0.0.0:0", "--allow-remote", "--insecure-plaintext"}, "plain HTTP is refused on a public address"},
		{[]string{"--listen", "8.8.8.8:0", "--allow-remote", "--insecure-plaintext"}, "plain HTTP is refused on a public address"},
		{[]string{"--listen", "10.1.2.3:0", "--allow-remote", "--tls-self-signed"}, "--allow-private-network"},
		{[]string{"--listen", "10.1.2.3:0", "--allow-remote", "--allow-private-network"}, "--insecure-plaintext"},
		{[]string{"--listen", "127.0.0.1:0", "--tls-cert", "x.pem"}, "go together"},
	} {
		_, errs, code := cli(t, testToken, append([]string{"serve", "--state-dir", dir}, tc.args...)...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("serve %v: exit %d, stderr %q, want %q", tc.args, code, errs, tc.want)
		}
	}
	// A private-network upstream likewise.
	if _, errs, code := cli(t, testToken, "serve", "--state-dir", dir, "--egress-allow-cidr", "10.203.0.0/24"); code == 0 || !strings.Contains(errs, "--allow-private-network") {
		t.Errorf("serve --egress-allow-cidr 10.203.0.0/24: exit %d, stderr %q", code, errs)
	}
	if _, err := os.Stat(config.ServerInfoPath(dir)); err == nil {
		t.Fatalf("a refused serve published server.json")
	}
	// Allowed combinations pass the check (without binding).
	for _, tc := range []struct {
		listen string
		t      serveTLS
	}{
		{"127.0.0.1:0", serveTLS{}},
		{"0.0.0.0:0", serveTLS{selfSigned: true}},
		{"192.168.1.5:8765", serveTLS{allowPrivateNet: true, plaintext: true}},
		{"[fd00::1]:8765", serveTLS{allowPrivateNet: true, cert: "c", key: "k"}},
	} {
		if err := tc.t.checkListen(tc.listen, true); err != nil {
			t.Errorf("%s %+v: %v", tc.listen, tc.t, err)
		}
	}
	if ips := func() []net.IP { _, ips := sans("10.1.2.3"); return ips }(); len(ips) != 3 || !ips[2].Equal(net.ParseIP("10.1.2.3")) {
		t.Errorf("SANs for 10.1.2.3: %v", ips)
	}
}
