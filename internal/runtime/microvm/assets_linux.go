package microvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// assetsVersion changes whenever what the builders below put in an asset changes.
const assetsVersion = "4"

// hostTools are the host's GNU tools the host image carries beside busybox (where the host has
// them): busybox's find has no -printf.
var hostTools = []string{"/usr/bin/find"}

// guestModules are the cloud kernel's modules /init loads, in order: the virtio transport,
// the agent's port, the disks, the root's overlay.
var guestModules = []string{
	"kernel/drivers/virtio/virtio_ring.ko",
	"kernel/drivers/virtio/virtio.ko",
	"kernel/drivers/virtio/virtio_mmio.ko",
	"kernel/drivers/char/virtio_console.ko",
	"kernel/drivers/block/virtio_blk.ko",
	"kernel/fs/overlayfs/overlay.ko",
	// free page reporting: the guest hands the pages it frees back to the host
	"kernel/drivers/virtio/virtio_balloon.ko",
}

// moduleSigMagic ends a signed module: the signature and its 12-byte descriptor precede it.
const moduleSigMagic = "~Module signature appended~\n"

// stripSignature removes a module's appended signature (an unsigned module loads on a kernel
// that does not force signatures, without the verification's cost at boot).
func stripSignature(ko []byte) []byte {
	if !bytes.HasSuffix(ko, []byte(moduleSigMagic)) {
		return ko
	}
	end := len(ko) - len(moduleSigMagic)
	if end < 12 {
		return ko
	}
	sigLen := int(binary.BigEndian.Uint32(ko[end-4 : end]))
	start := end - 12 - sigLen
	if start < 0 {
		return ko
	}
	return ko[:start]
}

// fileHash adds a file's name and content to h.
func fileHash(h io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(h, "%s\x00", filepath.Base(path))
	_, err = io.Copy(h, f)
	return err
}

// initramfs returns the path of the initramfs for the configured guest binary and modules,
// building it into the cache when no file of its inputs' hash is there.
func (r *Runtime) initramfs() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "initramfs %s\x00", assetsVersion)
	if err := fileHash(h, r.cfg.GuestBinary); err != nil {
		return "", fmt.Errorf("guest binary: %w", err)
	}
	for _, m := range guestModules {
		if err := fileHash(h, filepath.Join(r.modulesDir, m)); err != nil {
			return "", fmt.Errorf("guest kernel module: %w", err)
		}
	}
	path := filepath.Join(r.cfg.Root, "cache", "initramfs-"+hex.EncodeToString(h.Sum(nil))[:16]+".cpio")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	var buf bytes.Buffer
	c := &cpioWriter{w: &buf}
	for _, d := range []string{"dev", "proc", "sys", "lower", "data", "newroot", "modules"} {
		c.entry(d, 0o040755, nil)
	}
	bin, err := os.ReadFile(r.cfg.GuestBinary)
	if err != nil {
		return "", err
	}
	c.entry("init", 0o100755, bin)
	var order []string
	for _, m := range guestModules {
		ko, err := os.ReadFile(filepath.Join(r.modulesDir, m))
		if err != nil {
			return "", err
		}
		name := filepath.Base(m)
		c.entry("modules/"+name, 0o100644, stripSignature(ko))
		order = append(order, name)
	}
	c.entry("modules/order", 0o100644, []byte(strings.Join(order, "\n")+"\n"))
	if err := c.close(); err != nil {
		return "", err
	}
	return path, writeAtomic(path, buf.Bytes(), 0o644)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// hostPasswd and hostGroup are the host image's accounts: root, and agent (1000), who runs
// commands naming no user, as in every agentbox sandbox.
const (
	hostPasswd = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	hostGroup  = "root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n"
)

// hostImage returns the read-only root disk of image "host" in a VM: a VM cannot share the
// host's /usr as a container does, so it is a small userland of the host's static busybox
// (every applet as /bin/<name>) and the host's python3 (addPython), built into the cache at
// first use and shared by every VM.
func (r *Runtime) hostImage(ctx context.Context) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "host image %s\x00", assetsVersion)
	if err := fileHash(h, r.busybox); err != nil {
		return "", fmt.Errorf("busybox: %w", err)
	}
	py, _ := filepath.EvalSymlinks("/usr/bin/python3")
	if py != "" {
		if err := fileHash(h, py); err != nil {
			return "", fmt.Errorf("python3: %w", err)
		}
		if fi, err := os.Stat(filepath.Join("/usr/lib", filepath.Base(py))); err == nil {
			fmt.Fprintf(h, "stdlib %d\x00", fi.ModTime().UnixNano())
		}
	}
	for _, tool := range hostTools {
		if err := fileHash(h, tool); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s: %w", tool, err)
		}
	}
	path := filepath.Join(r.cfg.Root, "cache", "image-host-"+hex.EncodeToString(h.Sum(nil))[:16]+".ext4")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".build-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "home/agent", "tmp", "workspace", "dev", "proc", "sys", "run", "var/tmp", ".agentbox/run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	for _, d := range []string{"tmp", "var/tmp"} {
		_ = os.Chmod(filepath.Join(dir, d), 0o1777)
	}
	for _, d := range []string{"home/agent", "workspace"} {
		if err := os.Chown(filepath.Join(dir, d), 1000, 1000); err != nil {
			return "", err
		}
	}
	_ = os.Chmod(filepath.Join(dir, "root"), 0o700)
	bb, err := os.ReadFile(r.busybox)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), bb, 0o755); err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, r.busybox, "--list").Output()
	if err != nil {
		return "", fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		_ = os.Symlink("busybox", filepath.Join(dir, "bin", applet))
	}
	files := map[string]string{"etc/passwd": hostPasswd, "etc/group": hostGroup, "etc/hosts": "127.0.0.1 localhost\n::1 localhost\n",
		"etc/profile": "export PS1='\\u@\\h:\\w\\$ '\n"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	if py != "" {
		if err := addPython(ctx, dir, py); err != nil {
			return "", fmt.Errorf("python3 in the host image: %w", err)
		}
	}
	for _, tool := range hostTools {
		if _, err := os.Stat(tool); err != nil {
			continue
		}
		if err := addHostTool(ctx, dir, tool); err != nil {
			return "", fmt.Errorf("%s in the host image: %w", tool, err)
		}
	}
	var total int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil {
			total += fi.Size() + 4096
		}
		return nil
	})
	sizeMB := total*5/4>>20 + 16
	if err := mkfs(ctx, path, dir, sizeMB, "agentbox-root", true); err != nil {
		return "", err
	}
	return path, nil
}

