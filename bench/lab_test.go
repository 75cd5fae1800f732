package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
)

// TestMain serves the lab when the test binary is re-executed as the lab's server.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "-lab-serve" {
		serveLab(os.Args[2])
		return
	}
	os.Exit(m.Run())
}

// TestLab starts the real lab (namespace, veth pair, re-executed server), takes the host-side
// floors through it (curl's GET and the connection loop), checks the barrier that holds
// responses until the armed count is open, and that Close removes everything.
func TestLab(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the lab needs root (network namespaces)")
	}
	ctx := context.Background()
	l, err := startLab(ctx)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			l.Close()
		}
	}()
	hc := labClient()

	// A GET of 8 MiB from the host with no proxy, as the floor takes it.
	const size = 8 << 20
	url := fmt.Sprintf("%s/bytes?n=%d", l.URL(), size)
	args := curlGet(url)
	cmd := exec.Command(args[0], append([]string{"--noproxy", "*"}, args[1:]...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("curl: %v", err)
	}
	secs, err := parseCurl(string(out), size)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("8 MiB from the lab: %.1f MiB/s", 8/secs)
	if _, err := parseCurl(string(out), size+1); err == nil {
		t.Fatal("parseCurl accepted a short transfer")
	}

	// The connection loop on the host (the overhead figure's floor).
	loop := exec.Command("python3", "-c", connLoop, "direct", labIP, "20")
	b, err := loop.Output()
	if err != nil {
		t.Fatalf("connection loop: %v", err)
	}
	xs, err := parseLoop(string(b), 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("direct connection p50 %.3f ms", summarize("", "ms", xs).P50)
	// The proxy modes refuse to run without a proxy in the environment.
	noProxy := exec.Command("python3", "-c", connLoop, "proxy", labIP, "1")
	noProxy.Env = []string{"PATH=" + os.Getenv("PATH")}
	if err := noProxy.Run(); err == nil {
		t.Fatal("the proxy loop ran with no http_proxy")
	}

	// The barrier: 5 waiting requests are held until the 5th is open, then all are served.
	var before labStats
	if err := labGet(hc, l.URL()+"/stats", &before); err != nil {
		t.Fatal(err)
	}
	if err := labGet(hc, l.URL()+"/arm?count=5", nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	early := make(chan struct{}, 5)
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := hc.Get(l.URL() + "/bytes?n=100000&ms=100&wait=1")
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil || n != 100000 {
				errs <- fmt.Errorf("read %d: %v", n, err)
			}
		}()
		if i < 4 {
			time.Sleep(50 * time.Millisecond)
			var st labStats
			if err := labGet(hc, l.URL()+"/stats", &st); err != nil {
				t.Fatal(err)
			}
			if st.ReleasedBy != "" || st.Served != before.Served || st.Active != i+1 {
				early <- struct{}{}
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(early) > 0 {
		t.Error("the barrier let requests through before the armed count was open")
	}
	// A handler counts itself done just after its last byte, which the client may have read.
	var st labStats
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := labGet(hc, l.URL()+"/stats", &st); err != nil {
			t.Fatal(err)
		}
		if st.Active == 0 || time.Now().After(deadline) {
			break
		}
	}
	if st.Peak != 5 || st.ReleasedBy != "count" || st.Served != before.Served+5 || st.Active != 0 {
		t.Fatalf("stats after the barrier: %+v", st)
	}
	if err := labGet(hc, l.URL()+"/bytes?n=-1", nil); err == nil {
		t.Fatal("/bytes?n=-1 accepted")
	}

	pid := l.srv.Process.Pid
	l.Close()
	closed = true
	if err := exec.Command("ip", "netns", "pids", labNetns).Run(); err == nil {
		t.Fatal("the lab's namespace is still there after Close")
	}
	if err := exec.Command("ip", "link", "show", labVethHost).Run(); err == nil {
		t.Fatal("the lab's veth is still there after Close")
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Fatalf("the lab server (pid %d) still runs after Close", pid)
	}
	// (Something else may answer for the address once the lab is gone: the host's default
	// route; only the lab says hello.)
	if resp, err := hc.Get(l.URL() + "/hello"); err == nil {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
		resp.Body.Close()
		if string(b) == "hello\n" {
			t.Fatal("the lab still answers after Close")
		}
	}
}

// TestEgressUnavailable: the network figures skip, with the reason, on a runc without egress.
func TestEgressUnavailable(t *testing.T) {
	if why := egressUnavailable(runtime.Capabilities{NetworkModes: []string{"none"}}); !strings.Contains(why, `no "egress" network mode (network modes: none)`) {
		t.Fatalf("without egress: %q", why)
	}
	if why := egressUnavailable(runtime.Capabilities{NetworkModes: []string{"none", "egress"}}); why != "" {
		t.Fatalf("with egress: %q", why)
	}
}
