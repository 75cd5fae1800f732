package imagelab

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"
)

// BusyboxPath is the static busybox the Busybox image is made of (Debian's busybox-static).
const BusyboxPath = "/bin/busybox"

// Applets are the busybox applets Busybox links in /bin.
var Applets = []string{"sh", "ls", "cat", "id", "echo", "cp", "mkdir", "rm", "touch", "stat", "chmod",
	"sleep", "true", "false", "env", "wc", "head", "tail", "grep", "sed", "tar", "dd", "find", "ln",
	"readlink", "sha256sum", "md5sum", "whoami"}

// Label is the label every Busybox image carries (LabelKey=LabelValue).
const (
	LabelKey   = "org.agentbox.imagelab"
	LabelValue = "busybox"
	// Path is the Busybox image's PATH.
	Path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Epoch is the mtime of every entry the builders make (reproducible digests).
var Epoch = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// File is one entry of a layer.
type File struct {
	Name string
	// Type is a tar type flag (0: tar.TypeReg).
	Type byte
	// Mode are the permission bits, setuid, setgid and sticky included (0: 0644, dirs 0755).
	Mode     int64
	UID, GID int
	Body     string
	Linkname string
	// Devmajor and Devminor of a device node.
	Devmajor, Devminor int64
	// Xattrs are written as PAX SCHILY.xattr records.
	Xattrs map[string]string
	// Size overrides the header's size (the body is cut short: an absurd size header).
	Size int64
}

// Reg is a regular file.
func Reg(name, body string, mode int64) File {
	return File{Name: name, Type: tar.TypeReg, Body: body, Mode: mode}
}

// Dir is a directory.
func Dir(name string, mode int64) File { return File{Name: name, Type: tar.TypeDir, Mode: mode} }

// Symlink is name → target.
func Symlink(name, target string) File {
	return File{Name: name, Type: tar.TypeSymlink, Linkname: target, Mode: 0o777}
}

// Hardlink is name linked to target (a path in the layer).
func Hardlink(name, target string) File {
	return File{Name: name, Type: tar.TypeLink, Linkname: target}
}

// Whiteout deletes p of the layers below.
func Whiteout(p string) File {
	d, b := path.Split(p)
	return File{Name: d + ".wh." + b, Type: tar.TypeReg}
}

// Opaque hides dir's contents of the layers below.
func Opaque(dir string) File {
	return File{Name: strings.TrimSuffix(dir, "/") + "/.wh..wh..opq", Type: tar.TypeReg}
}

// LayerTar is the tar of files, in order.
func LayerTar(files ...File) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		typ := f.Type
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		h := &tar.Header{Name: f.Name, Typeflag: typ, Mode: mode, Uid: f.UID, Gid: f.GID, Linkname: f.Linkname,
			ModTime: Epoch, Devmajor: f.Devmajor, Devminor: f.Devminor, Format: tar.FormatPAX}
		if typ == tar.TypeReg {
			h.Size = int64(len(f.Body))
		}
		if len(f.Xattrs) > 0 {
			h.PAXRecords = map[string]string{}
			for k, v := range f.Xattrs {
				h.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if f.Size != 0 {
			h.Size = f.Size
			if err := tw.WriteHeader(h); err != nil {
				panic(err)
			}
			tw.Write([]byte(f.Body))
			return buf.Bytes() // cut short: nothing may follow an absurd size
		}
		if err := tw.WriteHeader(h); err != nil {
			panic(fmt.Sprintf("imagelab: %s: %v", f.Name, err))
		}
		if h.Size > 0 {
			io.WriteString(tw, f.Body)
		}
	}
	if err := tw.Close(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// Layer is a gzip layer of the tar t (a malformed tar is served as is).
func Layer(t testing.TB, tarBytes []byte) v1.Layer {
	t.Helper()
	l, err := layerFromTar(tarBytes)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func layerFromTar(tarBytes []byte) (v1.Layer, error) {
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	zw.Write(tarBytes)
	zw.Close()
	b := gz.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}

// WithLayer is img with a layer of files on top.
func WithLayer(t testing.TB, img v1.Image, files ...File) v1.Image {
	t.Helper()
	return WithRawLayer(t, img, LayerTar(files...))
}

// WithRawLayer is img with a layer of the tar bytes (which may be malformed) on top.
func WithRawLayer(t testing.TB, img v1.Image, tarBytes []byte) v1.Image {
	t.Helper()
	out, err := mutate.AppendLayers(img, Layer(t, tarBytes))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Single is a one-layer image of the tar bytes (no other files): for malicious layers.
func Single(t testing.TB, tarBytes []byte) v1.Image {
	t.Helper()
	return WithRawLayer(t, config(t, empty.Image, "amd64", "single"), tarBytes)
}

func config(t testing.TB, img v1.Image, arch, label string) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	if arch == "arm64" {
		cf.Variant = "v8"
	}
	cf.Created = v1.Time{Time: Epoch}
	cf.Config.Env = []string{"PATH=" + Path}
	cf.Config.WorkingDir = "/"
	cf.Config.Cmd = []string{"/bin/sh"}
	cf.Config.Labels = map[string]string{LabelKey: label}
	out, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// BusyboxFiles is the busybox root: /bin/busybox, its applets, /etc/passwd (root, agent 1000,
// nobody), /etc/group, /tmp 1777, /root, /home/agent.
func BusyboxFiles(t testing.TB) []File {
	t.Helper()
	bb, err := os.ReadFile(BusyboxPath)
	if err != nil {
		t.Fatalf("imagelab needs %s (apt-get install busybox-static): %v", BusyboxPath, err)
	}
	files := []File{Dir("bin", 0o755), Dir("etc", 0o755), Dir("tmp", 0o1777), Dir("root", 0o700),
		{Name: "home", Type: tar.TypeDir, Mode: 0o755}, {Name: "home/agent", Type: tar.TypeDir, Mode: 0o755, UID: 1000, GID: 1000},
		Dir("usr", 0o755), Dir("usr/local", 0o755), Dir("usr/local/bin", 0o755), Dir("var", 0o755),
		Reg("bin/busybox", string(bb), 0o755),
		Reg("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", 0o644),
		Reg("etc/group", "root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n", 0o644),
	}
	for _, a := range Applets {
		files = append(files, Symlink("bin/"+a, "busybox"))
	}
	return files
}

// Busybox is a linux/amd64 image of BusyboxFiles: Env PATH, WorkingDir /, Cmd /bin/sh, the label.
func Busybox(t testing.TB) v1.Image {
	t.Helper()
	return WithLayer(t, config(t, empty.Image, "amd64", LabelValue), BusyboxFiles(t)...)
}

// Arch is img's config with another architecture and label (the bytes stay amd64's: an
// index's other entries are for resolving, never run).
func Arch(t testing.TB, img v1.Image, arch, label string) v1.Image {
	t.Helper()
	return config(t, img, arch, label)
}

// MultiArch is an index of amd64 (linux/amd64), an arm64 variant (linux/arm64/v8, label
// "arm64") and a bogus platform (plan9/mips, label "bogus") of amd64.
func MultiArch(t testing.TB, amd64 v1.Image) v1.ImageIndex {
	t.Helper()
	arm := Arch(t, amd64, "arm64", "arm64")
	bogus := Arch(t, amd64, "mips", "bogus")
	bcf, _ := bogus.ConfigFile()
	bcf = bcf.DeepCopy()
	bcf.OS = "plan9"
	bogus, _ = mutate.ConfigFile(bogus, bcf)
	return mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: bogus, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "plan9", Architecture: "mips"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
		mutate.IndexAddendum{Add: amd64, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
}

// OnlyPlatforms is an index with only the bogus and arm64 entries (no linux/amd64).
func OnlyPlatforms(t testing.TB, img v1.Image) v1.ImageIndex {
	t.Helper()
	arm := Arch(t, img, "arm64", "arm64")
	return mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}})
}

// Malicious are raw layer tars, by attack, aimed at target (an absolute directory outside
// the cache that must stay untouched; "secret" in it should exist so a hardlink to it could
// succeed). "device" is expected to be unpacked with its nodes skipped; "huge-size" to be
// refused as too large; every other one refused as unsafe.
func Malicious(target string) map[string][]byte {
	target = filepath.Clean(target)
	rel := strings.TrimPrefix(target, "/")
	up := strings.Repeat("../", 32)
	return map[string][]byte{
		"dotdot":                LayerTar(Reg(up+rel+"/dotdot", "x", 0o644)),
		"dotdot-inner":          LayerTar(Dir("a", 0), Reg("a/../../"+up+rel+"/dotdot-inner", "x", 0o644)),
		"absolute":              LayerTar(Reg(target+"/absolute", "x", 0o644)),
		"symlink-write-through": LayerTar(Symlink("escape", target), Reg("escape/through", "x", 0o644)),
		"symlink-rel-through":   LayerTar(Symlink("up", up+rel), Reg("up/through-rel", "x", 0o644)),
		"symlink-dir-chain":     LayerTar(Dir("d", 0), Symlink("d/l", "../../../../../../../.."+target), Dir("d/l/sub", 0), Reg("d/l/sub/f", "x", 0o644)),
		"hardlink-outside":      LayerTar(Hardlink("hl", target+"/secret")),
		"hardlink-dotdot":       LayerTar(Hardlink("hl", up+rel+"/secret")),
		"hardlink-via-symlink":  LayerTar(Symlink("s", target), Hardlink("hl", "s/secret")),
		"device":                LayerTar(Dir("dev", 0), File{Name: "dev/mem", Type: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666}, File{Name: "dev/sda", Type: tar.TypeBlock, Devmajor: 8, Devminor: 0, Mode: 0o666}, File{Name: "dev/fifo", Type: tar.TypeFifo, Mode: 0o666}, Reg("ok", "fine", 0o644)),
		"huge-size":             LayerTar(File{Name: "huge", Type: tar.TypeReg, Size: 1 << 40, Body: "xxxx"}),
	}
}

// DockerSave is a `docker save` tarball of img tagged tag.
func DockerSave(t testing.TB, img v1.Image, tag string) []byte {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(ref, img, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// OCILayout is a tarball of an OCI image layout holding img annotated with refName
// (org.opencontainers.image.ref.name).
func OCILayout(t testing.TB, img v1.Image, refName string) []byte {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": refName})); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			tw.Write(b)
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// RandomImage is an image of layers layers, each of files of fileBytes random bytes adding
// up to layerBytes (incompressible: what a pull's throughput is measured with).
func RandomImage(layers int, layerBytes, fileBytes int64, seed uint64) (v1.Image, error) {
	img := empty.Image
	var ls []v1.Layer
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 1, 2, 3}))
	for i := range layers {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("l%d/", i), Typeflag: tar.TypeDir, Mode: 0o755, ModTime: Epoch})
		chunk := make([]byte, fileBytes)
		for n, j := int64(0), 0; n < layerBytes; n, j = n+fileBytes, j+1 {
			for k := 0; k+8 <= len(chunk); k += 8 {
				v := r.Uint64()
				chunk[k], chunk[k+1], chunk[k+2], chunk[k+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
				chunk[k+4], chunk[k+5], chunk[k+6], chunk[k+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
			}
			tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("l%d/f%d", i, j), Typeflag: tar.TypeReg, Mode: 0o644, Size: fileBytes, ModTime: Epoch})
			tw.Write(chunk)
		}
		tw.Close()
		l, err := layerFromTar(buf.Bytes())
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	out, err := mutate.AppendLayers(img, ls...)
	if err != nil {
		return nil, err
	}
	cf, err := out.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	return mutate.ConfigFile(out, cf)
}
