package sandbox_test

import (
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestDiffRunc: sandbox_diff and exec changes on a real runc sandbox (root): the files a
// command wrote (text, binary, setuid, symlink, nested directories) against the image; against
// a snapshot exactly what changed since (content, mode, deletion); exec changes of one command.
func TestDiffRunc(t *testing.T) {
	testenv.RequireRoot(t)
	e := newEnv(t, sandbox.Config{SnapshotDir: filepath.Join(testenv.ShortTempDir(t, "abdif"), "snapshots")})
	sb := e.create(t, sandbox.CreateRequest{})
	e.exec(t, sb.ID, argv("sh", "-c", "cd /workspace && printf 'one\\ntwo\\n' > t.txt && printf '\\000\\001\\002' > b.bin && "+
		"ln -s /etc/passwd ln && mkdir -p n/e && printf x > n/e/f && printf s > suid && chmod 4755 suid"))
	res, err := e.snaps.Diff(t.Context(), sb.ID, sandbox.DiffRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := changeMap(res.Changes)
	for p, w := range map[string]string{"/workspace/t.txt": "added file 0644", "/workspace/b.bin": "added file 0644",
		"/workspace/ln": "added symlink 0777", "/workspace/n/e": "added dir 0755", "/workspace/n/e/f": "added file 0644",
		"/workspace/suid": "added file 4755"} {
		if got[p] != w {
			t.Errorf("against the image, %s: %q, want %q (all: %v)", p, got[p], w, got)
		}
	}
	for p := range got {
		if p == "/proc" || p == "/tmp" || p == "/dev" || p == "/sys" {
			t.Errorf("a volatile mount point is listed: %s", p)
		}
	}

	t.Logf("diff against the image: %d changes", len(res.Changes))
	snap, err := e.snaps.Snapshot(t.Context(), sb.ID, sandbox.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot %s taken", snap.ID)
	e.exec(t, sb.ID, argv("sh", "-c", "cd /workspace && printf 'one\\n2\\n' > t.txt && chmod 600 b.bin && rm n/e/f"))
	res, err = e.snaps.Diff(t.Context(), sb.ID, sandbox.DiffRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	got = changeMap(res.Changes)
	want := map[string]string{"/workspace/t.txt": "modified file 0644", "/workspace/b.bin": "modified file 0600",
		"/workspace/n/e/f": "deleted file 0644"} // a directory's mtime is no change of its own
	for p, w := range want {
		if got[p] != w {
			t.Errorf("against the snapshot, %s: %q, want %q", p, got[p], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("against the snapshot: %v, want %v", got, want)
	}

	ex, err := e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "printf z > /workspace/z && rm /workspace/ln"}, Changes: true}, nil)
	if err != nil || ex.ExitCode != 0 {
		t.Fatalf("exec changes: %v %+v", err, ex)
	}
	got = changeMap(ex.Changes)
	if got["/workspace/z"] != "added file 0644" || got["/workspace/ln"] != "deleted symlink 0777" || got["/workspace"] != "" {
		t.Errorf("exec changes: %v", got)
	}
}
