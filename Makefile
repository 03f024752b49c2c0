# Common tasks. `make test` is what CI runs (see .ci/run).
GO ?= go
PKGS ?= ./...

.PHONY: demo test test-short bench lint services services-stop up down images test-docker compose-test

# The ledger demo: needs Postgres at DATABASE_URL; Kafka in-process unless KAFKA_BROKERS is set.
demo:
	$(GO) run ./examples/ledger-consumer demo

# The whole suite against real Postgres and Kafka, with the race detector.
# Services come from TEST_DATABASE_URL / TEST_KAFKA_BROKERS, testcontainers
# when Docker runs, local servers (make services), or an in-process broker.
test:
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

test-short:
	$(GO) test -short -count=1 $(PKGS)

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

# With Docker: Postgres, Kafka and the ledger worker from docker-compose.yml,
# on 127.0.0.1 (POSTGRES_PORT, KAFKA_PORT, METRICS_PORT; 5432, 9092, 9090).
# Without a registry the images are built locally (make images).
up:
	scripts/compose.sh up

down:
	scripts/compose.sh down

# The images of docker-compose.yml and the tests, built without a registry
# (Debian packages, Maven Central, the Go module proxy); cached.
images:
	scripts/docker-images.sh

# The suite with every service from testcontainers-go (Docker engine started
# and images built when missing); a test served from elsewhere fails.
# DOCKER_PKGS narrows it (default: all packages).
DOCKER_PKGS ?= ./...
test-docker:
	scripts/test-docker.sh $(DOCKER_PKGS)

# docker-compose.yml end to end on free ports: up, load, verify, down.
compose-test:
	scripts/compose.sh test
