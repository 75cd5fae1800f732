package oci

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ImageHost is the only image today: the host's /usr (and /bin-style dirs) bound read-only
// under a minimal shared root with its own /etc.
const ImageHost = "host"

// agentUID and agentGID own /workspace and /home/agent; the guest agent runs commands as them.
const (
	agentUID = 1000
	agentGID = 1000
)

// topLevelLinks are the directories a merged-/usr host makes symlinks into /usr.
var topLevelLinks = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// hostLayout is how the host's top-level directories look, probed once at New: it decides
// both the shared rootfs and the read-only binds of every spec.
type hostLayout struct {
	// Links are top-level symlinks to mirror (name → target).
	Links map[string]string
	// Binds are host paths bound read-only at the same path.
	Binds []bindMount
}

func probeHostLayout(hostRoot string) hostLayout {
	l := hostLayout{Links: map[string]string{}}
	l.Binds = append(l.Binds, bindMount{Source: "/usr", Destination: "/usr"})
	for _, name := range topLevelLinks {
		p := filepath.Join(hostRoot, name)
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(p); err == nil {
				l.Links[name] = target
			}
		case fi.IsDir():
			l.Binds = append(l.Binds, bindMount{Source: "/" + name, Destination: "/" + name})
		}
	}
	for _, p := range []string{"/etc/ssl/certs", "/etc/alternatives"} {
		if fi, err := os.Stat(filepath.Join(hostRoot, p)); err == nil && fi.IsDir() {
			l.Binds = append(l.Binds, bindMount{Source: p, Destination: p})
		}
	}
	return l
}

// etcFiles is the minimal /etc of image "host".
var etcFiles = map[string]string{
	"passwd": "root:x:0:0:root:/root:/bin/sh\n" +
		"agent:x:1000:1000:agent:/home/agent:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"group": "root:x:0:\ntty:x:5:\nagent:x:1000:\nnogroup:x:65534:\n",
	"hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	// Sandboxes of network none have no network; an empty resolv.conf says so and leaks nothing
	// of the host (an egress sandbox has its own, bound over it).
	"resolv.conf":   "# agentbox: this sandbox has no network\n",
	"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
}

// ensureRootfs prepares <rootfsDir>/host once. It is idempotent and safe against concurrent
// creators in other processes: the tree is built in a temporary directory and renamed into
// place; a loser of the race removes its copy and uses the winner's.
func ensureRootfs(rootfsDir, hostRoot string, layout hostLayout) (string, error) {
	final := filepath.Join(rootfsDir, ImageHost)
	if _, err := os.Stat(final); err == nil {
		// A rootfs made before /etc/agentbox (egress sandboxes' CA bundle) existed gets it.
		if err := os.Mkdir(filepath.Join(final, "etc/agentbox"), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
		return final, nil
	}
	if err := os.MkdirAll(rootfsDir, 0o700); err != nil {
		return "", err
	}
	sweepStaleTemps(rootfsDir)
	tmp, err := os.MkdirTemp(rootfsDir, ".tmp-"+ImageHost+"-")
	if err != nil {
		return "", err
	}
	if err := buildRootfs(tmp, hostRoot, layout); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("build rootfs %s: %w", final, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
			return final, nil
		}
		return "", fmt.Errorf("install rootfs %s: %w", final, err)
	}
	return final, nil
}

// sweepStaleTemps removes temporary trees that a crashed creator left behind.
func sweepStaleTemps(rootfsDir string) {
	ents, _ := os.ReadDir(rootfsDir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > 10*time.Minute {
			os.RemoveAll(filepath.Join(rootfsDir, e.Name()))
		}
	}
}

func buildRootfs(dir, hostRoot string, layout hostLayout) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	dirs := []struct {
		path string
		mode os.FileMode
	}{
		{"usr", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"tmp", os.ModeSticky | 0o777},
		{"workspace", 0o755}, {"home", 0o755}, {"home/agent", 0o755}, {"root", 0o700},
		{"run", 0o755}, {".agentbox", 0o755}, {".agentbox/run", 0o700},
		{"etc", 0o755}, {"etc/agentbox", 0o755}, {"etc/ssl", 0o755}, {"etc/ssl/certs", 0o755}, {"etc/alternatives", 0o755},
	}
	for _, b := range layout.Binds {
		dirs = append(dirs, struct {
			path string
			mode os.FileMode
		}{strings.TrimPrefix(b.Destination, "/"), 0o755})
	}
	for _, d := range dirs {
		p := filepath.Join(dir, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	for name, target := range layout.Links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	// The mount point of the agent binary.
	if err := os.WriteFile(filepath.Join(dir, ".agentbox/agentbox"), nil, 0o755); err != nil {
		return err
	}
	for name, content := range etcFiles {
		if err := os.WriteFile(filepath.Join(dir, "etc", name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	if err := os.Symlink("/proc/self/mounts", filepath.Join(dir, "etc/mtab")); err != nil {
		return err
	}
	// The dynamic linker's configuration, so binaries from the host's /usr find their
	// libraries. A copy: refresh by removing rootfs/host after installing host libraries.
	for _, name := range []string{"ld.so.cache", "ld.so.conf"} {
		if err := copyFile(filepath.Join(hostRoot, "etc", name), filepath.Join(dir, "etc", name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	confd := filepath.Join(hostRoot, "etc/ld.so.conf.d")
	if ents, err := os.ReadDir(confd); err == nil {
		if err := os.Mkdir(filepath.Join(dir, "etc/ld.so.conf.d"), 0o755); err != nil {
			return err
		}
		for _, e := range ents {
			src := filepath.Join(confd, e.Name())
			if e.Type()&fs.ModeSymlink != 0 {
				// Usually a link into /etc/alternatives, which is bound from the host.
				target, err := os.Readlink(src)
				if err != nil {
					return err
				}
				if err := os.Symlink(target, filepath.Join(dir, "etc/ld.so.conf.d", e.Name())); err != nil {
					return err
				}
				continue
			}
			if !e.Type().IsRegular() {
				continue
			}
			if err := copyFile(filepath.Join(confd, e.Name()), filepath.Join(dir, "etc/ld.so.conf.d", e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
