package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/testenv/imagelab"
)

// measureImagePull is the name of the image pull figure.
const measureImagePull = "image pull + unpack from the loopback registry"

// runImagePull times pulls of a random image of mib MiB in layers layers (incompressible
// files of 4 MiB) from an in-process registry on loopback into a fresh cache under dir, n
// times, and returns the MiB/s of each pull (Stat unit "MiB/s") and the registry's ref (for
// a `podman pull --tls-verify=false` of the same image beside it; the registry lives until
// stop is called). The lead wires it into main (a -image-pull-mib flag; 0 skips).
func runImagePull(ctx context.Context, dir string, mib, layers, n int) (st Stat, ref string, stop func(), err error) {
	reg, err := imagelab.NewRegistry()
	if err != nil {
		return st, "", nil, err
	}
	stop = reg.Close
	layerBytes := int64(mib) << 20 / int64(layers)
	img, err := imagelab.RandomImage(layers, layerBytes, 4<<20, 13)
	if err != nil {
		return st, "", stop, err
	}
	if _, err := reg.PushImage(ctx, "bench/random:1", img); err != nil {
		return st, "", stop, err
	}
	ref = reg.Ref("bench/random:1")
	var xs []float64
	for i := range n {
		cdir := filepath.Join(dir, fmt.Sprintf("image-pull-%d", i))
		s, err := image.Open(cdir, image.Options{})
		if err != nil {
			return st, ref, stop, err
		}
		t0 := time.Now()
		got, err := s.Pull(ctx, ref, nil)
		if err != nil {
			return st, ref, stop, err
		}
		d := time.Since(t0)
		xs = append(xs, float64(got.Size)/(1<<20)/d.Seconds())
		os.RemoveAll(cdir)
	}
	st = summarize(measureImagePull, "MiB/s", xs)
	st.Floor = "≥ 150 MiB/s"
	return st, ref, stop, nil
}
