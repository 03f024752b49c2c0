# Common tasks. `make test` is what CI runs (see .ci/run).
GO ?= go
PKGS ?= ./...

.PHONY: demo test test-short chaos bench lint services services-stop up down

# The ledger demo: Postgres at DATABASE_URL, else at localhost, else a
# throwaway server for the demo's lifetime; Kafka in-process unless
# KAFKA_BROKERS is set.
demo:
	$(GO) run ./examples/ledger-consumer demo

# The whole suite against real Postgres and Kafka, with the race detector,
# then the skipped tests with their reasons and a count (scripts/test.sh).
# Services come from TEST_DATABASE_URL / TEST_KAFKA_BROKERS, else it starts
# them (scripts/postgres.sh, scripts/kafka.sh).
test:
	GO="$(GO)" PKGS="$(PKGS)" scripts/test.sh

test-short:
	$(GO) test -short -count=1 $(PKGS)

# The long chaos run (about 5 minutes): worker processes, a Postgres and a
# Kafka broker of its own, crashes, restarts and pauses, then an audit. Its
# short version runs in make test. CHAOS_SEED=… repeats a run.
chaos:
	CHAOS_LONG=1 $(GO) test -race -count=1 -timeout 30m -run 'TestChaos$$' -v ./internal/chaos/

# Side-by-side benchmarks; see README "Performance".
bench:
	$(GO) test -run '^$$' -bench . -count 5 -benchtime 2s ./pgstore

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# Local servers without Docker: the machine's Postgres and a real Kafka
# broker fetched from Maven Central.
services:
	scripts/postgres.sh start
	scripts/kafka.sh start

services-stop:
	-scripts/kafka.sh stop

# With Docker: the same server versions from docker-compose.yml.
up:
	docker compose up -d --wait postgres kafka

down:
	docker compose down -v
