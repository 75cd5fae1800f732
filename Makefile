# agentbox — `sudo make run` starts the server; `sudo make test` runs every test.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:/usr/local/bin:$(PATH)
# The shipped binaries are static: CGO_ENABLED=0 for `make build` (and testenv.Binary builds the
# binaries the tests run, the agent inside sandboxes too, the same way). Only `make test`'s race build turns
# cgo on, which needs a C compiler: gcc and libc6-dev are host packages for that.
export CGO_ENABLED := 0
GO ?= go
BIN := bin/agentbox
# postgresql-15: the Postgres store's tests (internal/store/postgres) start a throwaway server from
# its binaries (internal/testenv/pglab); the package's own service is not used.
HOST_PKGS := runc crun iproute2 python3 e2fsprogs gcc libc6-dev tmux procps git curl python3-pip busybox-static criu xvfb x11-xserver-utils xauth postgresql-15 containernetworking-plugins openssl
# The test cluster (hack/k8s): binaries built from the Go module proxy by hack/k8s/build.sh into a
# cache keyed by a hash of its tool modules (AGENTBOX_K8S_CACHE, default /var/cache/agentbox/k8s);
# cluster-up.sh keeps its state in AGENTBOX_K8S_STATE (default /var/lib/agentbox-k8s).
K8S := hack/k8s
# gVisor's runsc is built from the Go module proxy at this pinned version (Debian's runsc is from
# 2022-12 and lacks four years of fixes: statx, /proc/self/limits, clone3, …) into RUNSC, which
# comes before /usr/bin in PATH. `go version -m` tells which version an installed one is.
GVISOR_VERSION := v0.0.0-20260905035102-160fafc42237
RUNSC := /usr/local/bin/runsc
# The MCP clients test/mcpclients runs (the TypeScript SDK, the Inspector CLI, the conformance
# suite and the Node 22 it needs), pinned by its package-lock.json.
MCPCLIENTS := test/mcpclients
# E2B's own SDKs (npm e2b, @e2b/code-interpreter) that test/e2bsdk runs against agentbox, pinned by
# its package-lock.json.
E2BSDK := test/e2bsdk

.PHONY: all build cross run test test-unit soak bench bench-create bench-audit bench-scrub bench-sql bench-remoteexec bench-kube bench-e2b deps deps-runsc deps-vm deps-mcp deps-e2b vet clean k8s k8s-up k8s-down

all: build

# build writes both binaries into bin/: agentbox (server and CLI) and beside it the lean
# in-sandbox agent agentbox-guest (cmd/agentbox-guest), which serve finds there and binds into
# every sandbox. Install them side by side (e.g. both in /usr/local/bin).
build:
	$(GO) build -trimpath -o bin/ ./cmd/agentbox ./cmd/agentbox-guest

# deps installs the host packages sandboxes need (apt-get and runsc; needs root), and runtime vm's
# QEMU and guest kernel (deps-vm).
deps: deps-runsc deps-vm
	@missing=""; for p in $(HOST_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (sudo make ...) to install:$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# deps-vm installs QEMU (qemu-system-x86, qemu-utils) from Debian's packages and unpacks Debian's
# cloud kernel into /var/cache/agentbox/vm (hack/vm-deps.sh: versions pinned there; the host's /boot
# is untouched); warm, it only checks.
deps-vm:
	@hack/vm-deps.sh >/dev/null

# deps-runsc builds gVisor's runsc at GVISOR_VERSION (about a minute, once) unless RUNSC is it.
deps-runsc:
	@if ! $(GO) version -m $(RUNSC) 2>/dev/null | grep -q "gvisor.dev/gvisor[[:space:]]*$(GVISOR_VERSION)"; then \
	  echo "building runsc $(GVISOR_VERSION) into $(RUNSC)"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (sudo make ...) to install $(RUNSC)" >&2; exit 1; fi; \
	  tmp=$$(mktemp -d) && GOBIN=$$tmp $(GO) install -trimpath \
	    -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$(GVISOR_VERSION)" gvisor.dev/gvisor/runsc@$(GVISOR_VERSION) && \
	  install -m 0755 $$tmp/runsc $(RUNSC) && rm -rf $$tmp; \
	fi

# deps-mcp installs the MCP clients (npm ci from the npm registry) when node_modules is missing or
# older than the lockfile, and Node and npm from apt when the host has no node.
deps-mcp: $(MCPCLIENTS)/node_modules/.package-lock.json

$(MCPCLIENTS)/node_modules/.package-lock.json: $(MCPCLIENTS)/package.json $(MCPCLIENTS)/package-lock.json
	@if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
	  echo "installing: nodejs npm"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (sudo make ...) to install nodejs npm" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	fi
	cd $(MCPCLIENTS) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# deps-e2b installs E2B's SDKs for test/e2bsdk the same way (npm ci when node_modules is missing or
# older than the lockfile).
deps-e2b: $(E2BSDK)/node_modules/.package-lock.json

$(E2BSDK)/node_modules/.package-lock.json: $(E2BSDK)/package.json $(E2BSDK)/package-lock.json $(MCPCLIENTS)/node_modules/.package-lock.json
	cd $(E2BSDK) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# cross builds the binary for the other platforms a joined machine runs: the CLI and
# `agentbox join` work there; serve, mcp and doctor are Linux's (server_other.go says so).
CROSS := darwin/arm64 darwin/amd64 windows/amd64
cross:
	@for p in $(CROSS); do echo "cross-build $$p"; \
	  GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -trimpath -o /dev/null ./cmd/agentbox || exit 1; done

run: deps build
	./$(BIN) serve

# vet also fails when go.mod or go.sum is not what `go mod tidy` would write (Go ≥ 1.23: -diff
# prints the difference and changes nothing); run `go mod tidy` to fix it.
vet:
	$(GO) mod tidy -diff
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }

