package oci

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// TestRootfsFirstExecLatency measures create → first exec (Run, agent ready, `true` run) of
// image host with an id range, as a server makes them, and, where the runtime takes OCI images,
// of a busybox image, alternating, and logs the medians (AGENTBOX_LATENCY_N rounds, default 9).
func TestRootfsFirstExecLatency(t *testing.T) {
	rt := newRunc(t)
	ctx := context.Background()
	var layers []string
	if slices.Contains(rt.Capabilities().Images, runtime.ImageOCI) {
		layers = buildTestLayers(t, filepath.Join(rt.root, "layers"))
	}
	n := 9
	if s := os.Getenv("AGENTBOX_LATENCY_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > 1000 {
			t.Fatalf("AGENTBOX_LATENCY_N=%q must be 1..1000", s)
		}
		n = v
	}
	once := func(image bool) time.Duration {
		spec := runtimetest.DefaultSpec(runtimetest.NewID())
		spec.IDMap = runtimetest.TestIDMap()
		if image {
			spec.Image, spec.Rootfs = "test/busybox:1", &runtime.Rootfs{Layers: layers}
		}
		t.Cleanup(func() { _ = rt.Delete(context.Background(), spec.ID) })
		t0 := time.Now()
		if _, err := runtime.CreateAndStart(ctx, rt, spec); err != nil {
			t.Fatal(err)
		}
		c := runtimetest.Client(t, rt, spec.ID)
		rctx, cancel := context.WithTimeout(ctx, runtimetest.ReadyTimeout)
		err := c.WaitReady(rctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{"true"}, TimeoutMs: 10000}, nil)
		d := time.Since(t0)
		c.Close()
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec true: %+v %v", res, err)
		}
		if err := rt.Delete(ctx, spec.ID); err != nil {
			t.Fatal(err)
		}
		return d
	}
	once(false) // warm: the shared rootfs, the disk template
	var host, img []time.Duration
	for range n {
		host = append(host, once(false))
		if layers != nil {
			img = append(img, once(true))
		}
	}
	med := func(d []time.Duration) time.Duration {
		if len(d) == 0 {
			return 0
		}
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	t.Logf("create → first exec, median of %d: image host %v, OCI image %v (host: %v; image: %v)", n, med(host), med(img), host, img)
}
