# Run `make` or `make help` for the list of targets.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
STATICCHECK_VERSION := v0.8.2
TEST_TIMEOUT := 20m

# Tests that need PostgreSQL read FLOTILLA_TEST_DSN (see internal/testdb):
# any database of the server; the tests create and drop their own from its
# maintenance database. Unless it is set already, use the local server when
# one answers on 127.0.0.1:5432; otherwise leave it unset so a container is
# started.
LOCAL_TEST_DSN := postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
PG_ISREADY := $(firstword $(shell command -v pg_isready) $(wildcard /usr/lib/postgresql/*/bin/pg_isready))
ifeq ($(origin FLOTILLA_TEST_DSN),undefined)
  ifneq ($(PG_ISREADY),)
    FLOTILLA_TEST_DSN := $(shell $(PG_ISREADY) -h 127.0.0.1 -p 5432 -t 2 -q && echo '$(LOCAL_TEST_DSN)')
  endif
endif
ifneq ($(FLOTILLA_TEST_DSN),)
  export FLOTILLA_TEST_DSN
endif

# The longest packages first: go test starts them in the order given, and
# test/integration alone takes most of the run.
TEST_PKGS ?= $(if $(wildcard test/integration),./test/integration/) $(if $(wildcard store),./store/...) ./...
INTEGRATION_PKGS := $(if $(wildcard store),./store/...) $(if $(wildcard test/integration),./test/integration/...)

# Most of the suite's time is spent waiting (on PostgreSQL, on worker
# processes, on lease TTLs), so more runs at once than there are cores:
# four test binaries (-p), each with up to eight tests that call t.Parallel
# (test/integration bounds its busiest fleets itself).
TEST_FLAGS := -race -count=1 -timeout $(TEST_TIMEOUT) -p 4 -parallel 8

# suitecheck (internal/testenv) checks what the suite needs before it runs,
# and that the server FLOTILLA_TEST_DSN names is the one it was after it.
SUITECHECK := $(GO) run ./internal/testenv/suitecheck
SOAK_TIMEOUT := 60m

.PHONY: help build test test-short test-failover test-failover-fleet test-integration soak lint bench bench-compare bench-sqlite charts tidy clean

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

# checked_test runs `go test $(TEST_FLAGS) $(1)` once suitecheck has found
# everything the suite needs (or else stops before running anything, with
# one message listing what is missing), and fails if the server
# FLOTILLA_TEST_DSN names was restarted or reconfigured meanwhile: tests
# create and drop databases there and do nothing else to it.
define checked_test
	@$(SUITECHECK) needs
	@noted=$$(mktemp); trap 'rm -f "$$noted"' EXIT; \
	$(SUITECHECK) identity "$$noted"; \
	status=0; \
	echo '$(GO) test $(TEST_FLAGS) $(1)'; \
	$(GO) test $(TEST_FLAGS) $(1) || status=$$?; \
	$(SUITECHECK) same "$$noted" || status=1; \
	exit $$status
endef

test: ## Run all tests with the race detector, as CI does (checks first what they need)
	$(call checked_test,$(TEST_PKGS))

# An example cannot skip itself: those that need PostgreSQL end in
# _postgres, and -skip leaves them out.
test-short: ## Run the unit tests only (-short): no PostgreSQL, no processes, no browser
	$(GO) test -short -skip '_postgres$$' ./...

# The failover tests (build tag failover) start pg_auto_failover clusters
# of their own (internal/testdb.StartHACluster): they need pg_autoctl
# (Debian: postgresql-15-auto-failover), and make test leaves them out.
# The helper's tests, then the fleet's scenario (test/integration,
# TestAFleetRidesOutItsDatabasesFailovers: three workers through two
# switchovers and the loss of the primary's machine), one package at a
# time (-p 1): each runs a formation of three servers.
FAILOVER_PKGS := ./internal/testdb/ ./test/integration/
FAILOVER_TIMEOUT := 15m

test-failover: ## Run the database failover tests and the fleet's failover scenario (pg_auto_failover; not part of make test)
	$(GO) test -race -count=1 -timeout $(FAILOVER_TIMEOUT) -p 1 -tags failover -v \
		-run 'HACluster|TestAFleetRidesOutItsDatabasesFailovers' $(FAILOVER_PKGS)

# The fleet's scenario alone; FLOTILLA_HA_FAILOVERS=5 runs five switchovers
# before the machine's loss, FLOTILLA_HA_ASYNC=1 replicates asynchronously,
# FLOTILLA_HA_TIMELINE=1 logs the cluster's state changes even on a pass.
test-failover-fleet: ## Run the fleet's database failover scenario alone (pg_auto_failover)
	$(GO) test -race -count=1 -timeout $(FAILOVER_TIMEOUT) -tags failover -run 'TestAFleetRidesOutItsDatabasesFailovers' -v ./test/integration/

test-integration: ## Run the integration tests (store, test/integration)
ifeq ($(strip $(INTEGRATION_PKGS)),)
	@echo 'No integration test packages yet.'
else
	$(call checked_test,$(INTEGRATION_PKGS))
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
