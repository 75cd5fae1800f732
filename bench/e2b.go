package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/e2b/envd/process"
	"github.com/agentbox/agentbox/internal/e2b/envd/process/processconnect"
	"github.com/agentbox/agentbox/internal/wire"
)

// The E2B-compatible API's figures (make bench-e2b), against a real `agentbox serve` with runc
// sandboxes, E2B's own SDK (test/e2bsdk/bench.mjs, run by node) beside agentbox's REST client
// in the same run: Sandbox.create() → the first commands.run result vs REST create → first
// exec; commands.run('true') vs REST exec of true; runCode('1+1') on a warm context.

type e2bFlagSet struct {
	only    *bool
	creates *int
	calls   *int
	out     *string
}

func e2bBenchFlags() e2bFlagSet {
	return e2bFlagSet{
		only:    flag.Bool("e2b-only", false, "measure only the E2B-compatible API's figures (make bench-e2b; writes -e2b-out)"),
		creates: flag.Int("e2b-creates", 10, "creates → first command timed, through the SDK and through REST each"),
		calls:   flag.Int("e2b-calls", 50, "commands.run('true'), REST exec and runCode('1+1') round trips timed"),
		out:     flag.String("e2b-out", "bench/results-e2b.json", "where -e2b-only writes its results"),
	}
}

