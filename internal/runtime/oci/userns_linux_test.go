package oci

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// bindSource is where on the host the sandbox's spec binds dest from.
func bindSource(t *testing.T, rt *Runtime, id, dest string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rt.sandboxDir(id), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	for _, m := range s.Mounts {
		if m.Destination == dest {
			return m.Source
		}
	}
	t.Fatalf("no bind at %s", dest)
	return ""
}

func hostOwner(t *testing.T, path string) (uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

// TestRuncUserNamespaceHostView: what a sandbox with an id range writes belongs to the range on
// the host, and the agent's socket to the range's root.
func TestRuncUserNamespaceHostView(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	m := runtimetest.TestIDMap()
	spec.IDMap = m
	c := runtimetest.Start(t, rt, spec)
	res := runtimetest.Exec(t, c, "sh", "-c", "echo hi > /workspace/by-agent && mkdir /home/agent/d && ls -ln /workspace/by-agent")
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, " 1000 1000 ") {
		t.Fatalf("inside: %+v", res)
	}
	res = runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"touch", "/workspace/by-root"}, User: "root", TimeoutMs: 60000})
	if res.ExitCode != 0 {
		t.Fatalf("root writing the workspace: %+v", res)
	}
	if _, err := c.WriteFile(context.Background(), "/workspace/by-api", 0o644, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	ws, home, run := bindSource(t, rt, id, workspaceDir), bindSource(t, rt, id, agentHome), bindSource(t, rt, id, guestRunDir)
	agent := m.UIDBase + agentUID
	for _, tc := range []struct {
		path string
		uid  uint32
	}{
		{ws, agent}, {home, agent}, {filepath.Join(ws, "by-agent"), agent}, {filepath.Join(home, "d"), agent},
		{filepath.Join(ws, "by-api"), agent}, {filepath.Join(ws, "by-root"), m.UIDBase},
		{run, m.UIDBase}, {filepath.Join(run, "agent.sock"), m.UIDBase},
	} {
		if uid, gid := hostOwner(t, tc.path); uid != tc.uid || gid != tc.uid-m.UIDBase+m.GIDBase {
			t.Errorf("%s is owned by %d:%d on the host, want %d", tc.path, uid, gid, tc.uid)
		}
	}
	// The directories above the sandbox's are searchable, not listable.
	for _, d := range rt.searchableDirs() {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o711 {
			t.Errorf("%s: %v %v, want 0711", d, fi.Mode(), err)
		}
	}
}

// TestOwnWritableBindsWithoutMap: without an id range the agent user is host uid 1000 and the
// socket directory stays root's, as before user namespaces.
func TestOwnWritableBindsWithoutMap(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("chown needs root (CI runs as root)")
	}
	dir := t.TempDir()
	s := &specs.Spec{}
	want := map[string]uint32{}
	for dest, uid := range map[string]uint32{guestRunDir: 0, workspaceDir: agentUID, agentHome: agentUID, "/other": 0} {
		src := filepath.Join(dir, strings.ReplaceAll(dest, "/", "_"))
		if err := os.Mkdir(src, 0o755); err != nil {
			t.Fatal(err)
		}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: dest, Type: "bind", Source: src})
		want[src] = uid
	}
	if err := ownWritableBinds(s, runtime.IDMap{}); err != nil {
		t.Fatal(err)
	}
	for src, uid := range want {
		if got, _ := hostOwner(t, src); got != uid {
			t.Errorf("%s owned by %d, want %d", src, got, uid)
		}
	}
}

func TestCheckIDMap(t *testing.T) {
	t.Parallel()
	with := &Runtime{name: "runc", caps: runtime.Capabilities{UserNamespaces: true}}
	without := &Runtime{name: "gvisor"}
	ok := runtime.IDMap{UIDBase: 200000, GIDBase: 200000, Count: 65536}
	if err := with.checkIDMap(ok); err != nil {
		t.Errorf("valid map: %v", err)
	}
	for _, r := range []*Runtime{with, without} {
		if err := r.checkIDMap(runtime.IDMap{}); err != nil {
			t.Errorf("%s, no map: %v", r.name, err)
		}
	}
	if err := without.checkIDMap(ok); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("a map for a runtime without user namespaces: %v", err)
	}
	for _, m := range []runtime.IDMap{
		{UIDBase: 200000, GIDBase: 200000, Count: 1000},
		{UIDBase: 1<<32 - 65536, GIDBase: 200000, Count: 65536},
		{UIDBase: 200000, GIDBase: 1<<32 - 1000, Count: 65536},
	} {
		if err := with.checkIDMap(m); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("map %+v: %v", m, err)
		}
	}
	uids, gids := FlavorRunc.idMappings(runtime.IDMap{UIDBase: 300000, GIDBase: 400000, Count: 65536})
	if len(uids) != 1 || uids[0] != (specs.LinuxIDMapping{ContainerID: 0, HostID: 300000, Size: 65536}) ||
		len(gids) != 1 || gids[0] != (specs.LinuxIDMapping{ContainerID: 0, HostID: 400000, Size: 65536}) {
		t.Errorf("mappings %v %v", uids, gids)
	}
	if u, g := FlavorRunc.idMappings(runtime.IDMap{}); u != nil || g != nil {
		t.Errorf("mappings without a map: %v %v", u, g)
	}
}

// TestUserNamespaceNeedsSearchableRoot: a Root below a directory sandboxes cannot search makes
// the runtime unavailable, saying what to change.
func TestUserNamespaceNeedsSearchableRoot(t *testing.T) {
	t.Parallel()
	if reason := runcUsable(); reason != "" {
		t.Skip(reason)
	}
	dir, err := os.MkdirTemp("", "abns") // 0700
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	rt, err := New(context.Background(), Config{Root: filepath.Join(dir, "rt"), GuestBinary: "/bin/true", CgroupParent: "abns-" + filepath.Base(dir)})
	if err != nil {
		t.Fatal(err)
	}
	if c := rt.Capabilities(); c.Available || !strings.Contains(c.Reason, "chmod o+x "+dir) {
		t.Fatalf("capabilities %+v", c)
	}
}
