package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/agentbox/agentbox/internal/blobs"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/agent"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// The file relay figure: a 100 MiB binary file pulled from a joined machine into a blob
// and pushed back to it (blobs.Service through machine.Registry's WebSocket + yamux session to an
// in-process agent on loopback, its hostfiles handler: every byte hashed, synced and renamed at
// each end), throughput ≥ 200 MiB/s, beside a floor measured in the same
// run: cp of the same file followed by an fsync of the copy (one read, one synced write; the
// relay does two of each).

type blobsBenchFlags struct {
	only   *bool
	mib    *int
	rounds *int
}

func blobsFlags() blobsBenchFlags {
	return blobsBenchFlags{
		only:   flag.Bool("blobs-only", false, "measure only the file relay's pull+push throughput (no sandboxes, no root)"),
		mib:    flag.Int("blobs-mib", 100, "size of the relayed file in MiB"),
		rounds: flag.Int("blobs-rounds", 5, "timed pull+push rounds (and as many floors, alternated)"),
	}
}

// Names of the relay's figures.
const (
	measureRelayPull     = "remote_pull throughput (100 MiB, loopback)"
	measureRelayPush     = "remote_push throughput (100 MiB, loopback)"
	measureRelayPullPush = "remote_pull + remote_push throughput (100 MiB each way, loopback)"
	measureRelayFloor    = "floor: cp + fsync of the same file"
)

// joinedMachine starts a registry behind an HTTP server on loopback and one machine agent
// (in this process) that joins it and connects: the relay then reaches the agent's /files/
// handler through Registry.Client, one yamux stream per connection over the WebSocket, as in
// agentbox serve.
func joinedMachine(ctx context.Context, st *sqlite.Store, stateDir string) (*machine.Registry, func()) {
	reg := machine.New(st, machine.Options{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+proto.JoinPath, func(w http.ResponseWriter, r *http.Request) {
		var req proto.JoinRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, proto.MaxJoinBody)).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rep, err := reg.Enroll(r.Context(), req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("GET "+proto.ConnectPath, reg.ServeConnect)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	tok, err := reg.CreateToken(ctx, machine.TokenRequest{Uses: 1})
	if err != nil {
		log.Fatal(err)
	}
	cfg := agent.Config{ServerURL: "http://" + ln.Addr().String(), StateDir: stateDir,
		GPUs: func(context.Context) ([]gpu.GPU, error) { return nil, nil }}
	ast, err := agent.Enroll(ctx, cfg, tok.Secret, "bench")
	if err != nil {
		log.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = agent.Run(actx, cfg, ast) }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if m, err := reg.Get(ctx, "bench"); err == nil && m.Online {
			break
		}
		if time.Now().After(deadline) {
			log.Fatal("the bench machine did not come online")
		}
	}
	return reg, func() { cancel(); <-done; reg.Close(); hs.Close() }
}

func runBlobsBench(ctx context.Context, f blobsBenchFlags, out string) {
	res := Results{CPUs: goruntime.NumCPU(), When: time.Now().UTC(), Skipped: map[string]string{}}
	res.Host, _ = os.Hostname()
	res.Stats = benchBlobs(ctx, f)
	printStats(res.Stats)
	if out != "bench/results.json" {
		writeResults(res, out)
	}
}

// benchBlobs times 100 MiB (-blobs-mib) pulled from a joined machine and pushed back, beside
// cp+fsync of the same file.
func benchBlobs(ctx context.Context, f blobsBenchFlags) []Stat {
	dir, err := os.MkdirTemp("", "abbench-blobs")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	reg, stop := joinedMachine(ctx, st, filepath.Join(dir, "agent"))
	defer stop()
	size := int64(*f.mib) << 20
	svc, err := blobs.New(blobs.Config{Store: st, Dir: filepath.Join(dir, "blobs"), Machines: reg,
		MaxFileBytes: size, TransfersPerHour: 1000, BytesPerDay: size * 1000})
	if err != nil {
		log.Fatal(err)
	}
	src := filepath.Join(dir, "src.bin")
	sf, err := os.Create(src)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := io.CopyN(sf, rand.Reader, size); err != nil {
		log.Fatal(err)
	}
	sf.Close()
	mibs := func(d time.Duration) float64 { return float64(size) / (1 << 20) / d.Seconds() }
	var pulls, pushes, both, floors []float64
	for i := range *f.rounds + 1 {
		// The floor: cp, then fsync the copy.
		c0 := time.Now()
		cp := filepath.Join(dir, "cp.bin")
		if out, err := exec.Command("cp", src, cp).CombinedOutput(); err != nil {
			log.Fatalf("cp: %v: %s", err, out)
		}
		cf, err := os.OpenFile(cp, os.O_RDWR, 0)
		if err != nil {
			log.Fatal(err)
		}
		if err := cf.Sync(); err != nil {
			log.Fatal(err)
		}
		cf.Close()
		floor := time.Since(c0)
		os.Remove(cp)

		p0 := time.Now()
		r, err := svc.Pull(ctx, "bench", "bench", src)
		if err != nil {
			log.Fatal(err)
		}
		pull := time.Since(p0)
		q0 := time.Now()
		if _, err := svc.Push(ctx, "bench", r.BlobID, "bench", filepath.Join(dir, "dst.bin")); err != nil {
			log.Fatal(err)
		}
		push := time.Since(q0)
		if err := svc.Delete(ctx, "bench", r.BlobID); err != nil {
			log.Fatal(err)
		}
		if i == 0 {
			continue // warm-up
		}
		floors = append(floors, mibs(floor))
		pulls = append(pulls, mibs(pull))
		pushes = append(pushes, mibs(push))
		both = append(both, 2*mibs(pull+push))
		log.Printf("round %d: pull %.0f MiB/s, push %.0f MiB/s, pull+push %.0f MiB/s; floor cp+fsync %.0f MiB/s",
			i, mibs(pull), mibs(push), 2*mibs(pull+push), mibs(floor))
	}
	fl := summarize(measureRelayFloor, "MiB/s", floors)
	floorText := fmt.Sprintf("floor cp+fsync p50 %.0f MiB/s in the same run", fl.P50)
	s := summarize(measureRelayPullPush, "MiB/s", both)
	s.Floor = "≥ 200 MiB/s; " + floorText
	p := summarize(measureRelayPull, "MiB/s", pulls)
	p.Floor = floorText
	q := summarize(measureRelayPush, "MiB/s", pushes)
	q.Floor = floorText
	return []Stat{s, p, q, fl}
}
