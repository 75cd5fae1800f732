# agentbox — `sudo make run` starts the server; `sudo make test` runs every test.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:/usr/local/bin:$(PATH)
# The shipped binary is static: CGO_ENABLED=0 for `make build` (and testenv.Binary builds the
# binary the tests run, inside sandboxes too, the same way). Only `make test`'s race build turns
# cgo on, which needs a C compiler: gcc and libc6-dev are host packages for that.
export CGO_ENABLED := 0
GO ?= go
BIN := bin/agentbox
HOST_PKGS := runc crun iproute2 python3 e2fsprogs gcc libc6-dev tmux procps git curl python3-pip busybox-static criu
# gVisor's runsc is built from the Go module proxy at this pinned version (Debian's runsc is from
# 2022-12 and lacks four years of fixes: statx, /proc/self/limits, clone3, …) into RUNSC, which
# comes before /usr/bin in PATH. `go version -m` tells which version an installed one is.
GVISOR_VERSION := v0.0.0-20260905035102-160fafc42237
RUNSC := /usr/local/bin/runsc
# The MCP clients test/mcpclients runs (the TypeScript SDK, the Inspector CLI, the conformance
# suite and the Node 22 it needs), pinned by its package-lock.json.
MCPCLIENTS := test/mcpclients

.PHONY: all build run test test-unit bench bench-audit bench-sql deps deps-runsc deps-mcp vet clean

all: build

build:
	$(GO) build -trimpath -o $(BIN) ./cmd/agentbox

# deps installs the host packages sandboxes need (apt-get and runsc; needs root).
deps: deps-runsc
	@missing=""; for p in $(HOST_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (sudo make ...) to install:$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

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

run: deps build
	./$(BIN) serve

# vet also fails when go.mod or go.sum is not what `go mod tidy` would write (Go ≥ 1.23: -diff
# prints the difference and changes nothing); run `go mod tidy` to fix it.
vet:
	$(GO) mod tidy -diff
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }

# test runs every test: unit, store, guest, runtime (real runc), service, API, end-to-end (the shell
# under tmux among them) and the
# real MCP clients (test/mcpclients). Tests that need root run when root (CI is root).
# One pass, under the race detector, replaces a plain one: every package runs under it (all are
# pure Go; the test binaries need not be static, since what runs in a sandbox is the agentbox
# binary that testenv.Binary builds with CGO_ENABLED=0). It needs cgo for the test binaries only.
test: deps deps-mcp vet build
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 60m ./...

test-unit:
	$(GO) test -count=1 -short ./...

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

# bench-audit: what the audit log adds to an MCP call (issue 16), on vs off in one run.
bench-audit: build
	$(GO) run ./bench -audit-only -out bench/results-audit.json

# bench-sql: execute_sql's count-by-tool-in-the-last-hour over 1,000,000 audit records (issue 16).
bench-sql:
	$(GO) run ./bench -sql-only -out bench/results-sql.json

clean:
	rm -rf bin
