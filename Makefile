# allot — see README.md. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go
BIN   := bin
PKGS  := ./...

.DEFAULT_GOAL := help

.PHONY: help build run test test-short test-faults lint bench bench-memory demo clean reset token

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build every binary into ./bin
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

run: build ## the whole stack on this machine: embedded NATS, migrations, allocator, ingest on 127.0.0.1:8080 (no tokens on loopback)
	./$(BIN)/stack

test: ## every test, against real MariaDB/MySQL and a real embedded JetStream server (race detector on)
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

test-short: ## the quick tests only
	$(GO) test -short -count=1 $(PKGS)

lint: ## gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

token: ## print a development bearer token: make -s token USER=1 [SCOPE=allot:admin] (signed with ALLOT_AUTH_HS256_KEY)
	@$(GO) run ./internal/cmd/token -user '$(if $(filter command line,$(origin USER)),$(USER))' -scope '$(SCOPE)'

clean: ## remove build output; the stack's data stays (see reset)
	rm -rf $(BIN)

reset: build ## start the make-run stack over empty: drop its database (ALLOT_MYSQL_DSN) and delete its NATS store (var/nats)
	./$(BIN)/stack -reset

bench: build ## one run, side by side: allocator drain vs the seed designs, and an HTTP burst vs the Redis-gated seed design
	./$(BIN)/bench -bin $(BIN)
	$(GO) test -run '^$$' -bench . -benchtime 1x ./internal/allocation/ ./internal/bench/

bench-memory: build ## each process's resident memory over 1,000,000 requests to 200,000 activities (must stay flat once the caches are full)
	./$(BIN)/bench -bin $(BIN) -memory

test-faults: ## the fault-injection suite alone: real processes killed, frozen, restarted mid-burst (also part of make test)
	$(GO) test -count=1 -v -timeout 10m ./internal/faults/

demo: build ## start the stack, open an activity, fire a loadgen burst, print the operator page's URL
	./scripts/demo.sh
