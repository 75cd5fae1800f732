package security

import (
	"bufio"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/agentbox/agentbox/internal/testenv/imagelab"
)

// arenaKind is where an attack runs: a runtime, and an image ("" = host).
type arenaKind struct {
	name, rt, image string
}

// attackArenas are runc, crun and gVisor on the host image, and runc on an OCI image (pulled
// from a registry on loopback by the suite's server): every attack runs on each.
func attackArenas(t *testing.T, s *server) []arenaKind {
	t.Helper()
	var out []arenaKind
	for _, rt := range runtimes {
		out = append(out, arenaKind{name: rt, rt: rt})
	}
	reg := imagelab.Start(t)
	reg.Push(t, "security/attack:1", attackImage(t))
	ref := reg.Ref("security/attack:1")
	ctx, cancel := context.WithTimeout(context.Background(), 120e9)
	defer cancel()
	if _, err := s.c.PullImage(ctx, ref, nil); err != nil {
		t.Fatalf("pull the attack image: %v", err)
	}
	return append(out, arenaKind{name: "runc+image", rt: "runc", image: ref})
}

// attackImage is the attacks' image: busybox, and the host's python3, curl, setsid and dash (as
// /bin/sh) with the shared
// libraries they load and python's standard library, in one layer each; its user is agent
// (1000), as on the host image.
func attackImage(t *testing.T) v1.Image {
	t.Helper()
	// Every applet of the host's busybox-static, not only imagelab's few (setsid, mount, ps…).
	list, err := exec.Command(imagelab.BusyboxPath, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	files := hostClosure(t)
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" && !slices.Contains(imagelab.Applets, applet) && !slices.ContainsFunc(files, func(f imagelab.File) bool { return f.Name == "usr/bin/"+applet }) {
			files = append(files, imagelab.Symlink("bin/"+applet, "busybox"))
		}
	}
	// dash is /bin/sh: busybox's shell runs its own applets before PATH (setsid without -f).
	files = append(files, imagelab.Symlink("bin/sh", "/usr/bin/dash"))
	img := imagelab.WithLayer(t, imagelab.Busybox(t), files...)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg := cf.Config
	cfg.User = "agent"
	cfg.WorkingDir = "/workspace"
	img, err = mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// hostClosure is python3, curl, setsid and dash of the host, the libraries ldd says they and python's
// extension modules load, and python's standard library (without its tests), at their real
// paths under /usr, with top-level links lib → usr/lib and lib64 → usr/lib64 as a merged-/usr
// host has them.
func hostClosure(t *testing.T) []imagelab.File {
	t.Helper()
	var files []imagelab.File
	seen := map[string]bool{}
	var addDir func(d string)
	addDir = func(d string) {
		if d == "/" || d == "." || seen[d] {
			return
		}
		addDir(filepath.Dir(d))
		seen[d] = true
		files = append(files, imagelab.Dir(strings.TrimPrefix(d, "/"), 0o755))
	}
	var add func(p string, depth int)
	add = func(p string, depth int) {
		if depth > 8 {
			t.Fatalf("symlink chain at %s", p)
		}
		dir, err := filepath.EvalSymlinks(filepath.Dir(p))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		q := filepath.Join(dir, filepath.Base(p))
		if seen[q] {
			return
		}
		fi, err := os.Lstat(q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		addDir(dir)
		seen[q] = true
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(q)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, imagelab.Symlink(strings.TrimPrefix(q, "/"), target))
			if !filepath.IsAbs(target) {
				target = filepath.Join(dir, target)
			}
			add(target, depth+1)
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(q)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, imagelab.Reg(strings.TrimPrefix(q, "/"), string(b), int64(fi.Mode().Perm())))
		}
	}
	files = append(files, imagelab.Dir("usr", 0o755), imagelab.Dir("usr/lib", 0o755), imagelab.Dir("usr/lib64", 0o755),
		imagelab.Symlink("lib", "usr/lib"), imagelab.Symlink("lib64", "usr/lib64"))
	seen["/usr"], seen["/usr/lib"], seen["/usr/lib64"] = true, true, true
	var elfs []string
	for _, p := range []string{"/usr/bin/python3", "/usr/bin/curl", "/usr/bin/setsid", "/usr/bin/dash"} { // Debian's
		add(p, 0)
		elfs = append(elfs, p)
	}
	out, err := exec.Command("/usr/bin/python3", "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])").Output()
	if err != nil {
		t.Fatalf("python3's stdlib: %v", err)
	}
	pyLib := strings.TrimSpace(string(out))
	skip := []string{"test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__", "dist-packages", "site-packages", "pydoc_data"}
	err = filepath.WalkDir(pyLib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != pyLib && slices.Contains(skip, d.Name()) {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return nil
		}
		add(p, 0)
		if strings.HasSuffix(p, ".so") {
			elfs = append(elfs, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, lib := range lddClosure(t, elfs) {
		add(lib, 0)
	}
	return files
}

// lddClosure is every library ldd lists for elfs (ldd resolves the whole closure).
func lddClosure(t *testing.T, elfs []string) []string {
	t.Helper()
	set := map[string]bool{}
	for _, e := range elfs {
		out, err := exec.Command("ldd", e).Output()
		if err != nil {
			continue // not dynamic
		}
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			for i, w := range f {
				if strings.HasPrefix(w, "/") && (i == 0 || f[i-1] == "=>") {
					set[w] = true
				}
			}
		}
	}
	var libs []string
	for l := range set {
		libs = append(libs, l)
	}
	slices.Sort(libs)
	return libs
}
