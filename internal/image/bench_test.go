package image_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/imagelab"
)

// BenchmarkPull200MiB pulls and unpacks a 200 MiB image of random files in 4 layers from the
// loopback registry into a fresh cache each time; the MB/s column is the figure (≥ 150 MiB/s).
func BenchmarkPull200MiB(b *testing.B) {
	testenv.RequireRoot(b)
	reg := imagelab.Start(b)
	img, err := imagelab.RandomImage(4, 50<<20, 4<<20, 1)
	if err != nil {
		b.Fatal(err)
	}
	reg.Push(b, "bench/random:1", img)
	ctx := context.Background()
	b.SetBytes(200 << 20)
	dir := b.TempDir()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		s, err := image.Open(filepath.Join(dir, fmt.Sprint(i)), image.Options{})
		if err != nil {
			b.Fatal(err)
		}
		got, err := s.Pull(ctx, reg.Ref("bench/random:1"), nil)
		if err != nil {
			b.Fatal(err)
		}
		if got.Size < 200<<20 {
			b.Fatalf("unpacked %d bytes", got.Size)
		}
		b.StopTimer()
		if _, err := s.Prune(ctx, true); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
