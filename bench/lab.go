package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The lab is the network figures' "local test host": an HTTP server in a network namespace of
// its own, reached from the host over a veth pair. The egress proxy refuses loopback and the
// host's own addresses, so the test host cannot live in the host's namespace; its range is
// opened to egress with egress.Config.AllowCIDRs (the server's --egress-allow-cidr).
const (
	labNetns    = "abbench-lab"
	labVethHost = "abbench-lab0"
	labVethLab  = "abbench-lab1"
	labHostCIDR = "10.205.0.1/24"
	labLabCIDR  = "10.205.0.2/24"
	// LabIP is the lab server's address; LabRange is opened to egress.
	labIP    = "10.205.0.2"
	labRange = "10.205.0.0/24"
)

// lab is a running lab: its namespace, veth pair and server process.
type lab struct {
	srv  *exec.Cmd
	done chan struct{}
	once sync.Once
	stop func() bool // unregisters the signal handler
}

// URL is the lab server's base URL.
func (l *lab) URL() string { return "http://" + labIP }

// ip runs ip(8) and returns its error with its output.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeLab removes what a lab of this name leaves: the server processes still in its
// namespace (only a bench's own lab server lives there), the namespace and the veth pair.
// It is idempotent, so a run killed before its cleanup is cleaned up by the next.
func removeLab() {
	if out, err := exec.Command("ip", "netns", "pids", labNetns).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	_ = exec.Command("ip", "netns", "del", labNetns).Run()
	_ = exec.Command("ip", "link", "del", labVethHost).Run()
}

// startLab creates the lab's namespace and veth pair and starts its server (this binary
// re-executed inside the namespace with -lab-serve), and waits until it answers /hello from
// the host. Close (also run on SIGINT/SIGTERM) removes all of it.
func startLab(ctx context.Context) (_ *lab, err error) {
	removeLab()
	// The range must be free: a route to it that is not ours would take the lab's traffic.
	if out, _ := exec.Command("ip", "-o", "route", "show", "to", "match", labIP).Output(); strings.Contains(string(out), "10.205.0.") {
		return nil, fmt.Errorf("lab: %s is already routed on this host (%s); the lab needs it", labRange, strings.TrimSpace(string(out)))
	}
	defer func() {
		if err != nil {
			removeLab()
		}
	}()
	for _, args := range [][]string{
		{"netns", "add", labNetns},
		{"link", "add", labVethHost, "type", "veth", "peer", "name", labVethLab},
		{"link", "set", labVethLab, "netns", labNetns},
		{"addr", "add", labHostCIDR, "dev", labVethHost},
		{"link", "set", labVethHost, "up"},
		{"-n", labNetns, "addr", "add", labLabCIDR, "dev", labVethLab},
		{"-n", labNetns, "link", "set", labVethLab, "up"},
		{"-n", labNetns, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	cmd := exec.Command("ip", "netns", "exec", labNetns, self, "-lab-serve", labIP+":80")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// ip execs the server in place; it dies with the bench even if the bench is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("lab: start server: %w", err)
	}
	l := &lab{srv: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(l.done) }()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stopped := make(chan struct{})
	l.stop = func() bool { signal.Stop(sigs); close(stopped); return true }
	go func() {
		select {
		case s := <-sigs:
			l.kill()
			log.Fatalf("bench: %v: lab removed", s)
		case <-stopped:
		}
	}()
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	hc := labClient()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-l.done:
			return nil, errors.New("lab: server exited at start (its output is above)")
		default:
		}
		resp, err := hc.Get(l.URL() + "/hello")
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
			resp.Body.Close()
			if resp.StatusCode == 200 && string(b) == "hello\n" {
				return l, nil
			}
			err = fmt.Errorf("/hello: %s %q", resp.Status, b)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("lab: server not answering within 10 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (l *lab) kill() {
	l.once.Do(func() {
		if l.srv.Process != nil {
			_ = l.srv.Process.Kill()
			select {
			case <-l.done:
			case <-time.After(5 * time.Second):
			}
		}
		removeLab()
	})
}

// Close stops the server and removes the namespace and the veth pair.
func (l *lab) Close() {
	l.kill()
	l.stop()
}

// labClient is an HTTP client for the lab from the host: no proxy, bounded.
func labClient() *http.Client {
	return &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4}}
}

