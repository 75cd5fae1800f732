package faults

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/testenv"
)

// proc is one `agentbox serve` process of the built binary.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	url  string
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *proc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// stop ends the process with SIGTERM (SIGKILL after 30 s) and says whether it stopped in time.
func (p *proc) stop() bool {
	if p.exited() {
		return true
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return true
	case <-time.After(30 * time.Second):
		p.kill()
		return false
	}
}

// startServe starts `agentbox serve` on a free loopback port and waits (up to a minute) until
// it publishes its address in stateDir's server.json; an exit before that is an error carrying
// its log.
func startServe(bin, stateDir string, env []string, logs *testenv.SyncBuffer, args ...string) (*proc, error) {
	os.Remove(config.ServerInfoPath(stateDir))
	// runc explicitly: the campaign's runtime faults wrap runc, and its invariants read runc's
	// root.
	all := append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", stateDir, "--runtime", "runc"}, args...)
	cmd := exec.Command(bin, all...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(time.Minute)
	for {
		if info, err := config.ReadServerInfo(stateDir); err == nil && info.PID == cmd.Process.Pid {
			p.url = info.URL
			return p, nil
		}
		if p.exited() {
			return p, fmt.Errorf("agentbox serve exited at start: %v", cmd.ProcessState)
		}
		if time.Now().After(deadline) {
			p.kill()
			return p, fmt.Errorf("agentbox serve did not publish its address within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// httpClient is the campaign's HTTP client: no overall timeout (contexts bound the calls).
var httpClient = &http.Client{Transport: &http.Transport{
	TLSClientConfig:     &tls.Config{InsecureSkipVerify: true},
	MaxIdleConnsPerHost: 32,
}}

// runtimeWrapper writes a `runc` on a directory put first in the server's PATH: it reads the
// fault mode from modeFile at each call and, in mode "fail", fails half of the create, start
// and exec calls; in mode "hang", sleeps 8 s before create, start, delete and kill; else (and
// for every other call) it runs the real runc.
func runtimeWrapper(t *testing.T, dir, modeFile string) {
	t.Helper()
	real, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal(err)
	}
	script := `#!/bin/sh
mode=$(cat '` + modeFile + `' 2>/dev/null)
sub=
for a in "$@"; do
	case "$a" in
	create|start|exec|delete|kill|state|pause|resume|checkpoint|restore|update|list|features|ps|events|run) sub=$a; break;;
	esac
done
case "$mode:$sub" in
fail:create|fail:start|fail:run|fail:exec)
	if [ $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) = 0 ]; then
		echo "faults: injected failure of runc $sub" >&2
		exit 1
	fi;;
hang:create|hang:start|hang:run|hang:delete|hang:kill)
	sleep 8;;
esac
exec '` + real + `' "$@"
`
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "runc"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// loopFS mounts a fresh ext4 file system of sizeMB (a sparse image under /var/tmp, no blocks
// reserved for root: the server runs as root) on dir, and undoes it at the end of the test.
func loopFS(t *testing.T, dir string, sizeMB int64) {
	t.Helper()
	f, err := os.CreateTemp("/var/tmp", "abfaults-*.img")
	if err != nil {
		t.Fatal(err)
	}
	img := f.Name()
	f.Close()
	t.Cleanup(func() { os.Remove(img) })
	if err := os.Truncate(img, sizeMB<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v\n%s", img, err, out)
	}
	t.Cleanup(func() {
		for i := 0; ; i++ {
			out, err := exec.Command("umount", dir).CombinedOutput()
			if err == nil {
				return
			}
			if i == 20 {
				t.Errorf("umount %s: %v\n%s", dir, err, out)
				exec.Command("umount", "-l", dir).Run()
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
}

// fillFS takes all of dir's file system's free space with one file and returns its path.
func fillFS(dir string) (string, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "", err
	}
	p := filepath.Join(dir, "faults-filler")
	free := int64(st.Bavail) * st.Bsize
	if out, err := exec.Command("fallocate", "-l", fmt.Sprint(free), p).CombinedOutput(); err != nil {
		// fallocate may miss by a block or two; top it up with writes until ENOSPC.
		if !strings.Contains(string(out), "No space") {
			return p, fmt.Errorf("fallocate: %v: %s", err, out)
		}
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return p, err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	return p, nil
}

// waitHealthy waits until GET /health answers 200, up to d.
func waitHealthy(ctx context.Context, r rest, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = r.do(c, "GET", "/health", nil, nil, nil)
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not healthy within %s: %v", d, last)
}
