package main

// Files snapshots at the runtime: a snapshot of a 1 GiB disk with 100 MiB written
// (target p50 ≤ 150 ms), beside its floor in the same run (cloneSparse's work done by
// `cp --sparse=always` of the same image, sandbox not frozen), and a fork of 5 sandboxes from
// it created at once, each until its agent answers (target ≤ 1 s in all).

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

type snapshotBenchFlags struct {
	only  *bool
	n     *int
	forks *int
}

func snapshotFlags() snapshotBenchFlags {
	return snapshotBenchFlags{
		only:  flag.Bool("snapshots-only", false, "measure only the files snapshot and fork figures on runc (prints them; writes -out only if it is not the default bench/results.json)"),
		n:     flag.Int("snapshots", 10, "timed files snapshots of a 1 GiB disk with 100 MiB written (0 skips the snapshot figures)"),
		forks: flag.Int("snapshot-forks", 5, "sandboxes created at once from the snapshot"),
	}
}

// Names of the snapshot figures.
const (
	measureSnapshot     = "files snapshot, 1 GiB disk, 100 MiB written"
	measureSnapshotFork = "create %d from a snapshot at once → every agent answers"
)

// benchSnapshots measures on rt (runc) under dir (the runtime's file system).
func benchSnapshots(ctx context.Context, rt runtime.Runtime, dir string, n, forks int) []Stat {
	snap, ok := rt.(runtime.Snapshotter)
	if !ok || n <= 0 {
		return nil
	}
	spec := runtime.Spec{ID: sandboxid.New(), Image: "host", CPU: 1, MemoryMB: 256, DiskMB: 1024, PidsLimit: 256}
	c, err := startWait(ctx, rt, spec)
	if err != nil {
		log.Fatalf("snapshot bench: %v", err)
	}
	defer rt.Delete(ctx, spec.ID)
	defer c.Close()
	res, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", "head -c 104857600 /dev/urandom > /workspace/blob && sync"}, TimeoutMs: 120000}, nil)
	if err != nil || res.ExitCode != 0 {
		log.Fatalf("snapshot bench: write 100 MiB: %v %+v", err, res)
	}
	base := filepath.Join(dir, "snapshots")
	if err := os.MkdirAll(base, 0o700); err != nil {
		log.Fatal(err)
	}
	img := filepath.Join(dir, string(rtName(rt)), "sandboxes", spec.ID, "disk.img")
	var snaps, floors []float64
	var last string
	var info runtime.SnapshotInfo
	for i := 0; i < n; i++ {
		sdir := filepath.Join(base, fmt.Sprintf("s%d", i))
		if err := os.Mkdir(sdir, 0o700); err != nil {
			log.Fatal(err)
		}
		t0 := time.Now()
		info, err = snap.Snapshot(ctx, spec.ID, sdir, runtime.SnapshotOptions{})
		if err != nil {
			log.Fatalf("snapshot: %v", err)
		}
		snaps = append(snaps, ms(time.Since(t0)))
		if last != "" {
			os.RemoveAll(last)
		}
		last = sdir
		// The floor: the same image's data copied by cp, then fsynced as Snapshot does.
		fl := filepath.Join(base, "floor.img")
		t0 = time.Now()
		if out, err := exec.CommandContext(ctx, "cp", "--sparse=always", img, fl).CombinedOutput(); err != nil {
			log.Fatalf("cp --sparse=always: %v %s", err, out)
		}
		if f, err := os.Open(fl); err == nil {
			_ = f.Sync()
			f.Close()
		}
		floors = append(floors, ms(time.Since(t0)))
		os.Remove(fl)
	}
	st := summarize(measureSnapshot, "ms", snaps)
	st.Runtime = rt.Name()
	fs := summarize("cp --sparse=always + fsync of the same image", "ms", floors)
	st.Floor = fmt.Sprintf("%s p50 %.1f ms (size %d MiB allocated)", fs.Name, fs.P50, info.SizeBytes>>20)
	stats := []Stat{st}

	// Fork: forks sandboxes from the last snapshot at once, beside its floor in the same run:
	// as many fresh sandboxes (no snapshot) created at once.
	fresh := createMany(ctx, rt, spec, nil, forks)
	copies := copyMany(ctx, filepath.Join(last, "disk.img"), base, forks)
	took := createMany(ctx, rt, spec, &runtime.SnapshotSource{Dir: last, Info: info}, forks)
	fk := summarize(fmt.Sprintf(measureSnapshotFork, forks), "ms", []float64{took})
	fk.Runtime = rt.Name()
	fk.Floor = fmt.Sprintf("%d fresh sandboxes created at once: %.1f ms; %d `cp --sparse=always` of the image at once: %.1f ms", forks, fresh, forks, copies)
	stats = append(stats, fk)
	os.RemoveAll(base)
	return stats
}

// rtName is the runtime's name as its root's directory is named in the bench (main.go).
func rtName(rt runtime.Runtime) string { return rt.Name() }

// startWait creates and starts spec and waits for its agent.
func startWait(ctx context.Context, rt runtime.Runtime, spec runtime.Spec) (*guest.Client, error) {
	if _, err := runtime.CreateAndStart(ctx, rt, spec); err != nil {
		_ = rt.Delete(ctx, spec.ID)
		return nil, err
	}
	dial, err := rt.Agent(ctx, spec.ID)
	if err != nil {
		return nil, err
	}
	c := guest.NewClient(guest.Dialer(dial))
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := c.WaitReady(rctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// createMany creates n sandboxes like spec (from src when set) at once, waits for every agent,
// and returns the time in ms; it deletes them.
func createMany(ctx context.Context, rt runtime.Runtime, spec runtime.Spec, src *runtime.SnapshotSource, n int) float64 {
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		ids[i] = sandboxid.New()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := spec
			s.ID, s.Snapshot = ids[i], src
			c, err := startWait(ctx, rt, s)
			if c != nil {
				c.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	took := ms(time.Since(t0))
	for _, id := range ids {
		_ = rt.Delete(ctx, id)
	}
	for i, err := range errs {
		if err != nil {
			log.Fatalf("create %d of %d (from a snapshot: %v): %v", i, n, src != nil, err)
		}
	}
	return took
}

// copyMany copies img n times at once with `cp --sparse=always` into dir (the data a fork on a
// file system without reflinks must write) and returns the time in ms; it removes the copies.
func copyMany(ctx context.Context, img, dir string, n int) float64 {
	var wg sync.WaitGroup
	errs := make([]error, n)
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := exec.CommandContext(ctx, "cp", "--sparse=always", img, filepath.Join(dir, fmt.Sprintf("copy%d.img", i))).CombinedOutput()
			if err != nil {
				errs[i] = fmt.Errorf("%v: %s", err, out)
			}
		}()
	}
	wg.Wait()
	took := ms(time.Since(t0))
	for i, err := range errs {
		if err != nil {
			log.Fatalf("cp of the snapshot's image: %v", err)
		}
		os.Remove(filepath.Join(dir, fmt.Sprintf("copy%d.img", i)))
	}
	return took
}
