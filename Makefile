# allot — see README.md. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go
BIN   := bin
PKGS  := ./...
# devdb makes sure a MySQL-compatible server answers before the command runs
# (the DSN's, else a private one under var/mysql, else an installed one) and
# hands the command the DSN it chose; see internal/cmd/devdb.
DEVDB := ./$(BIN)/devdb

.DEFAULT_GOAL := help

.PHONY: help build devdb run test test-ts test-short test-faults lint bench bench-memory bench-tracing bench-shards demo clean reset token

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build every binary into ./bin
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/... ./internal/cmd/...

devdb:
	@mkdir -p $(BIN)
	@$(GO) build -o $(BIN)/ ./internal/cmd/devdb

run: build ## the whole stack on this machine: a MySQL server if none answers, embedded NATS, migrations, allocator, ingest on 127.0.0.1:8080 (loopback: no tokens)
	$(DEVDB) -var ALLOT_MYSQL_DSN -- ./$(BIN)/stack

test: devdb ## every test, against real MariaDB/MySQL (started if none answers) and a real embedded JetStream server (race detector on)
	$(GO) vet $(PKGS)
	$(DEVDB) -var ALLOT_TEST_MYSQL_DSN -- $(GO) test -race -count=1 -timeout 20m $(PKGS)
	@$(MAKE) --no-print-directory test-ts

# The TypeScript client needs Node 20 or later (global fetch and crypto).
NODE_OK = command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && \
	[ "$$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ]

test-ts: devdb ## the TypeScript client's tests (clients/ts): npm ci, then node --test, unit and against the real stack; skipped without Node 20+ and npm (a failure when CI=true)
	@if ! { $(NODE_OK); }; then \
		if [ "$$CI" = true ]; then echo "test-ts: Node 20 or later and npm are required (CI=true); node is $$(node --version 2>/dev/null || echo missing)"; exit 1; fi; \
		echo "test-ts: skipped: the TypeScript client's tests need Node 20 or later and npm (node: $$(node --version 2>/dev/null || echo missing))"; exit 0; \
	fi; \
	cd clients/ts && npm ci --no-audit --no-fund --loglevel=error && \
		$(CURDIR)/$(BIN)/devdb -var ALLOT_TEST_MYSQL_DSN -- env GO="$(GO)" npm test --silent

test-short: devdb ## the quick tests only
	$(DEVDB) -var ALLOT_TEST_MYSQL_DSN -- $(GO) test -short -count=1 $(PKGS)

GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(shell $(GO) env GOPATH)/bin/golangci-lint

lint: ## gofmt, go vet and golangci-lint (.golangci.yml; installed with go install when missing)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@$(GOLANGCI_LINT) version 2>/dev/null | grep -q '$(patsubst v%,%,$(GOLANGCI_LINT_VERSION))' || \
		$(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	$(GOLANGCI_LINT) run $(PKGS)

token: ## print a development bearer token: make -s token USER=1 [SCOPE=allot:admin] (signed with ALLOT_AUTH_HS256_KEY)
	@$(GO) run ./internal/cmd/token -user '$(if $(filter command line,$(origin USER)),$(USER))' -scope '$(SCOPE)'

clean: ## remove build output; the stack's data stays (see reset)
	rm -rf $(BIN)

reset: build ## start the make-run stack over empty: drop its database (ALLOT_MYSQL_DSN), delete its NATS store (var/nats) and the private MySQL server's data (var/mysql)
	$(DEVDB) -reset -var ALLOT_MYSQL_DSN -- ./$(BIN)/stack -reset

bench: build ## one run, side by side: allocator drain vs the seed designs, 100,000 holds expiring at once (expiries/s next to joins/s), a join drain with and without 200 readers of a 1,000,000-waiter line, three rounds of an HTTP burst vs the Redis-gated seed design and the floor, claims counted in memory (with what the broker stored), and an open loop (vegeta) at 4,000 and 6,000 claims/s vs the same seed design
	$(DEVDB) -var ALLOT_MYSQL_DSN -- ./$(BIN)/bench -bin $(BIN)
	$(DEVDB) -var ALLOT_TEST_MYSQL_DSN -- $(GO) test -run '^$$' -bench . -benchtime 1x ./internal/allocation/ ./internal/bench/

bench-memory: build ## each process's resident memory over 1,000,000 requests to 200,000 activities (must stay flat once the caches are full)
	$(DEVDB) -var ALLOT_MYSQL_DSN -- ./$(BIN)/bench -bin $(BIN) -memory

bench-tracing: build ## the HTTP burst and the allocator drain with tracing off and on (every span sampled, exported to an in-process OTLP receiver), alternating, in one run
	$(DEVDB) -var ALLOT_MYSQL_DSN -- ./$(BIN)/bench -bin $(BIN) -tracing

bench-shards: build ## the allocator drain of 100,000 joins over 1,000 activities on 1 and on 3 MySQL shards (3 private mariadbd servers sharing this machine's cores and disk), side by side, in one run; then the move of a partition with 100,000 signups between the 3 while the others drain
	$(DEVDB) -var ALLOT_MYSQL_DSN -- ./$(BIN)/bench -bin $(BIN) -shards-only -n 100000

test-faults: devdb ## the fault-injection suite alone: real processes killed, frozen, restarted mid-burst (also part of make test)
	$(DEVDB) -var ALLOT_TEST_MYSQL_DSN -- $(GO) test -count=1 -v -timeout 10m ./internal/faults/

demo: build ## start the stack, open an activity, fire a loadgen burst, print the operator page's URL
	./scripts/demo.sh