# test runs every test: unit, store, guest, runtime (real runc), service, API, end-to-end (the shell
# under tmux among them), the real MCP clients (test/mcpclients), E2B's SDKs (test/e2bsdk) and the Kubernetes tests on a real
# single-node cluster (hack/k8s: built or taken from its cache, brought up before the tests and torn
# down after them, pass or fail; AGENTBOX_TEST_KUBECONFIG names it to the tests). When
# AGENTBOX_TEST_KUBECONFIG is already set, or a cluster from `make k8s-up` already runs, the tests
# use that cluster and make test neither starts nor stops one. cluster-up.sh is all or nothing.
# Tests that need root run when root (CI is root).
# One pass, under the race detector, replaces a plain one: every package runs under it (all are
# pure Go; the test binaries need not be static, since what runs in a sandbox is the agentbox
# binary that testenv.Binary builds with CGO_ENABLED=0). It needs cgo for the test binaries only.
# AGENTBOX_TEST_REQUIRE_POSTGRES makes a test that needs Postgres fail, not skip, when none can be
# had: here the Postgres store's suite always runs (deps installs postgresql-15).
test: deps deps-mcp deps-e2b vet cross build
	@set -euo pipefail; \
	if [ -n "$${AGENTBOX_TEST_KUBECONFIG:-}" ]; then \
	  echo "make test: Kubernetes tests on the cluster in $$AGENTBOX_TEST_KUBECONFIG"; \
	elif kc=$$($(K8S)/cluster-up.sh -running); then \
	  echo "make test: Kubernetes tests on the cluster already running ($$kc), which stays up"; \
	  export AGENTBOX_TEST_KUBECONFIG=$$kc; \
	else \
	  bin=$$($(K8S)/build.sh); \
	  kc=$$($(K8S)/cluster-up.sh "$$bin"); \
	  trap 'st=$$?; $(K8S)/teardown.sh || { [ $$st != 0 ] || st=1; }; exit $$st' EXIT; \
	  trap 'exit 130' INT TERM; \
	  export AGENTBOX_TEST_KUBECONFIG=$$kc; \
	fi; \
	AGENTBOX_TEST_REQUIRE_POSTGRES=1 CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 60m ./...

# test-unit runs the tests that need no root, runtime or cluster (-short), under the race
# detector like make test (cgo for the test binaries only).
test-unit:
	CGO_ENABLED=1 $(GO) test -race -count=1 -short ./...

