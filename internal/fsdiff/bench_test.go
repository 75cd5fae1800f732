//go:build linux

package fsdiff

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// cpuTime is this process's user+system CPU time: on a shared, loaded machine it says more
// than the wall time.
func cpuTime() int64 {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// loop runs f b.N times and reports the CPU time per run as cpu-ms/op.
func loop(b *testing.B, f func()) {
	start := cpuTime()
	for b.Loop() {
		f()
	}
	b.ReportMetric(float64(cpuTime()-start)/1e6/float64(b.N), "cpu-ms/op")
}

// tree10k fills dir with 10,000 files of 1 KiB in 100 directories.
func tree10k(b *testing.B, dir string) {
	data := make([]byte, 1024)
	for d := range 100 {
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", d))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 100 {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d", f)), data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkDiff10k measures, on 10,000 files of 1 KiB: a diff against the image (a walk of
// one side), against an identical copy (both walked, every file's content compared: 20 MiB
// read), and a manifest (exec changes takes two).
func BenchmarkDiff10k(b *testing.B) {
	a, c := b.TempDir(), b.TempDir()
	tree10k(b, a)
	tree10k(b, c)
	ctx := context.Background()
	side := func(d string) []Tree { return []Tree{{Path: "/workspace", Dir: d}} }
	b.Run("image", func(b *testing.B) {
		loop(b, func() {
			if _, err := Diff(ctx, nil, side(a), Options{Limit: 1000}); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("copy", func(b *testing.B) {
		loop(b, func() {
			res, err := Diff(ctx, side(c), side(a), Options{Limit: 1000})
			if err != nil || len(res.Changes) != 0 || res.ContentFallback {
				b.Fatal(err, len(res.Changes))
			}
		})
	})
	b.Run("manifest", func(b *testing.B) {
		loop(b, func() {
			if _, err := BuildManifest(ctx, side(a), "", Limits{}); err != nil {
				b.Fatal(err)
			}
		})
	})
}
