package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

// The sleep/wake figures on gVisor, at the runtime (no control plane): an idle sandbox
// with 64 MiB resident (a file of random bytes on its tmpfs, held in the sentry's memory, and a
// job sleeping) is put to sleep (a files+memory snapshot with Release: runsc checkpoint, the
// sandbox ended, its disk moved into the snapshot) and woken (runsc restore under the same id
// from the snapshot's disk in place, until its agent answers an exec), cycle after cycle.
// Between the two, the host memory the sleeping sandbox still holds is measured: the resident
// memory of every process naming its bundle plus its memory cgroups' usage (0 when nothing is
// left). The floor of the same run is gVisor's plain create → first exec.

type sleepFlagSet struct {
	only     *bool
	cycles   *int
	resident *int
}

func sleepFlags() sleepFlagSet {
	return sleepFlagSet{
		only:     flag.Bool("sleep-only", false, "measure only gVisor's sleep/wake figures (writes -out only if it is not the default bench/results.json)"),
		cycles:   flag.Int("sleep-cycles", 10, "gVisor sleep → wake cycles timed (0 skips)"),
		resident: flag.Int("sleep-resident-mb", 64, "MiB resident in the sandbox put to sleep"),
	}
}

// runSleep measures the sleep/wake figures on the runtime named gvisor among rts, whose Root
// is root; it records a skip when there is none or it takes no memory snapshots.
func runSleep(ctx context.Context, rts []runtime.Runtime, root string, res *Results, f sleepFlagSet) {
	if *f.cycles <= 0 {
		return
	}
	var rt runtime.Runtime
	for _, r := range rts {
		if r.Name() == "gvisor" {
			rt = r
		}
	}
	if rt == nil {
		res.Skipped["sleep"] = "gVisor is not measured in this run"
		return
	}
	snap, ok := rt.(runtime.Snapshotter)
	if c := rt.Capabilities(); !ok || !strings.Contains(strings.Join(c.Snapshots, ","), runtime.SnapshotFilesMemory) {
		res.Skipped["sleep"] = "gVisor takes no memory snapshots here: " + c.MemorySnapshotReason
		return
	}
	stats, err := benchSleep(ctx, rt, snap, root, *f.cycles, *f.resident)
	if err != nil { // not fatal: the sandboxes are deleted (benchSleep's defers), the rest goes on
		log.Printf("sleep/wake: %v", err)
		res.Skipped["sleep"] = "failed: " + err.Error()
		return
	}
	res.Stats = append(res.Stats, stats...)
}

