// Package internal_test keeps the direction of dependencies between agentbox's packages
// (docs/ARCHITECTURE.md): it asks `go list` for the module's import graph and fails on an edge
// the architecture forbids.
package internal_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/agentbox/agentbox/"

// pkg is what the rules look at of one package of the module (`go list -json`).
type pkg struct {
	ImportPath string
	// Imports are the package's direct imports; Deps its transitive ones (neither counts tests).
	Imports, Deps []string
	// TestImports and XTestImports are its tests' direct imports.
	TestImports, XTestImports []string
}

// dbDrivers are the import paths (and their subpackages) that talk to a database.
var dbDrivers = []string{"database/sql", "modernc.org/sqlite", "github.com/mattn/go-sqlite3",
	"github.com/jackc/pgx", "github.com/lib/pq"}

// storeDrivers may import dbDrivers: they are the only code that knows a database (sqlstore
// is the SQL they share; pglab creates the throwaway Postgres databases tests run on).
var storeDrivers = []string{module + "internal/store/sqlite", module + "internal/store/postgres",
	module + "internal/store/sqlstore", module + "internal/testenv/pglab"}

// features are the feature packages over the sandbox lifecycle core: each depends on the core
// (internal/sandbox), which calls them only through the hooks they register, never by import.
var features = []string{module + "internal/sandbox/metrics", module + "internal/sandbox/netsession", module + "internal/sandbox/imageadmin", module + "internal/sandbox/jobs", module + "internal/sandbox/pools", module + "internal/sandbox/snapshots"}

// under reports whether path is p or one of its subpackages.
func under(path, p string) bool { return path == p || strings.HasPrefix(path, p+"/") }

func underAny(path string, ps ...string) bool {
	return slices.ContainsFunc(ps, func(p string) bool { return under(path, p) })
}

// leaves are packages every other may use (the machine agent's, built for every platform,
// included): they depend on the standard library and on nothing of the module but what allowed
// names.
var leaves = map[string]struct {
	allowed []string
	why     string
}{
	module + "internal/text":       {why: "text is a leaf: the standard library only"},
	module + "internal/tmpfs":      {why: "tmpfs (the sizes of a sandbox's /tmp and /dev/shm, the same in the agent's VM init and the runtimes) is a leaf: the standard library only"},
	module + "internal/faultpoint": {why: "faultpoint (the crash points of test builds) is a leaf: the standard library only"},
	module + "internal/peerreply": {allowed: []string{module + "internal/errcode", module + "internal/text"},
		why: "peerreply reads agents' replies for the server and the machine side alike: the standard library, errcode and text only"},
	module + "internal/jobmodel": {allowed: []string{module + "internal/errcode"},
		why: "jobmodel is what sandbox and machine jobs share: the standard library and errcode only"},
	module + "internal/sandboxid": {allowed: []string{module + "internal/errcode"},
		why: "sandboxid is the sandbox id format the CLI's client checks: the standard library and errcode only"},
	module + "internal/wire": {allowed: []string{module + "internal/errcode"},
		why: "the REST API's request and reply types are a leaf, so that the CLI's client needs nothing of the server to speak it: the standard library and errcode only"},
}

// clientDeps are all the CLI's client (internal/api/client) may use of the module: the wire
// types, the error codes, and leaves that themselves use nothing of the module but errcode
// (the sandbox id format, the job model's id format, text).
var clientDeps = []string{module + "internal/wire", module + "internal/errcode", module + "internal/sandboxid",
	module + "internal/jobmodel", module + "internal/text"}

// guestDeps are all the lean in-sandbox agent (cmd/agentbox-guest, PID 1 of every sandbox) may
// link beyond the standard library: the agent, its in-pod commands and their leaves, and the
// three libraries they use. Whatever else it linked (the server, a store, a database driver, the
// Kubernetes client) every idle sandbox would hold in memory.
var guestDeps = []string{module + "internal/guest", module + "internal/guestcmd", module + "internal/version",
	module + "internal/runtime/kubernetes/tunnel", module + "internal/runtime/kubernetes/podpath", module + "internal/runtime/microvm/vminit",
	module + "internal/errcode", module + "internal/jobmodel", module + "internal/text", module + "internal/peerreply",
	module + "internal/tmpfs", "github.com/creack/pty", "github.com/hashicorp/yamux", "golang.org/x/sys"}

