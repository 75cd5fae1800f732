package microvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/mountns"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/microvm/vminit"
)

// keepImageRoots is how many OCI image roots the cache keeps beside those a sandbox uses: the
// most recently used, so that the next sandbox of a recent image boots without a rebuild.
const keepImageRoots = 4

// imageRootPrefix names an OCI image's root disk in the cache: image-oci-<hash of its layers>.ext4.
const imageRootPrefix = "image-oci-"

// imageRoot returns the read-only root disk of an OCI image whose unpacked layers are rootfs's:
// an ext4 image of the layers merged (the image's own file ids, which the VM's kernel shows
// as they are), built once per set of layers and kept in the cache. The caller holds assetsMu.
func (r *Runtime) imageRoot(ctx context.Context, rootfs *runtime.Rootfs) (string, error) {
	if len(rootfs.Layers) == 0 {
		return "", errcode.New(errcode.InvalidArgument, "the image has no layers")
	}
	h := sha256.New()
	fmt.Fprintf(h, "oci image %s\x00", assetsVersion)
	for _, l := range rootfs.Layers {
		fmt.Fprintf(h, "%s\x00", l)
	}
	path := filepath.Join(r.cfg.Root, "cache", imageRootPrefix+hex.EncodeToString(h.Sum(nil))[:16]+".ext4")
	if _, err := os.Stat(path); err == nil {
		now := time.Now()
		_ = os.Chtimes(path, now, now) // recently used: kept by the prune below
		return path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	var total int64
	for _, l := range rootfs.Layers {
		_ = filepath.WalkDir(l, func(_ string, d fs.DirEntry, err error) error {
			if err == nil {
				if fi, err := d.Info(); err == nil {
					total += fi.Size() + 4096
				}
			}
			return nil
		})
	}
	// The layers' sum bounds the merged tree (whiteouts and replaced files only shrink it);
	// a quarter more and 64 MiB hold ext4's own metadata.
	sizeMB := total*5/4>>20 + 64
	if err := mkfsMerged(ctx, path, rootfs.Layers, sizeMB); err != nil {
		return "", fmt.Errorf("the image's root disk: %w", err)
	}
	r.pruneImageRoots(path)
	return path, nil
}

// mkfsMerged makes path an ext4 image (read-only, no journal) of layers, lowest first, merged as
// overlayfs merges them: mkfs.ext4 copies the tree from a read-only overlay mounted in a mount
// namespace of its own, so nothing stays mounted whatever becomes of this process.
func mkfsMerged(ctx context.Context, path string, layers []string, sizeMB int64) error {
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	mnt, err := os.MkdirTemp(filepath.Dir(path), ".merge-*")
	if err != nil {
		return err
	}
	defer os.Remove(mnt)
	cmd := mkfsCmd(ctx, tmp, mnt, sizeMB, vminit.RootLabel, true)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	lower := slices.Clone(layers)
	slices.Reverse(lower) // overlayfs names the top layer first
	if len(lower) == 1 {
		// One layer: overlayfs wants two lower dirs without an upper; an empty one below does.
		empty, err := os.MkdirTemp(filepath.Dir(path), ".empty-*")
		if err != nil {
			return err
		}
		defer os.Remove(empty)
		lower = append(lower, empty)
	}
	opts := "lowerdir=" + strings.Join(lower, ":")
	if len(opts) >= os.Getpagesize() {
		return errcode.New(errcode.InvalidArgument, "the image has %d layers, more than the vm runtime can merge in one mount; flatten it (fewer layers) or run it on runc, crun or gvisor", len(layers))
	}
	err = mountns.Start(cmd, func() error {
		if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, opts); err != nil {
			return fmt.Errorf("mount the image's layers: %w", err)
		}
		return nil
	})
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("mkfs.ext4: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return os.Rename(tmp, path)
}

// pruneImageRoots removes the cached OCI image roots beyond the keepImageRoots most recently
// used that no sandbox of this runtime boots from; just (the root just built) stays.
func (r *Runtime) pruneImageRoots(just string) {
	cache := filepath.Join(r.cfg.Root, "cache")
	paths, _ := filepath.Glob(filepath.Join(cache, imageRootPrefix+"*.ext4"))
	type root struct {
		path string
		used time.Time
	}
	var roots []root
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			roots = append(roots, root{p, fi.ModTime()})
		}
	}
	slices.SortFunc(roots, func(a, b root) int { return b.used.Compare(a.used) })
	inUse := map[string]bool{just: true}
	ids, _ := r.List(context.Background())
	for _, id := range ids {
		if rec, err := r.readRecord(id); err == nil {
			inUse[rec.RootDisk] = true
		}
	}
	for i, rt := range roots {
		if i < keepImageRoots || inUse[rt.path] {
			continue
		}
		if err := os.Remove(rt.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("vm runtime: remove an unused image root", "path", rt.path, "err", err)
		}
	}
}
