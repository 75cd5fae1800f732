package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestSandboxDisksMiB: the default disk budget adds back what the disks of sandboxes to be
// adopted occupy (their allocated blocks, not their sparse size), and nothing else.
func TestSandboxDisksMiB(t *testing.T) {
	dir := t.TempDir()
	write := func(rel string, size int64, data int) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(bytes.Repeat([]byte{1}, data)); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if got := sandboxDisksMiB(dir); got != 0 {
		t.Fatalf("empty state dir: %d MiB", got)
	}
	write("runtimes/runc/sandboxes/sb-a/disk.img", 1<<30, 48<<20)     // sparse 1 GiB, 48 MiB written
	write("runtimes/gvisor/sandboxes/sb-b/disk.img", 1<<30, 16<<20)   // 16 MiB written
	write("runtimes/runc/disk-templates/ext4-x-1024m.img", 0, 32<<20) // not a sandbox's disk
	write("agentbox.db", 0, 8<<20)
	got := sandboxDisksMiB(dir)
	// ext4/xfs may allocate a little more than was written (metadata blocks are not counted,
	// preallocation can be).
	if got < 64 || got > 66 {
		t.Fatalf("sandbox disks occupy %d MiB, want 64 (48 + 16; templates and the database not counted)", got)
	}
	b, err := defaultDiskBudgetMB(dir)
	if err != nil || b < 1024 {
		t.Fatalf("default budget %d MiB: %v", b, err)
	}
}
