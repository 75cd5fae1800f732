package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/testenv/imagelab"
	"github.com/agentbox/agentbox/internal/wire"
)

// The image figures: create → first exec from a cached image beside the host image, pull +
// unpack from a loopback registry beside `podman pull` of the same image, commit of a sandbox
// with 100 MiB written, and what a sandbox of a 500 MiB image costs on disk.

type imageFlags struct {
	only    *bool
	creates *int
	pullMiB *int
	pulls   *int
	commits *int
	diskMiB *int
}

func imagesFlags() imageFlags {
	return imageFlags{
		only:    flag.Bool("images-only", false, "measure only the image figures (writes -out only if it is not the default bench/results.json)"),
		creates: flag.Int("image-creates", 40, "creates → first exec per image (host and a cached busybox image, in turns; 0 skips the image figures)"),
		pullMiB: flag.Int("image-pull-mib", 200, "size of the pulled image (0 skips the pull figures)"),
		pulls:   flag.Int("image-pulls", 3, "timed pulls (agentbox and podman each)"),
		commits: flag.Int("image-commits", 3, "timed commits of a sandbox with 100 MiB written"),
		diskMiB: flag.Int("image-disk-mib", 500, "size of the image whose per-sandbox disk cost is measured (0 skips)"),
	}
}

// benchTB lets the bench use imagelab's builders, which take a testing.TB: a failure ends the
// bench.
type benchTB struct{ testing.TB }

func (benchTB) Helper()                           {}
func (benchTB) Fatal(args ...any)                 { log.Fatal(args...) }
func (benchTB) Fatalf(format string, args ...any) { log.Fatalf(format, args...) }
func (benchTB) Errorf(format string, args ...any) { log.Fatalf(format, args...) }
func (benchTB) Logf(format string, args ...any)   { log.Printf(format, args...) }
func (benchTB) Cleanup(func())                    {}