func runE2BBench(ctx context.Context, bin string, f e2bFlagSet) []Stat {
	node, err := exec.LookPath("node")
	if err != nil {
		log.Fatal("bench-e2b needs node (make deps-e2b installs it with E2B's SDKs)")
	}
	if _, err := os.Stat("test/e2bsdk/node_modules/@e2b/code-interpreter/package.json"); err != nil {
		log.Fatal("E2B's SDKs are not installed: make deps-e2b")
	}
	const token = "bench-e2b-token-0123456789abcdef"
	s := startBenchServerAt(bin, token, "abbench-e2b")
	defer s.stop()
	c := client.New(s.url, token)
	k, err := c.CreateKey(ctx, wire.KeyCreateRequest{Name: "bench-e2b", Scope: "operate"})
	if err != nil {
		log.Fatal(err)
	}
	kc := client.New(s.url, k.Secret)
	// The SDK's process, driven over stdin so that its creates take turns with REST's.
	cmd := exec.CommandContext(ctx, node, "bench.mjs")
	cmd.Dir = filepath.Join("test", "e2bsdk")
	cmd.Env = append(os.Environ(), "E2B_API_URL="+s.url, "E2B_SANDBOX_URL="+s.url, "E2B_API_KEY="+k.Secret)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stdout)
	lines.Buffer(nil, 1<<20)
	var sdk struct {
		Ready       bool
		CreateFirst float64
		Run         []float64
		RunCode     []float64
		RawStart    []float64
		RawExec     []float64
	}
	next := func(ask string) {
		if ask != "" {
			fmt.Fprintln(stdin, ask)
		}
		if !lines.Scan() {
			log.Fatalf("node bench.mjs ended: %v", lines.Err())
		}
		sdk.CreateFirst, sdk.Run, sdk.RunCode, sdk.RawStart, sdk.RawExec = 0, nil, nil, nil, nil
		if err := json.Unmarshal(lines.Bytes(), &sdk); err != nil {
			log.Fatalf("node bench.mjs printed %q: %v", lines.Text(), err)
		}
	}
	next("") // ready
	// SDK's argv for commands.run(cmd): a login bash; REST runs it too, as the like-for-like floor.
	login := []string{"/bin/bash", "-l", "-c", "true"}
	restFirst := func(argv []string) float64 {
		t0 := time.Now()
		sb, err := kc.Create(ctx, wire.CreateRequest{TTLSeconds: 120})
		if err != nil {
			log.Fatal(err)
		}
		if _, err := kc.Exec(ctx, sb.ID, wire.ExecRequest{Command: argv}, nil); err != nil {
			log.Fatal(err)
		}
		d := ms(time.Since(t0))
		if _, err := kc.Destroy(ctx, sb.ID); err != nil {
			log.Fatal(err)
		}
		return d
	}
	var restCreate, restCreateLogin, sdkCreate, restExec, restExecLogin, rpcStart []float64
	for i := 0; i < *f.creates; i++ { // in turns
		restCreate = append(restCreate, restFirst([]string{"true"}))
		restCreateLogin = append(restCreateLogin, restFirst(login))
		next("create")
		sdkCreate = append(sdkCreate, sdk.CreateFirst)
	}
	sb, err := kc.Create(ctx, wire.CreateRequest{TTLSeconds: 300})
	if err != nil {
		log.Fatal(err)
	}
	// The server's share: the same Start RPC the SDK sends, from Go's Connect client.
	pc := processconnect.NewProcessClient(http.DefaultClient, s.url, connect.WithProtoJSON())
	noStdin := false
	startRPC := func() {
		req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: login[0], Args: login[1:]}, Stdin: &noStdin}) // as the SDK sends it
		req.Header().Set("E2b-Sandbox-Id", sb.ID)
		req.Header().Set("X-Access-Token", k.Secret)
		st, err := pc.Start(ctx, req)
		if err != nil {
			log.Fatal(err)
		}
		for st.Receive() {
		}
		if err := st.Err(); err != nil {
			log.Fatal(err)
		}
		_ = st.Close()
	}
	for i := 0; i < *f.calls+1; i++ {
		t0 := time.Now()
		startRPC()
		if i > 0 {
			rpcStart = append(rpcStart, ms(time.Since(t0)))
		}
		for _, argv := range [][]string{{"true"}, login} {
			t0 := time.Now()
			if _, err := kc.Exec(ctx, sb.ID, wire.ExecRequest{Command: argv}, nil); err != nil {
				log.Fatal(err)
			}
			if i == 0 { // the first warms the connection
				continue
			}
			if len(argv) == 1 {
				restExec = append(restExec, ms(time.Since(t0)))
			} else {
				restExecLogin = append(restExecLogin, ms(time.Since(t0)))
			}
		}
	}
	_, _ = kc.Destroy(ctx, sb.ID)
	next("calls " + strconv.Itoa(*f.calls))
	rc, rcl := summarize("REST create → first exec true", "ms", restCreate), summarize("REST create → first exec bash -l -c true", "ms", restCreateLogin)
	re, rel := summarize("REST exec true", "ms", restExec), summarize("REST exec bash -l -c true", "ms", restExecLogin)
	sc, sr := summarize("E2B SDK Sandbox.create() → first commands.run", "ms", sdkCreate), summarize("E2B SDK commands.run('true')", "ms", sdk.Run)
	sc.Floor = fmt.Sprintf("REST, the same bash -l: p50 %.1f ms, +%.1f ms (target ≤ +10 ms); REST exec true: +%.1f ms", rcl.P50, sc.P50-rcl.P50, sc.P50-rc.P50)
	sr.Floor = fmt.Sprintf("REST, the same bash -l: p50 %.1f ms, ×%.2f (target ≤ ×2); REST exec true: ×%.2f", rel.P50, sr.P50/rel.P50, sr.P50/re.P50)
	rs := summarize("Connect Start of bash -l -c true from Go (the server's share)", "ms", rpcStart)
	rs.Floor = fmt.Sprintf("REST exec of the same argv p50 %.1f ms: +%.2f ms", rel.P50, rs.P50-rel.P50)
	// From Node, in turns with the SDK's calls: the same Start RPC with plain fetch, and REST.
	ns, ne := summarize("Node fetch: Connect Start of bash -l -c true (no SDK)", "ms", sdk.RawStart), summarize("Node fetch: REST exec bash -l -c true", "ms", sdk.RawExec)
	ns.Floor = fmt.Sprintf("Node fetch REST exec, same turns: p50 %.2f ms, %+.2f ms; the SDK's commands.run, same turns: p50 %.2f ms (×%.2f the Node REST exec)", ne.P50, ns.P50-ne.P50, sr.P50, sr.P50/ne.P50)
	code := summarize("E2B SDK runCode('1+1'), warm context", "ms", sdk.RunCode)
	code.Floor = "target p50 ≤ 20 ms"
	return []Stat{rc, rcl, sc, re, rel, sr, rs, ns, ne, code}
}

func writeE2BResults(stats []Stat, out string) {
	res := Results{When: time.Now().UTC(), Stats: stats}
	res.Host, _ = os.Hostname()
	writeResults(res, out)
}
