// Command agentbox is the whole product in one static binary: the server (serve) and the CLI.
// The in-sandbox agent is the lean agentbox-guest beside it (cmd/agentbox-guest: the same
// guest commands, which this binary keeps, without the rest linked in).
package main

import (
	"fmt"
	"maps"
	"os"

	"github.com/agentbox/agentbox/internal/guestcmd"
	"github.com/agentbox/agentbox/internal/hostjobs"
)

func main() {
	closeInheritedFDs()
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	if f, ok := commands()[args[0]]; ok {
		return f(args[1:])
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Print(usage)
		return 0
	}
	fmt.Fprintf(os.Stderr, "agentbox: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// commands maps each verb of the binary to its command.
func commands() map[string]func([]string) int {
	m := map[string]func([]string) int{
		"serve":   cmdServe,
		"mcp":     cmdMCP,
		"sandbox": cmdSandbox,
		"exec":    cmdExec,
		"cp":      cmdCp,
		"watch":   cmdWatch, // watch.go
		"doctor":  cmdDoctor,
		"version": cmdVersion,
		// detached jobs (job.go)
		"job":   cmdJob,
		"logs":  cmdLogs,
		"shell": cmdShell, // interactive terminal (shell.go)
		"top":   cmdTop,   // metrics
		// network (network.go)
		"network": cmdNetwork, "connections": cmdConnections, "secret-calls": cmdSecretCalls,
		"expose": cmdExpose, "unexpose": cmdUnexpose,
		"image": cmdImage, // images (images.go)
		// durable runs (run.go)
		"run": cmdRun, "runs": cmdRuns, "batch": cmdBatch, "agent": cmdAgent,
		"token":     cmdToken,     // API keys (token.go)
		"sql":       cmdSQL,       // execute_sql (sql.go)
		"audit":     cmdAudit,     // the audit log (audit.go)
		"approvals": cmdApprovals, // approvals (approvals.go)
		// snapshots, fork, sleep, wake, diff (snapshots.go)
		"snapshot": cmdSnapshot, "snapshots": cmdSnapshots, "fork": cmdFork, "sleep": cmdSleep, "wake": cmdWake, "diff": cmdDiff,
		"pool": cmdPool, // warm pools (pools.go)
		"chat": cmdChat, // an agent loop against an OpenAI-compatible model (chat.go)
		// joined machines (join.go, machine.go)
		"join": cmdJoin, "machine": cmdMachine,
		// the supervisor of one remote job on a joined machine (hidden; hostjobs)
		hostjobs.SupervisorCommand: hostjobs.Supervise,
		// the kubernetes runtime's guest image (kube.go)
		"kube-guest-image": cmdKubeGuestImage,
	}
	// The in-sandbox commands (guest, and in pods guest-install, guest-kube and guest-tunnel;
	// hidden): the lean agentbox-guest is these alone, and this binary keeps their names.
	maps.Copy(m, guestcmd.Commands())
	return m
}

const usage = `agentbox — disposable Linux computers for AI agents, on your own machine

Server:
  agentbox serve [--listen ADDR] [--state-dir DIR] [--store postgres://…|sqlite://PATH] [--allow-remote] ...
                                        run the control plane (REST API on 127.0.0.1:8765)
                 [--run-workers N] [--checkout-dir DIR]... [--artifact-mb N] [--run-retention D]
                                        durable runs: workers, file:// repos, blob store, history
                 [--tls-cert F --tls-key F | --tls-self-signed] [--insecure-plaintext]
                 [--allow-private-network]  HTTPS and exposure beyond loopback (README: security)
                 [--audit-retention D] [--audit-max-rows N]
                                        the audit log: how long and how many records are kept
                 [--lease-ttl D]        several replicas on one Postgres: the lifecycle lease's TTL
                                        (README: Several replicas)
                 [--runtime vm] [--vm-kernel PATH] [--vm-accel auto|kvm|tcg]
                                        microVM sandboxes on QEMU (docs/VM.md)
  agentbox doctor [--store S]           what this host supports and how to fix what is missing
                 [--runtime kubernetes --kube-config F --kube-namespace NS]
                 [--kube-runtime-class-process C] [--kube-runtime-class-kernel C] [--kube-host-image REF]
                                        sandboxes as pods on a Kubernetes cluster (README: Kubernetes)
  agentbox kube-guest-image [-o FILE]   the guest image of this binary, for the cluster's nodes
  agentbox doctor [--kube-config F]     what this host (and cluster) supports and how to fix what is missing
  agentbox token create [--scope read|operate|admin] [--expires D] NAME   a named API key
                                        (printed once, last); token ls; token revoke NAME|ID

Joined machines (your own computers, dialling out to the server; README "Joined machines"):
  agentbox join URL --token T [--name N] [--install] [--fingerprint SHA256]   on the machine
  agentbox machine ls|get|rm|alias      the joined machines (get, rm, alias take id, name or alias)
  agentbox machine token create [--expires D] [--uses N] · token ls · token revoke ID   join tokens

MCP (for Claude Code, Codex, Cursor, Claude Desktop, any MCP client):
  agentbox mcp [--state-dir DIR]        serve MCP on stdio; uses the running server, or runs the
                                        control plane in-process. HTTP: serve's /mcp (and /sse)

Sandboxes (talk to a running server; AGENTBOX_URL / AGENTBOX_TOKEN or --server / --token):
  agentbox sandbox create [--image REF] [--runtime R] [--cpu N] [--memory-mb N] [--disk-mb N]
                          [--ttl SECONDS] [--env K=V]... [--label K=V]... [--idempotency-key K]
                          [--allow-host H]... [--deny-host H]... [--egress]
                          [--secret NAME=env:VAR@host1,host2]... (or NAME=file:/path@host)
                          [--snapshot SNAP] [--auto-wake] [--ttl-while-sleeping] [--on-expiry sleep]
                                        prints the new id; --allow-host gives it a network policy
                                        (default: no network at all)
  agentbox sandbox ls [--json] [--state S] [--label K=V]
  agentbox sandbox get [--json] ID
  agentbox sandbox rm ID...
  agentbox sandbox extend --ttl SECONDS ID
  agentbox sandbox events [--json] ID
  agentbox sandbox commit ID NAME[:TAG] turn the sandbox's root changes into a local image (a
                                        template: create --image NAME:TAG)
  agentbox snapshot [--memory] [--label K=V]... ID   save its files (and memory, where the
                                        runtime can); prints the snapshot id
  agentbox snapshots ls [--sandbox ID] [--cursor SNAP] [--limit N] [--json]  |  snapshots get|rm SNAP
  agentbox fork [--count N] [--snapshot SNAP | --memory] [--ttl SECONDS] [--label K=V]... ID
                                        N independent sandboxes from the same point; prints their ids
  agentbox sleep ID  |  agentbox wake ID   park a sandbox (memory and CPU released), bring it back
  agentbox diff [--with OTHER | --snapshot SNAP] [--no-unified] [--json] ID
                                        what changed: A/M/D MODE TYPE SIZE PATH, then a unified diff
                                        (default: against the sandbox's image)
  agentbox exec [--timeout SECONDS] [--env K=V]... [--cwd DIR] [--user root] ID -- ARGV...
                [--changes] [--checkpoint]   the paths it changed, a snapshot after it (stderr)
  agentbox exec --background ... ID -- ARGV...   start it as a detached job; prints the job id
  agentbox job start [--env K=V]... [--cwd DIR] [--user root] ID -- ARGV...
                                        start a detached job (it outlives this command and
                                        server restarts); prints the job id
  agentbox job ls [--json] [--limit N] ID
  agentbox job status [--json] ID JOB
  agentbox job wait [--timeout SECONDS] ID JOB    exit code: the job's (3: still running)
  agentbox job cancel [--grace SECONDS] ID JOB
  agentbox logs [-f] [--tail N] [--stream all|stdout|stderr] ID JOB
  agentbox watch [--stream lifecycle|events|logs|metrics|connections] [--job JOB] [--duration D] ID
                                        one line per event while it happens (logs: the job's output)
  agentbox top [--once] [--interval SECONDS] [--json]
                                        a live table of the fleet: state, runtime, CPU %, memory,
                                        pids, disk, TTL left (prints once when not on a terminal)
  agentbox cp SRC DST                   copy a file in or out: ./f ID:/workspace/f, ID:/path ./f
                                        (a progress bar on stderr when it is a terminal)
  agentbox shell [--user root] [--cwd DIR] [--env K=V]... [--detach] ID [-- CMD...]
                                        an interactive terminal (default: the login shell);
                                        exits with the command's exit code; --detach runs CMD as a
                                        detached job instead and prints its id
  agentbox network set ID [--allow H]... [--deny H]...   replace a sandbox's egress policy (live)
  agentbox network show [--json] ID     its policy and preview URLs
  agentbox connections [--after N] [--limit N] [--json] ID
                                        its connections: TIME KIND HOST PORT DECISION RULE OUT IN MS
  agentbox secret-calls [--after N] [--limit N] [--json] ID   requests that carried a secret
  agentbox expose [--public] ID PORT    a preview URL for a server in the sandbox (prints the URL
                                        and, when private, the URL with its access token)
  agentbox unexpose ID PORT
  agentbox image pull REF               pull an OCI image (a bar per layer on a terminal)
  agentbox image ls [--json]            the cached images: size, layers, sandboxes using them
  agentbox image inspect REF|DIGEST     one image as JSON
  agentbox image rm [--force] REF...    untag (and delete when unnamed and unused)
  agentbox image prune [--all]          remove what no live sandbox uses
  agentbox image import FILE.tar        a ` + "`docker save`" + ` or OCI-layout tarball (- for stdin)
  agentbox image push NAME REF          push a cached (e.g. committed) image to a registry
  agentbox pool set NAME --size N [--image I] [--runtime R] [--cpu C] [--memory-mb M] [--disk-mb D]
                                        keep N ready sandboxes of that shape: a create of the
                                        same shape claims one (from_pool) instead of starting one
  agentbox pool ls [--json]             pools: ready, size, starting, hits, misses, shape
  agentbox pool rm NAME...              delete pools (their ready sandboxes are destroyed)
  agentbox machine exec NAME [--shell S] [--timeout-ms N] [--elevated] [--env K=V]... [--cwd D] -- 'SCRIPT'
                                        run a script on a joined machine (exit 124: timed out,
                                        125: connection lost; the outcome is then unknown)
  agentbox machine screenshot NAME [--display N] -o FILE.png
                                        a screenshot of a joined machine's display
  agentbox run [--repo URL] [--ref REF] [--setup ARGV] [--validate ARGV]... [--artifact GLOB]...
               [--file LOCAL:PATH]... [--env K=V]... [--image I] [--allow-host H]... [--keep]
               [--timeout SECONDS] [--detach] [--json] -- CMD ARGS...
                                        a durable run: a fresh sandbox, checkout, setup, the
                                        command, validations, changed files and artifacts; prints
                                        its phases and summary (exit 0 succeeded, 1 failed, 2
                                        errored/timed_out/canceled); --detach prints the run id
  agentbox runs ls [--state S] [--batch ID] [--label K=V]   |  runs get|cancel|events RUN
  agentbox runs logs [--phase P] [--stream stdout|stderr] RUN
  agentbox runs artifact [-o FILE|-] RUN PATH
  agentbox batch submit|matrix [--wait] FILE.json  |  batch get|cancel ID  |  batch ls
  agentbox agent compare|test [--wait] FILE.json   run coding agents on a task (measurements only)
  agentbox sql [--max-rows N] [--json] QUERY   read-only SQL over the views audit_log, events,
                                        sandboxes, jobs, runs, run_events (a table; --json)
  agentbox audit ls [--tool T] [--sandbox ID] [--after N] [--limit N] [--json]
                                        the audit log: every call, newest page first
  agentbox chat [QUESTION] [--model M] [--base-url URL] [--tools a,b] [--resume ID] [--yes] [--keep]
                                        an agent loop against an OpenAI-compatible model with these tools
  agentbox chat ls|show|rm|export ID    the conversations kept (export: --format json|markdown)
  agentbox approvals ls [--state S] [--json]    the approval queue (serve --approval-required)
  agentbox approvals show ID            one approval: tool, digest, summary, decision, outcome
  agentbox approvals approve|deny [--reason TEXT] ID   decide (needs the admin token)
  agentbox version

Remote jobs on joined machines (MACHINE is an id, name or alias):
  agentbox machine job start [--shell sh|bash|cmd|powershell] [--env K=V]... [--cwd DIR] [--gpu N]
                             MACHINE -- COMMAND...   a detached job; prints its id (--gpu reserves
                                        that GPU for it alone: CUDA_VISIBLE_DEVICES)
  agentbox machine job ls [--limit N] MACHINE  |  machine job status MACHINE JOB
                                        (exit code: the job's; 3 running; 1 canceled/failed/unknown)
  agentbox machine job logs [--tail N | --offset N [--max-bytes N]] MACHINE JOB
  agentbox machine job cancel [--grace SECONDS] MACHINE JOB   its whole tree; its GPU released

Internal:
  agentbox guest --socket PATH          the in-sandbox agent (runs as PID 1 of a sandbox)
`
