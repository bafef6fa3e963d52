# The two commands a newcomer needs: `make demo` and `make test`.
GO ?= go
BENCHTIME ?= 2s
SOAK_MESSAGES ?= 100000
SOAK_INTERVAL ?= 1500ms
SOAK_BUSY_POOL ?= 60s
KAFKA_EOS_MESSAGES ?= 100000
KAFKA_EOS_KILLS ?= 100
HISTORY_DURATION ?= 10m
HISTORY_SEED ?=
FLEET_IDLE_DATABASES ?= 1000
LINEAR_DURATION ?= 5m
INBOX_LINEAR_RUNS ?= 50
# Runs of Watermill's full suite at once: each opens 50 Subscribers in
# TestConcurrentSubscribe, each a relay with connections of its own, so 10
# (Watermill's default) exceed a default max_connections.
WATERMILL_STRESS ?= 3

.PHONY: demo test test-suite badinput soak bench bench-peers lint pgbouncer chromium promtool

# Both use the Postgres at IDEMQ_TEST_DATABASE_URL (default 127.0.0.1:5432)
# and, when nothing answers there, a private server started from the
# machine's Postgres binaries and removed at exit.
demo: ## run the end-to-end demo
	$(GO) run ./testenv/withpostgres $(GO) run ./examples/orders

test: testenv/node_modules pgbouncer chromium promtool ## run the whole suite against real servers (race detector on)
	$(GO) run ./testenv/withpostgres $(MAKE) --no-print-directory test-suite

# test-suite is test's body, run by testenv/withpostgres with a Postgres to
# talk to.
test-suite:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...
	cd cmd/idemq && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 10m ./...
	cd idemwatermill && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 10m ./... && $(GO) test -count=1 -timeout 10m -run '^TestPubSubReconnect$$' .

badinput: testenv/node_modules ## run the bad-input suite: every TestBadInput test, of the library, the binary and the Watermill adapter
	$(GO) run ./testenv/withpostgres sh -c '$(GO) test -race -count=1 -timeout 20m -run BadInput ./... && cd cmd/idemq && $(GO) test -race -count=1 -timeout 10m -run BadInput ./... && cd ../../idemwatermill && $(GO) test -race -count=1 -timeout 10m -run BadInput ./...'

soak: ## the crash soak: 100,000 messages (SOAK_MESSAGES sets it; SOAK_INTERVAL the mean time between faults) through relays and consumers SIGKILLed at random; then a minute of 48 relay workers on a busy pool of 4 (SOAK_BUSY_POOL); then the relay's history check under faults for HISTORY_DURATION (HISTORY_SEED replays a schedule); then KAFKA_EOS_MESSAGES keyed messages into Kafka through the transactional and the kafka-go sink while relays are SIGKILLed KAFKA_EOS_KILLS times; then one relay fleet over FLEET_IDLE_DATABASES idle databases; then the linearizability check of request records for LINEAR_DURATION per store, and of the inbox's claim INBOX_LINEAR_RUNS times (fresh histories, consumers SIGKILLed; the relay's lease check runs with its history check); then Watermill's Pub/Sub suite at full size, WATERMILL_STRESS runs at once, on the Watermill adapter
	IDEMQ_SOAK_MESSAGES=$(SOAK_MESSAGES) IDEMQ_SOAK_INTERVAL=$(SOAK_INTERVAL) $(GO) test -count=1 -timeout 60m -v -run '^TestSoak$$' ./soak
	IDEMQ_RELAY_BUSY_POOL=$(SOAK_BUSY_POOL) $(GO) test -count=1 -timeout 10m -v -run '^TestBusyPoolKeepsLeases$$' ./relay
	IDEMQ_HISTORY_DURATION=$(HISTORY_DURATION) IDEMQ_HISTORY_SEED=$(HISTORY_SEED) $(GO) test -count=1 -timeout 60m -v -run '^TestRelayHistory$$' ./relay
	IDEMQ_KAFKA_EOS_MESSAGES=$(KAFKA_EOS_MESSAGES) IDEMQ_KAFKA_EOS_KILLS=$(KAFKA_EOS_KILLS) $(GO) test -count=1 -timeout 60m -v -run '^TestExactlyOnceKilledRelays$$' ./transports/kafka/franz
	IDEMQ_FLEET_IDLE_DATABASES=$(FLEET_IDLE_DATABASES) $(GO) test -count=1 -timeout 60m -v -run '^TestFleetManyIdleDatabases$$' ./relay
	IDEMQ_LINEAR_DURATION=$(LINEAR_DURATION) $(GO) test -count=1 -timeout 60m -v -run '^TestLinearizableRecords$$' ./request/requesttest
	$(GO) test -count=$(INBOX_LINEAR_RUNS) -timeout 60m -run '^TestLinearizableInbox' ./consumer
	cd idemwatermill && IDEMQ_WATERMILL_STRESS=$(WATERMILL_STRESS) $(GO) test -count=1 -timeout 60m -v -run '^TestPubSubStress$$' .

bench: testenv/node_modules ## run the benchmarks; each reports its ratio against a baseline measured in the same run
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -timeout 60m ./...

bench-peers: ## run idemq and its Watermill adapter next to the Watermill SQL outbox (module bench/peers); ratio = idemq / Watermill, adapter_ratio = adapter / Watermill
	cd bench/peers && $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m .

# dynalite, the DynamoDB API server of the request/dynamostore tests.
testenv/node_modules: testenv/package.json testenv/package-lock.json
	npm ci --prefix testenv --no-audit --no-fund
	@touch $@

# pgbouncer, the transaction-mode pooler of the relay's pooler tests
# (testenv.PgBouncer starts its own): installed from the distribution when
# missing (Debian/Ubuntu, as root).
pgbouncer:
	@command -v pgbouncer >/dev/null 2>&1 || test -x /usr/sbin/pgbouncer || { \
		echo "make: installing pgbouncer"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq pgbouncer >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null && apt-get install -y -qq pgbouncer >/dev/null; } || \
		{ echo "make: could not install pgbouncer; install it (apt-get install -y pgbouncer) and run make test again"; exit 1; }; }

# chromium, the headless browser the console's browser test drives
# (testenv.Chromium finds it): installed from the distribution when missing
# (Debian/Ubuntu, as root).
chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || test -n "$$IDEMQ_TEST_CHROMIUM" || { \
		echo "make: installing chromium"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq chromium >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; } || \
		{ echo "make: could not install chromium; install it (apt-get install -y chromium) and run make test again"; exit 1; }; }

# promtool, which checks and unit-tests the alerting rules of
# examples/deploy/prometheus: installed from the distribution (package
# prometheus) when missing (Debian/Ubuntu, as root).
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
		echo "make: installing promtool (package prometheus)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq prometheus >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null && apt-get install -y -qq prometheus >/dev/null; } || \
		{ echo "make: could not install promtool; install it (apt-get install -y prometheus) and run make test again"; exit 1; }; }

# staticcheck at a pinned release (2026.2.2), built by go run from the Go
# module proxy: no tool dependency in go.mod, the same version everywhere.
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint: ## gofmt, go vet and staticcheck over the root module, cmd/idemq and idemwatermill
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(STATICCHECK) ./...
	cd cmd/idemq && $(GO) vet ./... && $(STATICCHECK) ./...
	cd idemwatermill && $(GO) vet ./... && $(STATICCHECK) ./...
