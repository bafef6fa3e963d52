# The two commands a newcomer needs: `make demo` and `make test`.
GO ?= go
BENCHTIME ?= 2s
SOAK_MESSAGES ?= 100000
SOAK_INTERVAL ?= 1500ms
HISTORY_DURATION ?= 10m
HISTORY_SEED ?=

.PHONY: demo test soak bench bench-peers lint

demo: ## run the end-to-end demo on the local Postgres
	$(GO) run ./examples/orders

test: testenv/node_modules ## run the whole suite against real servers (race detector on)
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...
	cd cmd/idemq && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 10m ./...

soak: ## the crash soak: 100,000 messages (SOAK_MESSAGES sets it; SOAK_INTERVAL the mean time between faults) through relays and consumers SIGKILLed at random; then the relay's history check under faults for HISTORY_DURATION (HISTORY_SEED replays a schedule)
	IDEMQ_SOAK_MESSAGES=$(SOAK_MESSAGES) IDEMQ_SOAK_INTERVAL=$(SOAK_INTERVAL) $(GO) test -count=1 -timeout 60m -v -run '^TestSoak$$' ./soak
	IDEMQ_HISTORY_DURATION=$(HISTORY_DURATION) IDEMQ_HISTORY_SEED=$(HISTORY_SEED) $(GO) test -count=1 -timeout 60m -v -run '^TestRelayHistory$$' ./relay

bench: testenv/node_modules ## run the benchmarks; each reports its ratio against a baseline measured in the same run
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -timeout 60m ./...

bench-peers: ## run idemq next to the Watermill SQL outbox (module bench/peers); ratio = idemq / Watermill
	cd bench/peers && $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m .

# dynalite, the DynamoDB API server of the request/dynamostore tests.
testenv/node_modules: testenv/package.json testenv/package-lock.json
	npm ci --prefix testenv --no-audit --no-fund
	@touch $@

lint: ## gofmt and go vet
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	cd cmd/idemq && $(GO) vet ./...
