# Common tasks. `make test` is what CI runs (see .ci/run).
GO ?= go
# Every package of every module of the workspace (go.work): ./... alone stops
# at the nested modules (examples/ledger-consumer, cmd/replay, embedpg,
# systest, tools, internal/testkit/testservices).
PKGS ?= $(shell GO="$(GO)" scripts/packages.sh)

.PHONY: test-console console-screenshot api release-check release-check-selftest bench-keys throughput demo test test-matrix test-pooler test-short chaos chaos-short chaos-keys chaos-pooler chaos-franz chaos-topology bench lint services services-stop up down images test-docker compose-test

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

# The packages that talk to the servers against every supported PostgreSQL
# (13 to 18, binaries from Maven Central) and Kafka (3.9, 4.x), one axis at
# a time, each on servers of its own; see docs/versions.md and
# scripts/matrix.sh (MATRIX_PKGS, MATRIX_PG, MATRIX_KAFKA, MATRIX_JOBS).
test-matrix:
	GO="$(GO)" scripts/matrix.sh

# The tests behind PgBouncer (Debian's package, scripts/pgbouncer.sh) in
# transaction mode: the pooler tests with pgx's default QueryExecMode, then
# the pgstore, outbox, consumer, worker, httpkey and console suites through it with
# default_query_exec_mode=exec (scripts/test-pooler.sh says which tests it
# holds out, and why). docs/deployments.md, "Behind a connection pooler".
test-pooler:
	GO="$(GO)" scripts/test-pooler.sh

# The operator console in a real browser: Debian's chromium, headless
# (apt-get install -y chromium; CHROMIUM=path for another), driven by
# chromedp against a running worker on TEST_DATABASE_URL and
# TEST_KAFKA_BROKERS (docs/console.md). make test skips it.
test-console:
	EXACTLY_BROWSER_TEST=1 $(GO) test -race -count=1 -timeout 3m -run 'TestConsoleInBrowser$$' ./systest/console/

# The same run, saving the page with a dead letter to docs/console.png.
console-screenshot:
	EXACTLY_BROWSER_TEST=1 EXACTLY_CONSOLE_SCREENSHOT=$(CURDIR)/docs/console.png $(GO) test -count=1 -run 'TestConsoleInBrowser$$' ./systest/console/

test-short:
	$(GO) test -short -count=1 $(PKGS)

# The long chaos run (about 5 minutes): worker processes, a Postgres and a
# Kafka broker of its own, crashes, restarts and pauses, then an audit.
# CHAOS_SEED=… repeats a run.
chaos:
	CHAOS_LONG=1 $(GO) test -race -count=1 -timeout 30m -run 'TestChaos$$' -v ./systest/chaos/

# The short chaos run (1.5 to 3 minutes).
chaos-short:
	CHAOS=1 $(GO) test -race -count=1 -timeout 20m -run 'TestChaos$$' -v ./systest/chaos/

# The short chaos run with the key layout's partition maintenance forced:
# partitions 2s wide, the key clean-up every second, half the IDs UUIDv7s;
# see docs/chaos.md. (Every chaos run uses the default, partitioned layout;
# CHAOS_KEY_LAYOUT=single-table runs the single table.)
chaos-keys:
	CHAOS=1 CHAOS_KEY_MAINTENANCE=1 $(GO) test -race -count=1 -timeout 20m -run 'TestChaos$$' -v ./systest/chaos/

# The short chaos run with partition maintenance forced, the workers
# reaching Postgres through PgBouncer in transaction mode (CHAOS_POOLER=1,
# scripts/pgbouncer.sh; docs/chaos.md).
chaos-pooler:
	CHAOS=1 CHAOS_KEY_MAINTENANCE=1 CHAOS_POOLER=1 $(GO) test -race -count=1 -timeout 20m -run 'TestChaos$$' -v ./systest/chaos/

# The short chaos run with the workers on the franz-go transport, each a
# static member (docs/chaos.md).
chaos-franz:
	CHAOS=1 CHAOS_TRANSPORT=franz-go CHAOS_STATIC=1 $(GO) test -race -count=1 -timeout 20m -run 'TestChaos$$' -v ./systest/chaos/

# The topology runs (CHAOS_TOPOLOGY=1): the chaos suite on a three-node
# Kafka cluster (scripts/kafka.sh cluster), topics RF 3 and
# min.insync.replicas=2, with a partition leader killed, the active
# controller killed and a node paused past its session, the commands
# topic's partitions raised, a Postgres primary failed over to its
# synchronous standby, and a bad network between the workers and the
# servers (toxiproxy: latency, COMMIT answers reset, half-open
# connections), each CHAOS_TOPOLOGY_FAULTS times (2); CHAOS_TOPOLOGY_KINDS (comma-separated)
# runs some kinds only; see docs/chaos-topology.md.
chaos-topology:
	CHAOS_TOPOLOGY=1 $(GO) test -race -count=1 -timeout 60m -run 'TestChaosTopology$$' -v ./systest/chaos/

# The throughput benchmarks of every module (per-message-dedupe,
# batch-dedupe, batch-plain, keyed-concurrency, partition-sequential); see
# docs/performance.md. ./... would stop at the nested modules.
throughput:
	$(GO) test -run '^$$' -bench Throughput -benchtime 3x $(PKGS)

# Side-by-side benchmarks; see docs/performance.md.
bench:
	$(GO) test -run '^$$' -bench . -count 5 -benchtime 2s ./pgstore

# What the number of stored keys costs a claim, per key layout and kind of
# message ID, in a memory-capped Postgres of its own (as root; long: about an
# hour at the default 10M keys). KEYS=30000000 for the long run; see
# docs/keys.md and scripts/bench-keys.sh.
bench-keys:
	GO="$(GO)" scripts/bench-keys.sh

# gofmt, go vet of every module, the exactlyvet analyzer on the examples
# (tools/exactlyvet: what a handler must not do with its transaction, its
# messages and the pool), and the public API files (api/*.txt) up to date
# with the code (make api rewrites them).
EXACTLYVET ?= $(CURDIR)/.cache/exactlyvet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) build -o $(EXACTLYVET) ./tools/exactlyvet/cmd/exactlyvet
	$(GO) vet -vettool=$(EXACTLYVET) ./examples/... ./examples/ledger-consumer/...
	scripts/api.sh check

# The public API of each published module, printed to api/*.txt; commit the
# result with the change that made it.
api:
	scripts/api.sh

# The published modules installed as a user does, from a module proxy built
# from this tree for the release candidate: README.md's Install commands, its
# quick start, both plugins, replay --help; no replace directive, no
# unpublished requirement, no file over 1 MB (scripts/release-check.sh,
# RELEASING.md). RELEASE_CHECK_MODCACHE=DIR keeps third-party modules
# between runs.
release-check:
	scripts/release-check.sh

# release-check refusing, in clones of HEAD, a replace directive put back,
# cmd/replay requiring the example again and a 2 MB file committed.
release-check-selftest:
	scripts/release-check-selftest.sh

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
# DOCKER_PKGS narrows it (default: all packages of all modules).
DOCKER_PKGS ?= $(PKGS)
test-docker:
	scripts/test-docker.sh $(DOCKER_PKGS)

# docker-compose.yml end to end on free ports: up, load, verify, down.
compose-test:
	scripts/compose.sh test