func runImages(ctx context.Context, c *client.Client, dir, rtRoot string, res *Results, f imageFlags) {
	if *f.creates <= 0 {
		return
	}
	reg, err := imagelab.NewRegistry()
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Close()
	reg.Push(benchTB{}, "bench/busybox:1", imagelab.Busybox(benchTB{}))
	busybox := reg.Ref("bench/busybox:1")
	if _, err := c.PullImage(ctx, busybox, nil); err != nil {
		log.Fatalf("pull %s: %v", busybox, err)
	}
	// Measured as every create figure is (coldCreate): each sandbox destroyed before the next.
	times := map[string][]float64{}
	for range *f.creates {
		for _, img := range []string{"host", busybox} {
			_, d, _ := mustColdCreate(ctx, c, wire.CreateRequest{Runtime: "runc", Image: img})
			times[img] = append(times[img], d)
		}
	}
	host := summarize("create → first exec (image host)", "ms", times["host"])
	bb := summarize("create → first exec (cached busybox image)", "ms", times[busybox])
	bb.Floor = fmt.Sprintf("host image p50 %.1f ms in turns (target: within 10%%: %+.1f%%)", host.P50, 100*(bb.P50/host.P50-1))
	host.Runtime, bb.Runtime = "runc", "runc"
	res.Stats = append(res.Stats, host, bb)

	if *f.pullMiB > 0 {
		st, ref, stop, err := runImagePull(ctx, dir, *f.pullMiB, 8, *f.pulls)
		if err != nil {
			log.Fatalf("image pull: %v", err)
		}
		if p, why := podmanPull(ctx, dir, ref, *f.pullMiB, *f.pulls); why != "" {
			res.Skipped["podman pull"] = why
		} else {
			st.Floor += fmt.Sprintf("; podman pull of the same image p50 %.0f MiB/s", p.P50)
			res.Stats = append(res.Stats, p)
		}
		stop()
		res.Stats = append(res.Stats, st)
	}

	// Commit: a busybox sandbox with 100 MiB written into its root.
	if *f.commits > 0 {
		sb, err := c.Create(ctx, wire.CreateRequest{Runtime: "runc", Image: busybox, DiskMB: 1024})
		if err != nil {
			log.Fatal(err)
		}
		if r, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"sh", "-c", "mkdir -p /opt/data && for i in 0 1 2 3 4 5 6 7 8 9; do dd if=/dev/urandom of=/opt/data/f$i bs=1M count=10 2>/dev/null || exit 1; done"}}, nil); err != nil || r.ExitCode != 0 {
			log.Fatalf("write 100 MiB: %v %+v", err, r)
		}
		var xs []float64
		for i := range *f.commits {
			// A new byte each time: an identical layer would be found in the cache, not made.
			if r, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"sh", "-c", fmt.Sprintf("echo %d > /opt/data/round", i)}}, nil); err != nil || r.ExitCode != 0 {
				log.Fatalf("mark the round: %v %+v", err, r)
			}
			t0 := time.Now()
			if _, err := c.Commit(ctx, sb.ID, fmt.Sprintf("bench/commit:%d", i)); err != nil {
				log.Fatalf("commit: %v", err)
			}
			xs = append(xs, time.Since(t0).Seconds())
		}
		c.Destroy(ctx, sb.ID)
		s := summarize("commit of a sandbox with 100 MiB written", "s", xs)
		s.Runtime, s.Floor = "runc", "≤ 2 s"
		res.Stats = append(res.Stats, s)
	}

	// Disk per sandbox of a large image: what its disk image holds once the sandbox runs.
	if *f.diskMiB > 0 {
		img, err := imagelab.RandomImage(5, int64(*f.diskMiB)<<20/5, 4<<20, 17)
		if err != nil {
			log.Fatal(err)
		}
		reg.Push(benchTB{}, "bench/large:1", img)
		ref := reg.Ref("bench/large:1")
		if _, err := c.PullImage(ctx, ref, nil); err != nil {
			log.Fatal(err)
		}
		var xs []float64
		var big []string
		for range 5 {
			sb, err := c.Create(ctx, wire.CreateRequest{Runtime: "runc", Image: ref})
			if err != nil {
				log.Fatal(err)
			}
			big = append(big, sb.ID)
			// The image has no shell: the files API lists its root (the agent answers).
			if _, err := c.ListDir(ctx, sb.ID, "/"); err != nil {
				log.Fatalf("list the root: %v", err)
			}
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(rtRoot, "sandboxes", sb.ID, "disk.img"), &st); err != nil {
				log.Fatal(err)
			}
			xs = append(xs, float64(st.Blocks*512)/(1<<20))
		}
		for _, id := range big {
			c.Destroy(ctx, id)
		}
		s := summarize(fmt.Sprintf("disk per sandbox of a %d MiB image (allocated blocks of its disk)", *f.diskMiB), "MiB", xs)
		s.Runtime, s.Floor = "runc", "only what it writes"
		res.Stats = append(res.Stats, s)
	}
}

// podmanPull times `podman pull --tls-verify=false ref` into a store of its own, n times; why
// says why not when podman is missing or fails.
func podmanPull(ctx context.Context, dir, ref string, mib, n int) (Stat, string) {
	bin, err := exec.LookPath("podman")
	if err != nil {
		return Stat{}, "podman is not installed (apt-get install podman)"
	}
	var xs []float64
	for i := range n {
		root := filepath.Join(dir, fmt.Sprintf("podman-%d", i))
		args := []string{"--root", root, "--runroot", root + "-run", "--storage-driver", "overlay", "pull", "-q", "--tls-verify=false", ref}
		t0 := time.Now()
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		d := time.Since(t0)
		if err != nil {
			return Stat{}, fmt.Sprintf("podman pull: %v: %s", err, strings.TrimSpace(string(out)))
		}
		xs = append(xs, float64(mib)/d.Seconds())
		_ = exec.CommandContext(ctx, bin, "--root", root, "--runroot", root+"-run", "--storage-driver", "overlay", "system", "reset", "-f").Run()
		_ = os.RemoveAll(root)
		_ = os.RemoveAll(root + "-run")
	}
	return summarize("podman pull of the same image (same registry)", "MiB/s", xs), ""
}
