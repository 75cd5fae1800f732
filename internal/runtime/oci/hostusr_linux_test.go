package oci

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestRootfsHostUsrWritable: on image host, what the sandbox's root writes to /usr (a program
// in /usr/local/bin, a module in python's site-packages) and /etc/ssl/certs lands in the
// sandbox's own layer on its disk, as its root's ids; the host's directories get no entry, a
// second sandbox sees none of it, the agent user still cannot write /usr, and Delete leaves
// no mount.
func TestRootfsHostUsrWritable(t *testing.T) {
	t.Parallel()
	for _, f := range []Flavor{FlavorRunc, FlavorCrun, FlavorGVisor} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			testRootfsHostUsrWritable(t, newFlavor(t, f))
		})
	}
}

func testRootfsHostUsrWritable(t *testing.T, rt *Runtime) {
	if !rt.overlay {
		t.Fatalf("runtime %s has no overlay roots here: %s", rt.name, rt.Capabilities().OCIImageReason)
	}
	name := "abusr-" + strings.TrimPrefix(runtimetest.NewID(), "sb-")
	hostBefore := map[string][]string{}
	for _, d := range []string{"/usr/local/bin", "/usr", "/etc/ssl/certs"} {
		hostBefore[d] = listDir(t, d)
	}
	m := runtimetest.TestIDMap()
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.IDMap = m
	c := runtimetest.Start(t, rt, spec)
	root := func(script string) runtimetest.Result {
		return runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", script}, User: "root", TimeoutMs: 60000})
	}
	want := func(res runtimetest.Result, stdout string) {
		t.Helper()
		if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != stdout {
			t.Errorf("%s, want stdout %q", res, stdout)
		}
	}
	// The host's /usr reads as root's inside; the agent user cannot write it.
	want(runtimetest.Exec(t, c, "stat", "-c", "%u:%g %a", "/usr", "/usr/bin/env"), "0:0 755\n0:0 755")
	for _, p := range []string{"/usr/x", "/usr/local/bin/x", "/etc/ssl/certs/x"} {
		if res := runtimetest.Exec(t, c, "touch", p); res.ExitCode == 0 {
			t.Errorf("the agent user created %s", p)
		}
	}
	// Root installs a program and a python module, and a certificate file.
	want(root(`set -e
printf '#!/bin/sh\necho installed\n' > /usr/local/bin/`+name+`
chmod 755 /usr/local/bin/`+name+`
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site"
echo 'X = 42' > "$site/`+strings.ReplaceAll(name, "-", "_")+`.py"
touch /etc/ssl/certs/`+name+`
echo ok`), "ok")
	want(runtimetest.Exec(t, c, name), "installed")
	want(runtimetest.Exec(t, c, "python3", "-c", "import "+strings.ReplaceAll(name, "-", "_")+" as m; print(m.X)"), "42")
	// It is in the sandbox's layer on its disk, as the sandbox's root; nothing on the host.
	layers := filepath.Join(rt.sandboxDir(spec.ID), diskMountName, diskRootfsDir, bindsDirName)
	for _, p := range []string{"usr/upper/local/bin/" + name, "etc-ssl-certs/upper/" + name} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(layers, p), &st); err != nil {
			t.Errorf("%s is not in the sandbox's layer: %v", p, err)
		} else if st.Uid != m.UIDBase || st.Gid != m.GIDBase {
			t.Errorf("%s is %d:%d on the host, want the sandbox's root %d", p, st.Uid, st.Gid, m.UIDBase)
		}
	}
	for d, before := range hostBefore {
		if after := listDir(t, d); !slices.Equal(after, before) {
			t.Errorf("HOLE: the host's %s changed: %v -> %v", d, before, after)
		}
	}
	if _, err := os.Lstat(filepath.Join("/usr/local/bin", name)); err == nil {
		t.Errorf("HOLE: /usr/local/bin/%s is on the host", name)
	}
	// A second sandbox sees none of it.
	spec2 := runtimetest.DefaultSpec(runtimetest.NewID())
	spec2.IDMap = runtimetest.TestIDMap()
	c2 := runtimetest.Start(t, rt, spec2)
	for _, p := range []string{"/usr/local/bin/" + name, "/etc/ssl/certs/" + name} {
		if res := runtimetest.Exec(t, c2, "test", "-e", p); res.ExitCode == 0 {
			t.Errorf("the second sandbox sees the first's %s", p)
		}
	}
	for _, id := range []string{spec.ID, spec2.ID} {
		if err := rt.Delete(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if leaks := testenv.Leaks(id); len(leaks) > 0 {
			t.Errorf("after Delete of %s: %v", id, leaks)
		}
		if err := rt.Delete(context.Background(), id); err != nil {
			t.Errorf("second Delete of %s: %v", id, err)
		}
	}
}

// listDir is dir's entry names, sorted.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
