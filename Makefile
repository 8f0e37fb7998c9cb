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

.PHONY: help build test test-short test-integration lint bench tidy clean

help: ## List the targets
	@echo 'Usage: make <target>'
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-17s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

build: ## Build all packages, and bin/worker once cmd/worker exists
	$(GO) build ./...
ifneq ($(wildcard cmd/worker),)
	$(GO) build -o bin/worker ./cmd/worker
endif

test: ## Run all tests with the race detector, as CI does
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

test-short: ## Run the unit tests only (-short)
	$(GO) test -short ./...

test-integration: ## Run the PostgreSQL integration tests (store, test/integration)
ifeq ($(strip $(INTEGRATION_PKGS)),)
	@echo 'No integration test packages yet.'
else
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(INTEGRATION_PKGS)
endif

lint: ## Check gofmt, go vet, staticcheck and that go.mod is tidy
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then \
		echo 'gofmt -l: these files need gofmt -w:'; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	$(GO) mod tidy -diff

bench: ## Run the benchmarks
	$(GO) test -run='^$$' -bench=. -benchmem ./...

tidy: ## Tidy go.mod and go.sum
	$(GO) mod tidy

clean: ## Remove build and test output
	rm -rf bin/ coverage.out coverage.html cover.out *.test *.prof