// labStats is the lab server's GET /stats.
type labStats struct {
	Active int `json:"active"`
	// Peak is the most requests of /bytes open at once since the last /arm.
	Peak int `json:"peak"`
	// Armed is the barrier count of the last /arm; ReleasedBy says whether the barrier opened
	// because Armed requests were open at once ("count") or by its timeout ("timeout").
	Armed      int    `json:"armed"`
	ReleasedBy string `json:"released_by,omitempty"`
	Served     int64  `json:"served"`
}

// labServer is the lab's HTTP server (run with -lab-serve inside the lab's namespace):
//
//	GET /hello              → "hello\n"
//	GET /bytes?n=N[&ms=M][&wait=1] → N bytes (N ≤ 1 GiB), paced over M ms (≤ 60 s); with wait,
//	                          held until the armed number of /bytes requests is open at once
//	                          (or 60 s)
//	GET /arm?count=C        → arms the barrier for C (≤ 100,000) requests, resets the peak
//	GET /stats              → labStats
type labServer struct {
	mu      sync.Mutex
	st      labStats
	release chan struct{}
}

var labChunk = make([]byte, 64<<10)

func (s *labServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	atoi := func(k string, max int64) (int64, bool) {
		if q.Get(k) == "" {
			return 0, true
		}
		v, err := strconv.ParseInt(q.Get(k), 10, 64)
		return v, err == nil && v >= 0 && v <= max
	}
	switch r.URL.Path {
	case "/hello":
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "hello\n")
	case "/stats":
		s.mu.Lock()
		st := s.st
		s.mu.Unlock()
		json.NewEncoder(w).Encode(st)
	case "/arm":
		c, ok := atoi("count", 100_000)
		if !ok {
			http.Error(w, "count: 0–100000", 400)
			return
		}
		s.mu.Lock()
		s.st.Armed, s.st.Peak, s.st.ReleasedBy = int(c), s.st.Active, ""
		s.release = make(chan struct{})
		s.mu.Unlock()
	case "/bytes":
		n, ok1 := atoi("n", 1<<30)
		pace, ok2 := atoi("ms", 60_000)
		if !ok1 || !ok2 {
			http.Error(w, "n: 0–1073741824, ms: 0–60000", 400)
			return
		}
		s.mu.Lock()
		s.st.Active++
		s.st.Peak = max(s.st.Peak, s.st.Active)
		release := s.release
		if release != nil && s.st.ReleasedBy == "" && s.st.Active >= s.st.Armed {
			s.st.ReleasedBy = "count"
			close(release)
		}
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.st.Active--
			s.st.Served++
			s.mu.Unlock()
		}()
		if q.Get("wait") == "1" && release != nil {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			case <-time.After(60 * time.Second):
				s.mu.Lock()
				if s.st.ReleasedBy == "" {
					s.st.ReleasedBy = "timeout"
					close(release)
				}
				s.mu.Unlock()
			}
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		chunks := (n + int64(len(labChunk)) - 1) / int64(len(labChunk))
		var gap time.Duration
		if pace > 0 && chunks > 0 {
			gap = time.Duration(pace) * time.Millisecond / time.Duration(chunks)
		}
		for left := n; left > 0; {
			k := min(left, int64(len(labChunk)))
			if _, err := w.Write(labChunk[:k]); err != nil {
				return
			}
			left -= k
			if gap > 0 && left > 0 {
				w.(http.Flusher).Flush()
				time.Sleep(gap)
			}
		}
	default:
		http.NotFound(w, r)
	}
}

// serveLab is the lab server's process: it serves addr until killed (by the bench, or with
// it: the bench starts it with a parent-death signal).
func serveLab(addr string) {
	srv := &http.Server{Addr: addr, Handler: &labServer{}, ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: 30 * time.Second}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatalf("lab server: %v", err)
	}
	log.Fatalf("lab server: %v", srv.Serve(ln))
}
