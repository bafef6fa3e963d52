# The two commands a newcomer needs: `make demo` and `make test`.
GO ?= go
BENCHTIME ?= 2s

.PHONY: demo test bench lint

demo: ## run the end-to-end demo on the local Postgres
	$(GO) run ./examples/orders

test: ## run the whole suite against real servers (race detector on)
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...

bench: ## run the benchmarks; each reports its ratio against a baseline measured in the same run
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -timeout 60m ./...

lint: ## gofmt and go vet
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
