package security

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// sandboxRoot is every name the root of a sandbox may hold: the image's own directories and
// the host's merged-/usr links. A host-only name (var, boot, opt, srv…) would mean a listing
// escaped to the host's root.
var sandboxRoot = []string{"usr", "proc", "sys", "dev", "tmp", "workspace", "home", "root", "run", ".agentbox", "etc",
	"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// attackImageRoot are the names the attack image adds to a sandbox's root.
var attackImageRoot = []string{"var"}

// onlySandboxRoot fails the test if a listing of "/" through the files API holds a host-only name.
func (a *arena) onlySandboxRoot(path string) {
	a.t.Helper()
	dl, err := a.s.c.ListDir(context.Background(), a.id, path)
	if err != nil {
		a.t.Logf("list %s: %v", path, code(err))
		return
	}
	for _, e := range dl.Entries {
		if !slices.Contains(sandboxRoot, e.Name) && !(a.image != "" && slices.Contains(attackImageRoot, e.Name)) {
			a.t.Errorf("HOLE: listing %s shows %q, which is not in a sandbox's root (the host's?)", path, e.Name)
		}
	}
}

// hostDir makes an empty host directory (under /tmp, which every sandbox has as its own tmpfs)
// that must stay empty but for a canary.
func (a *arena) hostDir() (string, hostCanary) {
	dir, err := os.MkdirTemp("", "absec-host-")
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { os.RemoveAll(dir) })
	return dir, newHostCanary(a.t, filepath.Join(dir, "canary"))
}

// onlyCanary fails the test if dir holds anything but its canary, or the canary changed.
func (a *arena) onlyCanary(dir string, c hostCanary) {
	a.t.Helper()
	if names := dirEntries(a.t, dir); len(names) != 1 || names[0] != "canary" {
		a.t.Errorf("HOLE: the host directory %s now holds %v (only its canary was there)", dir, names)
	}
	c.intact(a.t)
}

