# Run `make` or `make help` for the list of targets.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
STATICCHECK_VERSION := v0.8.2
TEST_TIMEOUT := 20m

# Tests that need PostgreSQL read FLOTILLA_TEST_DSN (see internal/testdb).
# Unless it is set already, use the local server when one answers on
# 127.0.0.1:5432; otherwise leave it unset so a container is started.
LOCAL_TEST_DSN := postgres://postgres@127.0.0.1:5432/test?sslmode=disable
PG_ISREADY := $(firstword $(shell command -v pg_isready) $(wildcard /usr/lib/postgresql/*/bin/pg_isready))
ifeq ($(origin FLOTILLA_TEST_DSN),undefined)
  ifneq ($(PG_ISREADY),)
    FLOTILLA_TEST_DSN := $(shell $(PG_ISREADY) -h 127.0.0.1 -p 5432 -t 2 -q && echo '$(LOCAL_TEST_DSN)')
  endif
endif
ifneq ($(FLOTILLA_TEST_DSN),)
  export FLOTILLA_TEST_DSN
endif

INTEGRATION_PKGS := $(if $(wildcard store),./store/...) $(if $(wildcard test/integration),./test/integration/...)

# The PostgreSQL restart scenario breaks every connection to the server,
# other tests' included, so `make test` and `make test-integration` run it
# alone, after everything else, in a `go test -p 1` of its own.
RESTART_TEST := TestFaultPostgresRestart

# The CLI integration tests run a second time with every fleet on an SQLite
# file (FLOTILLA_TEST_STORE=sqlite). The scenarios that need a TCP proxy, a
# server restart, row locks or the probe ledger stay PostgreSQL's; the kill
# -9, SIGSTOP and SIGTERM scenarios on SQLite (TestSQLite*) run in the first
# pass, as they always use SQLite.
SQLITE_PASS := ^(TestBadBucketsExitTwo|TestSubmitRefusals|TestWorkerCLIFlagsAfterPositional|TestStopFromAThirdProcess|TestScheduleCLIRefusesBadDefinitions|TestScheduleCLILifecycle|TestTwoWorkersRunEachBucketsTasks|TestAStandbyTakesOverAfterKill9|TestSigtermReleasesBucketsForAStandby|TestASecondProcessWithALiveNodeIDIsRefused|TestStoppingAnExecTaskLeavesNoProcess|TestExecIsRefusedWithoutAnAllowList|TestAStandbyRescuesTheTaskOfAKilledHolder|TestAKilledHoldersTaskOnItsLastAttemptIsLost|TestWorkerReconcileRescuesOnlyUnheldBuckets)$$
SOAK_TIMEOUT := 60m

.PHONY: help build test test-short test-integration soak lint bench bench-compare bench-sqlite charts tidy clean check-postgres

help: ## List the targets
	@echo 'Usage: make <target>'
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-17s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# worker --version prints these: the nearest tag (or the commit) and the
# commit, with -dirty for uncommitted changes.
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT := $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

build: ## Build all packages, and bin/worker (stamped with version and commit) once cmd/worker exists
	$(GO) build ./...
ifneq ($(wildcard cmd/worker),)
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/worker ./cmd/worker
endif

# make test needs PostgreSQL: FLOTILLA_TEST_DSN (set above when a local
# server answers), or Docker for testcontainers to start one. Without
# either, stop before running anything rather than fail test by test.
check-postgres:
	@if [ -z "$${FLOTILLA_TEST_DSN:-}" ] && [ -z "$${DOCKER_HOST:-}" ] && [ ! -S /var/run/docker.sock ] && \
		! docker info >/dev/null 2>&1; then \
		echo 'make test needs PostgreSQL, and found neither a server nor Docker: start a local PostgreSQL on 127.0.0.1:5432 that trusts the postgres user (Debian: apt install postgresql), set FLOTILLA_TEST_DSN to a server you have (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable), or start Docker so the tests can run PostgreSQL in a container.' >&2; \
		exit 1; \
	fi

test: check-postgres ## Run all tests with the race detector, as CI does (the PostgreSQL restart last, alone)
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -skip '^$(RESTART_TEST)$$' ./...
ifneq ($(wildcard test/integration),)
	FLOTILLA_TEST_STORE=sqlite $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -run '$(SQLITE_PASS)' ./test/integration/
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -p 1 -run '^$(RESTART_TEST)$$' ./test/integration/
endif

test-short: ## Run the unit tests only (-short)
	$(GO) test -short ./...

test-integration: check-postgres ## Run the integration tests (store, test/integration)
ifeq ($(strip $(INTEGRATION_PKGS)),)
	@echo 'No integration test packages yet.'
else
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -skip '^$(RESTART_TEST)$$' $(INTEGRATION_PKGS)
ifneq ($(wildcard test/integration),)
	FLOTILLA_TEST_STORE=sqlite $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -run '$(SQLITE_PASS)' ./test/integration/
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -p 1 -run '^$(RESTART_TEST)$$' ./test/integration/
endif
endif

soak: ## Run the soak: 100,000 tasks over 4 nodes under kill -9 (minutes; not in CI)
	$(GO) test -tags soak -race -count=1 -timeout $(SOAK_TIMEOUT) -run '^TestSoak$$' -v ./test/integration/

lint: ## Check gofmt, go vet, staticcheck and that go.mod is tidy
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then \
		echo 'gofmt -l: these files need gofmt -w:'; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags soak ./test/integration/
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	$(GO) mod tidy -diff

bench: ## Run the benchmarks
	$(GO) test -run='^$$' -bench=. -benchmem ./...

bench-compare: ## Run flotilla and River side by side and redraw docs/charts from the results (bench/; needs PostgreSQL; about 20 minutes)
	cd bench && $(GO) run ./cmd/compare -runs 3 -idle-jobs 200 -charts ../docs/charts

bench-sqlite: ## flotilla and River side by side on SQLite, and flotilla's start latency on SQLite (bench/; about 15 minutes)
	cd bench && $(GO) run ./cmd/compare -sqlite -runs 3 -insert-jobs 100000 -burn-jobs 100000 -charts ../docs/charts
	$(GO) build -o bin/worker ./cmd/worker
	cd bench && $(GO) run ./cmd/sqlitelatency -worker ../bin/worker -runs 3

charts: ## Redraw the SVG charts of docs/charts from their saved data (docs/charts/data)
	cd bench && $(GO) run ./cmd/charts -data ../docs/charts/data -out ../docs/charts

tidy: ## Tidy go.mod and go.sum
	$(GO) mod tidy

clean: ## Remove build and test output
	rm -rf bin/ coverage.out coverage.html cover.out *.test *.prof