# soak runs the fault campaign (test/faults: docs/TESTING.md) for SOAK_MINUTES with SOAK_CLIENTS
# concurrent clients and SOAK_SEED (random unless given; printed first, and `make soak
# SOAK_SEED=N` replays it), on SOAK_STORE (sqlite, or postgres: a throwaway Postgres that the
# campaign also restarts). make test runs the same campaign short, with a fixed seed. Needs root.
SOAK_MINUTES ?= 60
SOAK_CLIENTS ?= 6
SOAK_STORE ?= sqlite
ifeq ($(SOAK_SEED),)
SOAK_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
soak: deps
	@echo "make soak: seed $(SOAK_SEED), $(SOAK_CLIENTS) clients, $(SOAK_MINUTES) min, store $(SOAK_STORE) (replay: make soak SOAK_SEED=$(SOAK_SEED) SOAK_CLIENTS=$(SOAK_CLIENTS) SOAK_MINUTES=$(SOAK_MINUTES) SOAK_STORE=$(SOAK_STORE))"
	FAULTS_SEED=$(SOAK_SEED) FAULTS_CLIENTS=$(SOAK_CLIENTS) FAULTS_MINUTES=$(SOAK_MINUTES) FAULTS_STORE=$(SOAK_STORE) \
	  $(GO) test -count=1 -v -run '^TestCampaign$$' -timeout $$(awk 'BEGIN { print int($(SOAK_MINUTES)) + 30 }')m ./test/faults/

# k8s builds the test cluster's binaries (hack/k8s/build.sh: about 9 minutes cold under nice, a
# second when its cache holds them) and prints their directory; k8s-up starts a cluster and prints
# its kubeconfig; k8s-down stops it and removes everything it made.
k8s: deps
	@$(K8S)/build.sh

k8s-up: k8s
	@$(K8S)/cluster-up.sh "$$($(K8S)/build.sh)"

k8s-down:
	@$(K8S)/teardown.sh

# bench also installs podman: the image-pull figure is measured beside `podman pull` of the same image.
BENCH_PKGS := podman

bench: deps build
	@missing=""; for p in $(BENCH_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (sudo make bench) to install:$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	$(GO) run ./bench -out bench/results.json

# bench-create: the cold creates alone (REST and CLI, runc, crun, gVisor in turns) beside the
# `runc run` floor, with the create trace's per-step p50 table (docs/TRACE.md).
bench-create: build
	$(GO) run ./bench -create-only -out bench/results-create.json

# bench-audit: what the audit log adds to an MCP call, on vs off in one run.
bench-audit: build
	$(GO) run ./bench -audit-only -out bench/results-audit.json

# bench-e2b: the E2B-compatible API through E2B's own SDK beside agentbox's REST, in one run:
# Sandbox.create() → first commands.run vs REST create → first exec, commands.run('true') vs REST
# exec, runCode('1+1') on a warm context.
bench-e2b: build deps-e2b
	$(GO) run ./bench -e2b-only

# bench-scrub: a 100 MiB GET through the secret interceptor with and without a secret, in turns
# (what taking secrets' values out of responses costs).
bench-scrub:
	$(GO) run ./bench -scrub-only -out bench/results-scrub.json

# bench-sql: execute_sql's count-by-tool-in-the-last-hour over 1,000,000 audit records.
bench-sql:
	$(GO) run ./bench -sql-only -out bench/results-sql.json

# bench-chat: agentbox chat's own overhead per step, the scripted model and the tool answering at once.
bench-chat:
	$(GO) run ./bench -chat-only -out bench/results-chat.json

# bench-remoteexec: remote_exec of `true` over a joined agent on loopback, beside host floors.
bench-remoteexec:
	$(GO) run ./bench -remoteexec-only -out bench/results-remoteexec.json

# bench-kube: the kubernetes runtime on the test cluster: create → first exec on the
# runc and gVisor classes beside local runc and a plain client-go pod, then 100 creates on one
# replica and over two (Postgres from pglab), in one run. It uses a running cluster (make k8s-up)
# or brings one up and tears it down.
bench-kube: build
	@set -euo pipefail; \
	if [ -n "$${AGENTBOX_TEST_KUBECONFIG:-}" ]; then :; \
	elif kc=$$($(K8S)/cluster-up.sh -running); then export AGENTBOX_TEST_KUBECONFIG=$$kc; \
	else \
	  bin=$$($(K8S)/build.sh); kc=$$($(K8S)/cluster-up.sh "$$bin"); \
	  trap '$(K8S)/teardown.sh' EXIT; export AGENTBOX_TEST_KUBECONFIG=$$kc; \
	fi; \
	$(GO) run ./bench -kube-only -out bench/results-kube.json

clean:
	rm -rf bin