func benchSleep(ctx context.Context, rt runtime.Runtime, snap runtime.Snapshotter, root string, cycles, residentMB int) ([]Stat, error) {
	spec := runtime.Spec{ID: sandboxid.New(), Image: "host", CPU: 1, MemoryMB: 256 + int64(residentMB), DiskMB: 1024, PidsLimit: 256,
		IDMap: benchIDMap()}
	// The floor: a plain create → first exec of the same spec, in turns with the cycles.
	var floor, sleeps, wakes, held, image []float64
	fspec := spec
	defer rt.Delete(context.WithoutCancel(ctx), spec.ID)
	if err := createFirstExec(ctx, rt, spec); err != nil {
		return nil, err
	}
	c, err := agentClient(ctx, rt, spec.ID)
	if err != nil {
		return nil, err
	}
	fill := fmt.Sprintf("head -c %d /dev/urandom > /tmp/resident && sleep 1000000", residentMB<<20)
	if _, err := c.StartJob(ctx, guest.JobStartRequest{JobID: "job-5ee95ee95ee9", Argv: []string{"sh", "-c", fill}}); err != nil {
		return nil, err
	}
	want := strconv.Itoa(residentMB << 20)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		r, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{"stat", "-c", "%s", "/tmp/resident"}, TimeoutMs: 20000}, nil)
		if err == nil && strings.TrimSpace(string(r.Stdout)) == want {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the sandbox did not fill %d MiB within a minute: %+v %v", residentMB, r, err)
		}
	}
	c.Close()
	time.Sleep(500 * time.Millisecond) // idle
	for i := 0; i < cycles; i++ {
		fspec.ID, fspec.IDMap = sandboxid.New(), benchIDMap()
		t0 := time.Now()
		if err := createFirstExec(ctx, rt, fspec); err != nil { // deletes it on failure
			return nil, err
		}
		floor = append(floor, ms(time.Since(t0)))
		if err := rt.Delete(ctx, fspec.ID); err != nil {
			return nil, err
		}

		dir, err := os.MkdirTemp(root, "snap")
		if err != nil {
			return nil, err
		}
		t0 = time.Now()
		defer os.RemoveAll(dir)
		info, err := snap.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{Memory: true, Release: true})
		if err != nil {
			return nil, fmt.Errorf("sleep: %w", err)
		}
		sleeps = append(sleeps, ms(time.Since(t0)))
		held = append(held, hostMemoryOf(root, spec.ID))
		image = append(image, float64(info.SizeBytes)/(1<<20))

		wspec := spec
		wspec.Snapshot = &runtime.SnapshotSource{Dir: dir, Info: info, Memory: true, InPlace: true}
		t0 = time.Now()
		if err := createFirstExec(ctx, rt, wspec); err != nil {
			return nil, fmt.Errorf("wake: %w", err)
		}
		wakes = append(wakes, ms(time.Since(t0)))
		if err := os.RemoveAll(dir); err != nil { // the control plane's part once woken
			return nil, err
		}
	}
	// The woken sandbox still holds what it held.
	c, err = agentClient(ctx, rt, spec.ID)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if r, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{"stat", "-c", "%s", "/tmp/resident"}, TimeoutMs: 20000}, nil); err != nil || strings.TrimSpace(string(r.Stdout)) != want {
		return nil, fmt.Errorf("after %d cycles the sandbox's resident file is %+v %v", cycles, r, err)
	}
	label := fmt.Sprintf("(idle, %d MiB resident)", residentMB)
	out := []Stat{
		summarize("gvisor create → first exec (sleep/wake floor)", "ms", floor),
		summarize("gvisor sleep "+label, "ms", sleeps),
		summarize("gvisor wake → first exec "+label, "ms", wakes),
		summarize("host memory held by a sleeping sandbox", "MiB", held),
		summarize("sleeping sandbox's snapshot on disk "+label, "MiB", image),
	}
	fl := fmt.Sprintf("gvisor create → first exec p50 %.1f ms", out[0].P50)
	for i := range out {
		out[i].Runtime = "gvisor"
		if i == 1 || i == 2 {
			out[i].Floor = fl
		}
	}
	return out, nil
}

// benchIDMap is a range of 65536 host ids as the control plane gives every gVisor sandbox
// (Capabilities.IDMappedFiles): a random 65536-aligned base in [2^31, 2^32-2^16).
func benchIDMap() runtime.IDMap {
	var b [4]byte
	_, _ = rand.Read(b[:])
	base := uint32(1<<31) + (binary.LittleEndian.Uint32(b[:])%(1<<15-1))<<16
	return runtime.IDMap{UIDBase: base, GIDBase: base, Count: 1 << 16}
}

func agentClient(ctx context.Context, rt runtime.Runtime, id string) (*guest.Client, error) {
	dial, err := rt.Agent(ctx, id)
	if err != nil {
		return nil, err
	}
	return guest.NewClient(guest.Dialer(dial)), nil
}

// hostMemoryOf is what sandbox id holds of the host's memory, in MiB: the resident memory
// (VmRSS) of every process whose command line names its bundle, plus the usage of its memory
// cgroups (v1 and v2) where they exist.
func hostMemoryOf(root, id string) float64 {
	bundle := filepath.Join(root, "sandboxes", id)
	var kib float64
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmd, err := os.ReadFile(p + "/cmdline")
		if err != nil || !strings.Contains(string(cmd), bundle) {
			continue
		}
		st, _ := os.ReadFile(p + "/status")
		for _, l := range strings.Split(string(st), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				v, _ := strconv.ParseFloat(f[1], 64)
				kib += v
			}
		}
	}
	mib := kib / 1024
	for _, pat := range []string{"/sys/fs/cgroup/memory/*/" + id + "/memory.usage_in_bytes", "/sys/fs/cgroup/*/" + id + "/memory.current"} {
		files, _ := filepath.Glob(pat)
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil {
				v, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
				mib += v / (1 << 20)
			}
		}
	}
	return mib
}
