package security

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// scanProg searches everything a sandbox can read for the secrets given on stdin (one a line):
// every visible process's environment and command line, its own environment, and every file
// and file name outside /usr (the host's, bound read-only), /proc, /sys and /dev; and it tries
// the host paths given as arguments. It prints CLEAN or what held a secret (by index, so the
// secret itself never travels back).
const scanProg = `
needles = [l.strip().encode() for l in sys.stdin.read().split("\n") if l.strip()]
hits = []
def check(label, data):
    for i, n in enumerate(needles):
        if n in data:
            hits.append("%s holds secret #%d" % (label, i))
for p in os.listdir("/proc"):
    if p.isdigit() and p != str(os.getpid()):  # its own command line holds the paths it tries
        for f in ("environ", "cmdline"):
            try:
                with open("/proc/%s/%s" % (p, f), "rb") as fh:
                    check("/proc/%s/%s" % (p, f), fh.read())
            except OSError:
                pass
check("os.environ", repr(dict(os.environ)).encode())
skip = {"/proc", "/sys", "/dev", "/usr"}
files = 0
for top in os.listdir("/"):
    path = "/" + top
    if path in skip or os.path.islink(path):
        continue
    for root, dirs, names in os.walk(path):
        for name in dirs + names:
            check("name " + os.path.join(root, name), name.encode())
        for name in names:
            fp = os.path.join(root, name)
            try:
                if os.path.islink(fp) or not os.path.isfile(fp):
                    continue
                with open(fp, "rb") as fh:
                    check(fp, fh.read(1 << 20))
                files += 1
            except OSError:
                pass
for p in sys.argv[2:]:
    try:
        with open(p, "rb") as fh:
            check("path " + p, fh.read(1 << 20))
        out("opened", p)
    except OSError as e:
        out("cannot open", p, errname(e))
out("scanned", files, "files")
out("\n".join(hits) if hits else "CLEAN")
`

// scanFor runs scanProg as the agent user and as root, and fails the test on any hit. names are
// secrets too (file names the scan must not find), but the host paths it tries hold them.
func (a *arena) scanFor(secrets, names []string, hostPaths ...string) {
	a.t.Helper()
	for _, u := range users {
		res := a.pyAs(u, scanProg, strings.Join(append(slices.Clone(secrets), names...), "\n"), hostPaths...)
		if res.ExitCode != 0 || !strings.Contains(res.Stdout, "\nCLEAN\n") {
			a.t.Errorf("as %s, a secret was found inside the sandbox:\n%s\n%s", userName(u), res.Stdout, res.Stderr)
		}
		for _, s := range secrets {
			if strings.Contains(res.Stdout+res.Stderr, s) {
				a.t.Errorf("as %s, the scan's output holds a secret", userName(u))
			}
		}
	}
}

// noSecretVia reads paths through the files API and fails on any that returns a secret.
func (a *arena) noSecretVia(secrets []string, paths ...string) {
	a.t.Helper()
	for _, p := range paths {
		b, err := a.readFile(a.id, p)
		for _, s := range secrets {
			if strings.Contains(string(b), s) {
				a.t.Errorf("HOLE: the files API returned a host secret reading %s", p)
			}
		}
		a.t.Logf("files API read %s: %d bytes, %v", p, len(b), code(err))
	}
}

func secretAttacks() []attack {
	return []attack{
		{
			name:   "secret-server-env",
			does:   "as the agent user and as root, reads every visible /proc/*/environ and cmdline (PID 1, the agent, included), its own environment, every file outside /usr, and /proc/1/environ and /proc/self/environ through the files API",
			want:   "the canary in the server's environment (ABSEC_CANARY_ENV) and the server's token appear nowhere; the names of the server's variables are not in a command's environment",
			gvisor: "gVisor lets the agent user read /proc/1/environ (its own procfs); it holds only the sandbox's environment, so the expectation is the same",
			run: func(a *arena) {
				secrets := []string{a.s.envCanary, a.s.token}
				a.scanFor(secrets, nil)
				for _, u := range users {
					res := a.execIn(a.id, apiExec(u, "env"))
					for _, name := range []string{"ABSEC_CANARY_ENV", "AGENTBOX_TOKEN", a.s.envCanary} {
						if strings.Contains(res.Stdout, name) {
							a.t.Errorf("HOLE: a command run as %s has %s in its environment", userName(u), name)
						}
					}
				}
				a.noSecretVia(secrets, "/proc/1/environ", "/proc/self/environ", "/proc/1/cmdline")
			},
		},
		{
			name: "secret-host-file",
			does: "looks for canary files on the host — one in a host temp dir, one beside the bound /etc/ssl/certs, one in the server's state dir — by their host paths, through ../ from bound dirs (/etc/ssl/certs/../), by name and content anywhere it can read, and through the files API by path and through symlinks it plants",
			want: "no canary's content or name is ever seen inside or returned by the files API; the host canaries are unchanged",
			run: func(a *arena) {
				base := "absec-canary-" + randHex(6)
				c1 := newHostCanary(a.t, filepath.Join(a.s.secretDir, base+"-tmp"))
				c2 := newHostCanary(a.t, filepath.Join("/etc/ssl", base+"-etc"))
				a.t.Cleanup(func() { os.Remove(c2.path) })
				c3 := newHostCanary(a.t, filepath.Join(a.s.stateDir, base+"-state"))
				a.t.Cleanup(func() { os.Remove(c3.path) })
				secrets := []string{strings.TrimSpace(c1.content), strings.TrimSpace(c2.content), strings.TrimSpace(c3.content)}
				paths := []string{c1.path, c2.path, c3.path, "/etc/ssl/certs/../" + filepath.Base(c2.path),
					"/etc/alternatives/../ssl/" + filepath.Base(c2.path), "/usr/../etc/ssl/" + filepath.Base(c2.path),
					"/workspace/../../../../" + c3.path}
				a.scanFor(secrets, []string{base}, paths...)
				a.sh("ln -s " + c1.path + " /workspace/l1; ln -s " + c2.path + " /workspace/l2; ln -s " + c3.path + " /workspace/l3; ln -s ../../../.." + c1.path + " /workspace/l4")
				a.noSecretVia(secrets, append(paths, "/workspace/l1", "/workspace/l2", "/workspace/l3", "/workspace/l4")...)
				for _, c := range []hostCanary{c1, c2, c3} {
					c.intact(a.t)
				}
			},
		},
		{
			name: "secret-token-file",
			does: "looks for the server's token file (given to the server as AGENTBOX_TOKEN_FILE) and the default token file /root/.config/agentbox/token by path, by ../ and through symlinks and the files API, and for the token's value anywhere it can read",
			want: "the token's value is never seen; the token file is unchanged and still mode 0600",
			run: func(a *arena) {
				secrets := []string{a.s.token}
				paths := []string{a.s.tokenFile, "/workspace/../../../" + a.s.tokenFile, "/root/.config/agentbox/token", "/home/agent/.config/agentbox/token"}
				a.scanFor(secrets, nil, paths...)
				a.sh("ln -s " + a.s.tokenFile + " /workspace/tok; ln -s /root/.config/agentbox/token /workspace/tok2")
				a.noSecretVia(secrets, append(paths, "/workspace/tok", "/workspace/tok2")...)
				fi, err := os.Stat(a.s.tokenFile)
				b, _ := os.ReadFile(a.s.tokenFile)
				if err != nil || fi.Mode().Perm() != 0o600 || strings.TrimSpace(string(b)) != a.s.token {
					a.t.Errorf("HOST token file changed: %v %v %q", fi.Mode(), err, b)
				}
			},
		},
	}
}