func pathAttacks() []attack {
	return []attack{
		{
			name: "files-dotdot-read",
			does: "asks the files API to read ../../../../etc/passwd, /workspace/../../../etc/shadow, the host's state database and a host canary through ../, to stat the state dir and to list /workspace/../../..",
			want: "every path resolves inside the sandbox: /etc/passwd is the sandbox's own (never the host's bytes), /etc/shadow, the database and the canary are not found, the listing shows only the sandbox's root",
			run: func(a *arena) {
				dir, c := a.hostDir()
				hostPasswd, _ := os.ReadFile("/etc/passwd")
				b, err := a.readFile(a.id, "../../../../etc/passwd")
				if err != nil || !strings.Contains(string(b), "agent:x:1000:1000") || bytes.Equal(b, hostPasswd) {
					a.t.Errorf("../../../../etc/passwd: %v %q, want the sandbox's own passwd", err, b)
				}
				hostShadow, _ := os.ReadFile("/etc/shadow")
				for _, p := range []string{"/workspace/../../../etc/shadow", "../../../" + c.path, "/workspace/../../.." + a.s.stateDir + "/agentbox.db", "../../.." + dir + "/canary"} {
					b, err := a.readFile(a.id, p)
					if err == nil || code(err) != errcode.FileNotFound {
						a.t.Errorf("read %s: %v (%d bytes), want FILE_NOT_FOUND", p, code(err), len(b))
					}
					if len(b) > 0 && (bytes.Equal(b, hostShadow) || bytes.Contains(b, []byte("SQLite format 3")) || strings.Contains(string(b), c.content)) {
						a.t.Errorf("HOLE: %s returned host content", p)
					}
				}
				if _, err := a.s.c.Stat(context.Background(), a.id, "../../.."+a.s.stateDir); code(err) != errcode.FileNotFound {
					a.t.Errorf("stat of the host state dir through ../: %v, want FILE_NOT_FOUND", err)
				}
				a.onlySandboxRoot("/workspace/../../..")
				a.onlySandboxRoot("../../../../")
				c.intact(a.t)
			},
		},
		{
			name: "files-dotdot-write",
			does: "asks the files API to write ../../..<host dir>/x, its own bundle's config.json by host path, /.agentbox/agentbox (the guest binary) and /usr/bin/x through ../; then makes <host dir> inside its own /tmp and writes there again",
			want: "no host file appears or changes: the host dir holds only its canary, config.json and the guest binary keep their sha256, /usr/bin/x does not exist on the host; the last write lands in the sandbox's /tmp",
			run: func(a *arena) {
				dir, c := a.hostDir()
				cfg := filepath.Join(a.sandboxDir(a.id), "config.json")
				cfgSum := sha256File(a.t, cfg)
				guestBin := filepath.Join(a.s.stateDir, "runtimes", a.rt, "bin", "agentbox")
				guestSum := sha256File(a.t, guestBin)
				usrName := "absec-" + randHex(6)
				for _, p := range []string{"../../.." + dir + "/dotdot", "/workspace/../../../" + cfg, "../../.agentbox/agentbox", "/workspace/../usr/bin/" + usrName} {
					err := a.writeFile(a.id, p, []byte("absec-written"))
					a.t.Logf("write %s: %v", p, code(err))
				}
				a.sh("mkdir -p " + dir)
				if err := a.writeFile(a.id, "../../.."+dir+"/dotdot", []byte("inside")); err != nil {
					a.t.Errorf("write into the sandbox's own copy of the path: %v", err)
				}
				if res := a.sh("cat " + dir + "/dotdot"); res.Stdout != "inside" {
					a.t.Errorf("the write did not land in the sandbox's /tmp: %+v", res)
				}
				a.onlyCanary(dir, c)
				if sha256File(a.t, cfg) != cfgSum {
					a.t.Errorf("HOLE: the sandbox's host config.json changed")
				}
				if sha256File(a.t, guestBin) != guestSum {
					a.t.Errorf("HOLE: the host's guest binary changed")
				}
				if _, err := os.Lstat("/usr/bin/" + usrName); err == nil {
					os.Remove("/usr/bin/" + usrName)
					a.t.Errorf("HOLE: /usr/bin/%s appeared on the host", usrName)
				}
			},
		},
		{
			name: "files-dotdot-mkdir-remove",
			does: "asks the files API to mkdir -p ../../..<host dir>/mk and /workspace/../../usr/mk, to remove a host canary through ../, to remove the host state dir recursively through ../ and to remove /etc/ssl/certs recursively",
			want: "nothing on the host is created or removed: the host dir holds only its canary, /usr has no new entry, the state database and /etc/ssl/certs are intact",
			run: func(a *arena) {
				dir, c := a.hostDir()
				mk := "absec-mk-" + randHex(6)
				certs := dirEntries(a.t, "/etc/ssl/certs")
				st, body := a.mkdir(a.id, "../../.."+dir+"/mk", true)
				a.t.Logf("mkdir -p ../../..%s/mk: %d %s", dir, st, body)
				st, body = a.mkdir(a.id, "/workspace/../../usr/"+mk, false)
				a.t.Logf("mkdir /usr/%s: %d %s", mk, st, body)
				for _, r := range []struct {
					path      string
					recursive bool
				}{{"../../.." + c.path, false}, {"/workspace/../../.." + a.s.stateDir, true}, {"../../etc/ssl/certs", true}, {"/workspace/../../usr/bin/sh", false}} {
					st, body := a.remove(a.id, r.path, r.recursive)
					a.t.Logf("remove %s: %d %s", r.path, st, body)
				}
				a.onlyCanary(dir, c)
				if _, err := os.Lstat("/usr/" + mk); err == nil {
					os.Remove("/usr/" + mk)
					a.t.Errorf("HOLE: /usr/%s appeared on the host", mk)
				}
				if _, err := os.Stat(filepath.Join(a.s.stateDir, "agentbox.db")); err != nil {
					a.t.Errorf("HOLE: the host state database is gone: %v", err)
				}
				if now := dirEntries(a.t, "/etc/ssl/certs"); len(now) != len(certs) {
					a.t.Errorf("HOLE: host /etc/ssl/certs went from %d to %d entries", len(certs), len(now))
				}
				if _, err := os.Stat("/usr/bin/sh"); err != nil {
					a.t.Errorf("HOLE: host /usr/bin/sh is gone")
				}
				a.alive(a.id, 10*time.Second)
			},
		},
		{
			name: "files-symlink-read",
			does: "plants symlinks in /workspace to a host canary, to a host directory, to its own bundle's config.json by host path, a relative ../../ one, and one to /; the host reads, stats and lists through them with the files API",
			want: "nothing of the host comes back: no canary content, no config.json, the linked host dir is not found, the link to / lists only the sandbox's root",
			run: func(a *arena) {
				dir, c := a.hostDir()
				cfg := filepath.Join(a.sandboxDir(a.id), "config.json")
				cfgBytes, _ := os.ReadFile(cfg)
				a.sh(strings.Join([]string{
					"ln -s " + c.path + " /workspace/l-file", "ln -s " + dir + " /workspace/l-dir", "ln -s " + cfg + " /workspace/l-bundle",
					"ln -s ../../../../.." + c.path + " /workspace/l-rel", "ln -s / /workspace/l-root",
				}, "; "))
				for _, p := range []string{"/workspace/l-file", "/workspace/l-bundle", "/workspace/l-rel", "/workspace/l-dir/canary"} {
					b, err := a.readFile(a.id, p)
					if strings.Contains(string(b), strings.TrimSpace(c.content)) || (len(cfgBytes) > 0 && bytes.Contains(b, cfgBytes[:min(64, len(cfgBytes))])) {
						a.t.Errorf("HOLE: reading %s returned host content", p)
					}
					a.t.Logf("read %s: %d bytes %v", p, len(b), code(err))
				}
				if _, err := a.s.c.Stat(context.Background(), a.id, "/workspace/l-dir/canary"); code(err) != errcode.FileNotFound {
					a.t.Errorf("stat through a link to a host dir: %v, want FILE_NOT_FOUND", err)
				}
				if dl, err := a.s.c.ListDir(context.Background(), a.id, "/workspace/l-dir"); err == nil {
					a.t.Errorf("HOLE? listing a link to a host dir succeeded: %+v", dl)
				}
				a.onlySandboxRoot("/workspace/l-root")
				c.intact(a.t)
			},
		},
		{
			name: "files-symlink-write",
			does: "plants symlinks in /workspace to a host file path, to a host directory, to a host canary and to its own bundle's config.json; the host writes, mkdirs and removes through them with the files API",
			want: "no file appears on, changes on or disappears from the host: the host dir holds only its canary, config.json keeps its sha256",
			run: func(a *arena) {
				dir, c := a.hostDir()
				cfg := filepath.Join(a.sandboxDir(a.id), "config.json")
				cfgSum := sha256File(a.t, cfg)
				a.sh(strings.Join([]string{
					"ln -s " + dir + "/via-link /workspace/w-file", "ln -s " + dir + " /workspace/w-dir",
					"ln -s " + c.path + " /workspace/w-canary", "ln -s " + cfg + " /workspace/w-bundle",
				}, "; "))
				for _, p := range []string{"/workspace/w-file", "/workspace/w-dir/inside", "/workspace/w-canary", "/workspace/w-bundle"} {
					err := a.writeFile(a.id, p, []byte("absec-written"))
					a.t.Logf("write %s: %v", p, code(err))
				}
				st, _ := a.mkdir(a.id, "/workspace/w-dir/newdir", false)
				a.t.Logf("mkdir through the link: %d", st)
				st, _ = a.remove(a.id, "/workspace/w-dir/canary", false)
				a.t.Logf("remove through the link: %d", st)
				a.onlyCanary(dir, c)
				if sha256File(a.t, cfg) != cfgSum {
					a.t.Errorf("HOLE: the sandbox's host config.json changed through a symlink")
				}
			},
		},
		{
			name: "files-copy-in-out",
			does: "with the CLI (`agentbox cp`, over the REST files endpoints): copies a host file in to ../../..<host dir>/cp-in and through a planted symlink to the host dir; copies out a planted symlink to a host canary and a ../ path to it; and round-trips 3 MiB of random bytes",
			want: "copy in creates nothing on the host; copy out never yields the canary; the round trip is byte-exact (the channel works)",
			run: func(a *arena) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				dir, c := a.hostDir()
				local := filepath.Join(a.t.TempDir(), "in.bin")
				data := make([]byte, 3<<20)
				rand.Read(data)
				os.WriteFile(local, data, 0o644)
				a.sh("ln -s " + dir + " /workspace/cp-dir; ln -s " + c.path + " /workspace/cp-out")
				for _, dst := range []string{"../../.." + dir + "/cp-in", "/workspace/cp-dir/cp-in"} {
					_, e, code := a.s.cli(ctx, "cp", local, a.id+":"+dst)
					a.t.Logf("cp in to %s: exit %d %s", dst, code, strings.TrimSpace(e))
				}
				for _, src := range []string{"/workspace/cp-out", "../../../.." + c.path} {
					out := filepath.Join(a.t.TempDir(), "out")
					_, e, code := a.s.cli(ctx, "cp", a.id+":"+src, out)
					b, _ := os.ReadFile(out)
					if strings.Contains(string(b), strings.TrimSpace(c.content)) {
						a.t.Errorf("HOLE: cp out of %s yielded the host canary", src)
					}
					a.t.Logf("cp out of %s: exit %d %s", src, code, strings.TrimSpace(e))
				}
				if _, e, code := a.s.cli(ctx, "cp", local, a.id+":/workspace/in.bin"); code != 0 {
					a.t.Fatalf("cp in: %s", e)
				}
				back := filepath.Join(a.t.TempDir(), "back.bin")
				if _, e, code := a.s.cli(ctx, "cp", a.id+":/workspace/in.bin", back); code != 0 {
					a.t.Fatalf("cp out: %s", e)
				}
				if b, _ := os.ReadFile(back); !bytes.Equal(b, data) {
					a.t.Errorf("round trip differs")
				}
				a.onlyCanary(dir, c)
			},
		},
		{
			name: "files-symlink-swap-race",
			does: "swaps /workspace/race between a directory and a symlink to a host directory (renameat2 RENAME_EXCHANGE, or two renames where that is refused) as fast as it can, while the host reads, writes, stats, lists, mkdirs and removes under /workspace/race/ through the files API in a loop",
			want: "the host directory never changes (it holds only its canary, unchanged) and no read returns the host canary; reads see only the sandbox's own decoys; every failed call is a typed error (a write whose directory was swapped mid-way is CONFLICT), never INTERNAL",
			run: func(a *arena) {
				dir, c := a.hostDir()
				const raceSeconds = 6
				var wg sync.WaitGroup
				var raceRes wire.ExecResult
				var raceErr error
				wg.Add(1)
				go func() {
					defer wg.Done()
					raceRes, raceErr = a.tryExecIn(a.id, wire.ExecRequest{Command: []string{"python3", "-c", prelude + raceProg, "-", dir, "8"}, TimeoutSeconds: 60})
				}()
				// Wait for the racer to set up.
				deadline := time.Now().Add(20 * time.Second)
				for {
					if _, err := a.s.c.Stat(context.Background(), a.id, "/workspace/racing"); err == nil || time.Now().After(deadline) {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				seen, untyped := map[string]int{}, map[string]int{}
				end := time.Now().Add(raceSeconds * time.Second)
				for i := 0; time.Now().Before(end); i++ {
					b, err := a.readFile(a.id, "/workspace/race/canary")
					switch {
					case strings.Contains(string(b), strings.TrimSpace(c.content)):
						a.t.Errorf("HOLE: a read during the race returned the host canary")
					case err != nil:
						seen[string(code(err))]++
					default:
						seen[strings.TrimSpace(string(b))]++
					}
					// Whatever the race does, every answer is a typed error that says what
					// happened, never INTERNAL.
					name := "/workspace/race/w" + randHex(3)
					_, statErr := a.s.c.Stat(context.Background(), a.id, "/workspace/race/canary")
					_, listErr := a.s.c.ListDir(context.Background(), a.id, "/workspace/race")
					for op, err := range map[string]error{"write": a.writeFile(a.id, name, []byte("raced")), "stat": statErr, "list": listErr} {
						if c := code(err); c == errcode.Internal || c == "?" {
							untyped[op+": "+strings.ReplaceAll(err.Error(), name, "<name>")]++
						}
					}
					for op, st := range map[string]int{"mkdir": first(a.mkdir(a.id, "/workspace/race/m"+randHex(3), false)), "remove": first(a.remove(a.id, name, false))} {
						if st >= 500 {
							untyped[fmt.Sprintf("%s: HTTP %d", op, st)]++
						}
					}
				}
				wg.Wait()
				a.t.Logf("racer: %q %v; host saw %v", strings.TrimSpace(raceRes.Stdout), raceErr, seen)
				if len(untyped) != 0 {
					a.t.Errorf("files API answers during the race that are not typed: %v", untyped)
				}
				if raceErr != nil || !strings.Contains(raceRes.Stdout, "swaps") {
					a.t.Errorf("the racer did not run: %+v %v", raceRes, raceErr)
				}
				a.onlyCanary(dir, c)
			},
		},
		{
			name: "files-fifo-and-devices",
			does: "makes a FIFO with no writer, symlinks to /dev/zero and /dev/urandom, and asks the files API to read them (and /dev/zero, /proc/self/fd/0 directly)",
			want: "every read is refused fast (under 5 s each, INVALID_ARGUMENT: not a regular file) — no hang, no unbounded stream — and the API still serves reads of regular files afterwards",
			run: func(a *arena) {
				a.sh("mkfifo /workspace/fifo && ln -s /dev/zero /workspace/zero && ln -s /dev/urandom /workspace/rnd && ln -s fifo /workspace/fifo-link && echo regular > /workspace/reg")
				for _, p := range []string{"/workspace/fifo", "/workspace/fifo-link", "/workspace/zero", "/workspace/rnd", "/dev/zero", "/dev/urandom", "/proc/self/fd/0"} {
					start := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					rc, _, err := a.s.c.ReadFile(ctx, a.id, p, 0, 0)
					var n int64
					if err == nil {
						n, _ = io.Copy(io.Discard, rc)
						rc.Close()
					}
					d := time.Since(start)
					expired := ctx.Err() != nil
					cancel()
					if d > 5*time.Second || expired {
						a.t.Errorf("reading %s took %s (hang?)", p, d)
					}
					if err == nil && n > 1<<30 {
						a.t.Errorf("reading %s streamed %d bytes", p, n)
					}
					if p != "/proc/self/fd/0" && code(err) != errcode.InvalidArgument {
						a.t.Errorf("reading %s: %v (%d bytes), want INVALID_ARGUMENT", p, err, n)
					}
					a.t.Logf("read %s: %v %d bytes in %s", p, code(err), n, d.Round(time.Millisecond))
				}
				if b, err := a.readFile(a.id, "/workspace/reg"); err != nil || string(b) != "regular\n" {
					a.t.Errorf("regular read after the attack: %q %v", b, err)
				}
			},
		},
		{
			name:   "files-sparse-3g",
			does:   "makes a 3 GiB sparse file (three times the per-file bound, on a disk just big enough: RLIMIT_FSIZE is the disk's size, and a disk may not promise more than the host has free) and has the host read it whole, then a 1 MiB range at 2 GiB, through the files API",
			want:   "the whole read is refused fast with FILE_TOO_LARGE naming the size; the range comes back as exactly 1 MiB of zeros; the server's peak RSS grows by less than 64 MiB; the host's free space barely moves (the file is sparse)",
			create: wire.CreateRequest{DiskMB: 3<<10 + 64},
			run: func(a *arena) {
				freeBefore, _ := fsFree(a.t, a.s.stateDir)
				hwm := kib(statusField(a.s.pid(), "VmHWM"))
				if res := a.sh("truncate -s 3G /workspace/sparse && echo ok"); res.Stdout != "ok\n" {
					a.t.Fatalf("truncate: %+v", res)
				}
				start := time.Now()
				_, err := a.readFile(a.id, "/workspace/sparse")
				e, _ := errcode.As(err)
				if e == nil || e.Code != errcode.FileTooLarge || time.Since(start) > 5*time.Second {
					a.t.Errorf("whole read of 3 GiB: %v in %s, want FILE_TOO_LARGE fast", err, time.Since(start))
				} else if sz, _ := e.Details["size"].(float64); int64(sz) != 3<<30 {
					a.t.Errorf("FILE_TOO_LARGE details %v: want size %d", e.Details, int64(3<<30))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				rc, size, err := a.s.c.ReadFile(ctx, a.id, "/workspace/sparse", 2<<30, 1<<20)
				if err != nil {
					a.t.Fatalf("range read: %v", err)
				}
				b, _ := io.ReadAll(rc)
				rc.Close()
				if size != 3<<30 || len(b) != 1<<20 || !bytes.Equal(b, make([]byte, 1<<20)) {
					a.t.Errorf("range read: size %d, %d bytes", size, len(b))
				}
				if grew := kib(statusField(a.s.pid(), "VmHWM")) - hwm; grew > 64<<10 {
					a.t.Errorf("the server's peak RSS grew by %d MiB", grew>>10)
				}
				if freeAfter, _ := fsFree(a.t, a.s.stateDir); int64(freeBefore)-int64(freeAfter) > 1<<30 {
					a.t.Errorf("the host lost %d MiB of free space to a sparse file", (int64(freeBefore)-int64(freeAfter))>>20)
				}
			},
		},
	}
}

// raceProg swaps /workspace/race between a directory and a symlink to argv[2] (a host path,
// which inside exists only as the sandbox's own copy in its /tmp) for argv[3] seconds.
const raceProg = `
hostdir, seconds = sys.argv[2], float(sys.argv[3])
os.makedirs(hostdir, exist_ok=True)
with open(hostdir + "/canary", "w") as f: f.write("inside-tmp-decoy\n")
os.mkdir("/workspace/race")
with open("/workspace/race/canary", "w") as f: f.write("workspace-decoy\n")
os.symlink(hostdir, "/workspace/alt")
open("/workspace/racing", "w").close()
renameat2 = getattr(libc, "renameat2", None)
swaps = fallback = 0
end = time.time() + seconds
link = True  # /workspace/alt is the link
while time.time() < end:
    if renameat2 is not None:
        if renameat2(-100, b"/workspace/alt", -100, b"/workspace/race", 2) == 0:
            swaps += 1
            continue
        renameat2 = None  # refused (gVisor): two renames instead
    # Two renames: race -> spare name, spare -> race.
    try:
        if os.path.islink("/workspace/race"):
            os.rename("/workspace/race", "/workspace/alt.l"); os.rename("/workspace/alt.d", "/workspace/race")
        else:
            if not os.path.lexists("/workspace/alt.l"):
                os.rename("/workspace/alt", "/workspace/alt.l")
            os.rename("/workspace/race", "/workspace/alt.d"); os.rename("/workspace/alt.l", "/workspace/race")
        swaps += 1; fallback += 1
    except OSError:
        pass
out("swaps", swaps, "fallback", fallback)
`

// first returns the first of two results (an HTTP status and its body).
func first(st int, _ string) int { return st }
