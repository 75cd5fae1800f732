# agentbox — `sudo make run` starts the server; `sudo make test` runs every test.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
export CGO_ENABLED := 0
GO ?= go
BIN := bin/agentbox
HOST_PKGS := runc crun runsc iproute2 python3 e2fsprogs
# The MCP clients test/mcpclients runs (the TypeScript SDK, the Inspector CLI, the conformance
# suite and the Node 22 it needs), pinned by its package-lock.json.
MCPCLIENTS := test/mcpclients

.PHONY: all build run test test-unit bench deps deps-mcp vet clean

all: build

build:
	$(GO) build -trimpath -o $(BIN) ./cmd/agentbox

# deps installs the host packages sandboxes need (apt-get; needs root).
deps:
	@missing=""; for p in $(HOST_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (sudo make ...) to install:$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
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

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }

# test runs every test: unit, store, guest, runtime (real runc), service, API, end-to-end and the
# real MCP clients (test/mcpclients). Tests that need root run when root (CI is root).
test: deps deps-mcp vet build
	$(GO) test -count=1 -timeout 40m ./...

test-unit:
	$(GO) test -count=1 -short ./...

bench: deps build
	$(GO) run ./bench -out bench/results.json

clean:
	rm -rf bin