// addPython copies the host's python3 into the image being built in dir: the interpreter, its
// standard library and the shared libraries they load (ldd), at their paths (/lib and /lib64 as
// Debian's merged /usr has them: links into usr/). The host image of the container runtimes is
// the host's /usr; a VM gets this much of it, so that python3 (run_python) works there too.
func addPython(ctx context.Context, dir, py string) error {
	name := filepath.Base(py) // python3.11
	stdlib := filepath.Join("/usr/lib", name)
	if err := mergedUsr(dir); err != nil {
		return err
	}
	if err := os.Symlink(name, filepath.Join(dir, "usr/bin/python3")); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", stdlib, filepath.Join(dir, "usr/lib")).CombinedOutput(); err != nil {
		return fmt.Errorf("cp %s: %w: %s", stdlib, err, out)
	}
	if err := copyFile(py, filepath.Join(dir, "usr/bin", name), 0o755); err != nil {
		return err
	}
	objs := []string{py}
	mods, _ := filepath.Glob(filepath.Join(stdlib, "lib-dynload", "*.so"))
	return copyLibs(ctx, dir, append(objs, mods...))
}

// addHostTool copies the host's binary at path (/usr/bin/find) into the image being built in
// dir, at the same path, with the shared libraries it loads: GNU tools where busybox's applet
// lacks what agents (and the snapshot suite) use, such as find -printf.
func addHostTool(ctx context.Context, dir, path string) error {
	if err := mergedUsr(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, path)), 0o755); err != nil {
		return err
	}
	if err := copyFile(path, filepath.Join(dir, path), 0o755); err != nil {
		return err
	}
	return copyLibs(ctx, dir, []string{path})
}

// mergedUsr makes dir's /usr/bin, /usr/lib and /usr/lib64, with /lib and /lib64 links into
// /usr as Debian's merged /usr has them (once).
func mergedUsr(dir string) error {
	for _, d := range []string{"usr/bin", "usr/lib", "usr/lib64"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for link, target := range map[string]string{"lib": "usr/lib", "lib64": "usr/lib64"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

// copyLibs copies the shared libraries objs load (ldd) into dir at their paths, under /usr.
func copyLibs(ctx context.Context, dir string, objs []string) error {
	out, err := exec.CommandContext(ctx, "ldd", objs...).Output()
	if err != nil {
		return fmt.Errorf("ldd: %w", err)
	}
	libs := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") && strings.Contains(f, ".so") && !strings.HasSuffix(f, ":") {
				libs[f] = true
			}
		}
	}
	for lib := range libs {
		dst := lib
		for _, merged := range []string{"/lib/", "/lib64/"} {
			if strings.HasPrefix(dst, merged) {
				dst = "/usr" + dst
			}
		}
		if _, err := os.Lstat(filepath.Join(dir, dst)); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, dst)), 0o755); err != nil {
			return err
		}
		if err := copyFile(lib, filepath.Join(dir, dst), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies src's content (following links) to a new file dst.
func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// mkfs makes an ext4 file system of sizeMB at path holding dir's tree (mkfs.ext4 -d), written
// to a temporary file first so that a crash leaves no half-made disk at path.
func mkfs(ctx context.Context, path, dir string, sizeMB int64, label string, readOnly bool) error {
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	if out, err := mkfsCmd(ctx, tmp, dir, sizeMB, label, readOnly).CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, path)
}

// mkfsCmd is the mkfs.ext4 that makes file out an ext4 image of sizeMB holding dir's tree
// (labelled label; without a journal when readOnly).
func mkfsCmd(ctx context.Context, out, dir string, sizeMB int64, label string, readOnly bool) *exec.Cmd {
	args := []string{"-q", "-F", "-L", label, "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-d", dir}
	if readOnly {
		args = append(args, "-O", "^has_journal")
	}
	args = append(args, out, fmt.Sprintf("%dM", sizeMB))
	return exec.CommandContext(ctx, "mkfs.ext4", args...)
}