// std reports whether an import path is the standard library's (its first element has no dot).
func std(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// violations applies the rules to a module's packages and returns every forbidden edge.
func violations(pkgs []pkg) []string {
	var out []string
	forbid := func(p pkg, deps []string, why string, bad ...string) {
		for _, d := range deps {
			if underAny(d, bad...) {
				out = append(out, p.ImportPath+" → "+d+": "+why)
			}
		}
	}
	for _, p := range pkgs {
		path := p.ImportPath
		if underAny(path, module+"internal/runtime", module+"internal/store") {
			forbid(p, p.Deps, "runtimes and stores are below the adapters",
				module+"internal/api", module+"internal/mcpserver")
		}
		if path == module+"internal/sandbox" {
			forbid(p, p.Deps, "the control plane declares the Store it needs and knows no adapter",
				module+"internal/store", module+"internal/api", module+"internal/mcpserver")
			forbid(p, p.Deps, "the lifecycle core calls its features through the hooks they register, never by import",
				features...)
		}
		if under(path, module+"internal/sandbox") || under(path, module+"internal/runtime") || under(path, module+"internal/store") {
			forbid(p, p.Deps, "the E2B-compatible API and the code interpreter are surfaces over the core, which knows neither",
				module+"internal/e2b", module+"internal/interp")
		}
		if under(path, module+"internal/e2b") || path == module+"internal/interp" {
			forbid(p, p.Deps, "the E2B surface and the interpreter are entered through the API server's routes (and its gate), never the reverse; they declare no store",
				module+"internal/api", module+"internal/mcpserver", module+"internal/store")
		}
		if under(path, module+"internal/runs") {
			forbid(p, p.Deps, "the run service declares the Store it needs and knows no adapter",
				module+"internal/store", module+"internal/api", module+"internal/mcpserver")
		}
		if under(path, module+"internal/authz") {
			forbid(p, p.Deps, "the authorization gate declares the stores it reads and is beneath the surfaces that enter it",
				module+"internal/store", module+"internal/api", module+"internal/mcpserver")
		}
		if under(path, module+"internal/lease") {
			forbid(p, p.Deps, "the lease machinery runs any work on one replica at a time and knows nothing of what the work is",
				module+"internal/sandbox", module+"internal/store", module+"internal/api", module+"internal/mcpserver")
		}
		if under(path, module+"internal/egress") {
			forbid(p, p.Deps, "the egress proxy knows no sandbox record, store, runtime or adapter: the control plane hands it a Target",
				module+"internal/sandbox", module+"internal/store", module+"internal/runtime", module+"internal/guest",
				module+"internal/api", module+"internal/mcpserver")
		}
		if path == module+"internal/runtime" {
			forbid(p, p.Deps, "the runtime contract is lifecycle only; the guest protocol is the runtimes' business",
				module+"internal/guest")
		}
		if path == module+"internal/machine/agent" || path == module+"internal/machine/proto" || path == module+"internal/gpu" {
			forbid(p, p.Deps, "the machine side builds for every platform and knows nothing of the server",
				module+"internal/sandbox", module+"internal/store", module+"internal/runtime", module+"internal/api",
				module+"internal/mcpserver", module+"internal/runs")
			if path != module+"internal/machine/agent" {
				forbid(p, p.Deps, "proto and gpu are below the agent", module+"internal/machine/agent")
			}
		}
		if path == module+"internal/api/client" {
			for _, d := range p.Deps {
				if under(d, strings.TrimSuffix(module, "/")) && !slices.Contains(clientDeps, d) {
					out = append(out, path+" → "+d+": the CLI's client speaks the REST API through its wire types (internal/wire): of the module it uses only wire, errcode and the leaves sandboxid, jobmodel and text, never the server's packages")
				}
			}
		}
		if leaf, ok := leaves[path]; ok {
			for _, d := range p.Deps {
				if !std(d) && !slices.Contains(leaf.allowed, d) {
					out = append(out, path+" → "+d+": "+leaf.why)
				}
			}
		}
		if path == module+"cmd/agentbox-guest" || path == module+"internal/guestcmd" {
			for _, d := range p.Deps {
				if !std(d) && !underAny(d, guestDeps...) {
					out = append(out, path+" → "+d+": the lean agent links only the agent (internal/guest, guestcmd), the tunnel and their leaves, creack/pty, yamux and x/sys: every idle sandbox holds what it links")
				}
			}
		}
		if path == module+"cmd/agentbox" {
			forbid(p, p.Deps, "client-go's clientset registers every Kubernetes API group at init in every agentbox process, each sandbox's agent included; the kubernetes runtime has its own small client (client.go)",
				"k8s.io/client-go/kubernetes")
			forbid(p, p.Deps, "BPF (cilium/ebpf) is the bench's in-kernel relay peer only, not part of the server",
				"github.com/cilium/ebpf")
		}
		forbid(p, slices.Concat(p.Deps, p.TestImports, p.XTestImports),
			"agentbox talks to Kubernetes through client-go only; k8s.io/kubernetes is built in hack/k8s's own modules",
			"k8s.io/kubernetes")
		if !underAny(path, storeDrivers...) {
			direct := slices.Concat(p.Imports, p.TestImports, p.XTestImports)
			forbid(p, direct, "only store drivers talk to a database", dbDrivers...)
		}
	}
	return out
}

// TestDependencyDirection runs the rules over the module's real import graph.
func TestDependencyDirection(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps,TestImports,XTestImports", module+"...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	// The rules must see the packages they are about, or they prove nothing.
	for _, want := range []string{"cmd/agentbox-guest", "internal/guestcmd", "internal/runtime", "internal/runtime/oci", "internal/store/sqlite", "internal/sandbox", "internal/sandbox/metrics", "internal/sandbox/netsession", "internal/sandbox/imageadmin", "internal/sandbox/snapshots", "internal/api", "internal/api/client", "internal/mcpserver"} {
		if !slices.ContainsFunc(pkgs, func(p pkg) bool { return p.ImportPath == module+want }) {
			t.Fatalf("go list did not report %s", want)
		}
	}
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
}

// TestDependencyRules checks that each rule catches the edge it forbids, and allows the ones
// the architecture has.
func TestDependencyRules(t *testing.T) {
	t.Parallel()
	m := func(s ...string) []string {
		for i := range s {
			if !strings.Contains(s[i], ".") {
				s[i] = module + s[i]
			}
		}
		return s
	}
	bad := []pkg{
		{ImportPath: module + "internal/runtime/oci", Deps: m("internal/api")},
		{ImportPath: module + "internal/store/storetest", Deps: m("internal/mcpserver")},
		{ImportPath: module + "internal/sandbox", Deps: m("internal/store")},
		{ImportPath: module + "internal/sandbox", Deps: m("internal/api/client")},
		{ImportPath: module + "internal/sandbox", Deps: m("internal/sandbox/metrics")},
		{ImportPath: module + "internal/sandbox", Deps: m("internal/sandbox/netsession")},
		{ImportPath: module + "internal/sandbox", Deps: m("internal/sandbox/imageadmin")},
		{ImportPath: module + "internal/sandbox", Deps: m("internal/sandbox/snapshots")},
		{ImportPath: module + "internal/runtime", Deps: m("internal/guest")},
		{ImportPath: module + "internal/config", Imports: m("modernc.org/sqlite")},
		{ImportPath: module + "internal/sandbox", XTestImports: m("github.com/jackc/pgx/v5")},
		{ImportPath: module + "cmd/agentbox", Imports: []string{"database/sql"}},
		{ImportPath: module + "internal/runtime/kubernetes", Deps: []string{"k8s.io/kubernetes/pkg/api/v1/pod"}},
		{ImportPath: module + "cmd/agentbox", Deps: []string{"k8s.io/client-go/kubernetes/scheme"}},
		{ImportPath: module + "internal/text", Deps: m("internal/errcode")},
		{ImportPath: module + "internal/peerreply", Deps: m("internal/sandbox")},
		{ImportPath: module + "internal/jobmodel", Deps: []string{"golang.org/x/text"}},
		{ImportPath: module + "internal/wire", Deps: m("internal/sandbox")},
		{ImportPath: module + "internal/wire", Deps: []string{"encoding/json", "github.com/google/uuid"}},
		{ImportPath: module + "internal/lease", Deps: m("internal/sandbox")},
		{ImportPath: module + "internal/lease", Deps: m("internal/store")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/api")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/machine/agent")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/blobs")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/store")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/runtime")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/sandbox")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/runs")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/image")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/approval")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/audit")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/auth")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/egress")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/sqlquery")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/remoteexec")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/screenshot")},
		{ImportPath: module + "internal/api/client", Deps: m("internal/machine")},
		{ImportPath: module + "internal/sandboxid", Deps: m("internal/text")},
		{ImportPath: module + "cmd/agentbox-guest", Deps: []string{"k8s.io/client-go/rest"}},
		{ImportPath: module + "cmd/agentbox-guest", Deps: []string{"github.com/jackc/pgx/v5"}},
		{ImportPath: module + "cmd/agentbox-guest", Deps: m("internal/runtime/kubernetes")},
		{ImportPath: module + "cmd/agentbox-guest", Deps: m("internal/sandbox")},
		{ImportPath: module + "internal/guestcmd", Deps: m("internal/api")},
	}
	for _, p := range bad {
		if v := violations([]pkg{p}); len(v) != 1 {
			t.Errorf("%+v: violations %q, want one", p, v)
		}
	}
	good := []pkg{
		{ImportPath: module + "internal/runtime/oci", Deps: m("internal/guest", "internal/runtime")},
		{ImportPath: module + "internal/store/sqlite", Imports: m("modernc.org/sqlite", "database/sql"), Deps: m("internal/sandbox")},
		{ImportPath: module + "internal/store/postgres", Imports: m("github.com/jackc/pgx/v5")},
		{ImportPath: module + "internal/sandbox", Deps: m("internal/runtime", "internal/guest", "internal/storeutil")},
		{ImportPath: module + "cmd/agentbox", Deps: m("internal/store/sqlite", "modernc.org/sqlite", "internal/api")},
		{ImportPath: module + "internal/mcpserver", Deps: m("internal/sandbox")},
		{ImportPath: module + "internal/wire", Deps: []string{"encoding/json", "time", module + "internal/errcode"}},
		{ImportPath: module + "internal/sandbox", Deps: m("internal/lease")},
		{ImportPath: module + "internal/sandbox/metrics", Deps: m("internal/sandbox", "internal/runtime")},
		{ImportPath: module + "internal/sandbox/netsession", Deps: m("internal/sandbox", "internal/egress")},
		{ImportPath: module + "internal/mcpserver", Deps: m("internal/sandbox/netsession", "internal/sandbox")},
		{ImportPath: module + "internal/sandbox/imageadmin", Deps: m("internal/sandbox", "internal/image", "internal/runtime")},
		{ImportPath: module + "internal/api", Deps: m("internal/sandbox/metrics", "internal/sandbox")},
		{ImportPath: module + "internal/sandbox/snapshots", Deps: m("internal/sandbox", "internal/fsdiff", "internal/runtime")},
		{ImportPath: module + "internal/mcpserver", Deps: m("internal/sandbox/snapshots", "internal/sandbox")},
		{ImportPath: module + "internal/testenv/kubelab", Imports: []string{"k8s.io/client-go/kubernetes", "k8s.io/api/core/v1"}},
		{ImportPath: module + "internal/peerreply", Deps: append(m("internal/errcode", "internal/text"), "net/http")},
		{ImportPath: module + "internal/api/client", Imports: m("internal/wire", "internal/errcode", "internal/sandboxid", "internal/jobmodel"),
			Deps: append(m("internal/wire", "internal/errcode", "internal/sandboxid", "internal/jobmodel", "internal/text"),
				"net/http", "github.com/coder/websocket")},
		{ImportPath: module + "internal/sandboxid", Deps: m("internal/errcode")},
		{ImportPath: module + "cmd/agentbox-guest", Deps: append(m("internal/guestcmd", "internal/guest", "internal/runtime/kubernetes/tunnel",
			"internal/runtime/kubernetes/podpath", "internal/errcode", "internal/peerreply", "internal/version"),
			"net/http", "github.com/creack/pty", "github.com/hashicorp/yamux", "golang.org/x/sys/unix")},
	}
	if v := violations(good); len(v) != 0 {
		t.Errorf("allowed edges reported: %q", v)
	}
}
