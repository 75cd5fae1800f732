package kubernetes

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// GuestImageRepo is the repository of the guest image agentbox builds: a name no registry
// serves, so that a node uses only the image imported into it (or pushed where it pulls).
const GuestImageRepo = "localhost/agentbox-guest"

// ImageFile is one entry of an image WriteImage builds: a host file copied to Path, or, with
// Link, a symbolic link; directories above it are made.
type ImageFile struct {
	Path   string // absolute, in the image
	Source string // the host file whose bytes it holds
	Mode   int64
	Link   string
}

// GuestImageTag is the guest image's reference for agentbox binary bin: the version and the
// first 12 hex digits of the binary's sha256, so that a node never runs another build's agent
// under the same name.
func GuestImageTag(version, bin string) (string, error) {
	f, err := os.Open(bin)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	v := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, version)
	return fmt.Sprintf("%s:%s-%s", GuestImageRepo, v, hex.EncodeToString(h.Sum(nil))[:12]), nil
}

// WriteGuestImage writes the guest image of agentbox binary bin, tagged tag, as a `docker
// save` tarball to out (`ctr -n k8s.io images import out` on a node; or push it to a registry
// the cluster pulls from). Its /agentbox is bin; its entrypoint installs it (guest-install).
func WriteGuestImage(bin, tag, out string) error {
	return WriteImage(out, tag, []ImageFile{{Path: "/agentbox", Source: bin, Mode: 0o555}}, []string{"/agentbox", "guest-install"})
}

// WriteImage writes a one-layer linux image of files, tagged tag, as a tarball to out.
func WriteImage(out, tag string, files []ImageFile, entrypoint []string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("image tag %q: %w", tag, err)
	}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return fmt.Errorf("image file %q: the path must be absolute and clean", f.Path)
		}
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeLayer(pw, files)) }()
		return pr, nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goruntime.GOARCH
	cf.Config.Entrypoint = entrypoint
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, out)
}

func writeLayer(w io.Writer, files []ImageFile) error {
	tw := tar.NewWriter(w)
	dirs := map[string]bool{}
	epoch := time.Unix(0, 0)
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.Path); d != "/" && !dirs[d]; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return err
			}
		}
		if f.Link != "" {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: f.Path[1:], Linkname: f.Link, Mode: 0o777, ModTime: epoch}); err != nil {
				return err
			}
			continue
		}
		src, err := os.Open(f.Source)
		if err != nil {
			return err
		}
		fi, err := src.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			src.Close()
			return fmt.Errorf("image file %s: %s is not a regular file (%v)", f.Path, f.Source, err)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.Path[1:], Mode: f.Mode, Size: fi.Size(), ModTime: epoch}); err != nil {
			src.Close()
			return err
		}
		_, err = io.CopyN(tw, src, fi.Size())
		src.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}
