#!/usr/bin/env bash
# The tests behind a connection pooler (make test-pooler): PgBouncer from
# Debian's package (scripts/pgbouncer.sh) in transaction mode, in front of
# the test PostgreSQL (TEST_DATABASE_URL, else scripts/postgres.sh's).
#
#  1. pgx's default QueryExecMode (cache_statement): the pooler tests of
#     every package (names matching POOLER_TESTS); pgstore.Check must refuse
#     the modes that cannot work there, each other test picks its modes.
#  2. default_query_exec_mode=exec: the pgstore, outbox, consumer, worker
#     and httpkey suites with the shared test pool through the pooler
#     (TEST_VIA_POOLER=1; the migrations of each test's schema and the
#     worker processes some tests start use a direct connection), minus the
#     tests in VIA_POOLER_SKIP, which hold session state on purpose or
#     need a direct connection (each one's reason below).
#
# It stops the pooler at the end if it started it. Environment: GO,
# PGBOUNCER_* (scripts/pgbouncer.sh), VIA_POOLER_PKGS (the suites of step 2).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

if [ -z "${TEST_DATABASE_URL:-}" ]; then
	TEST_DATABASE_URL=$(scripts/postgres.sh start)
	export TEST_DATABASE_URL
fi
started=
if ! scripts/pgbouncer.sh status >/dev/null 2>&1; then started=1; fi
url=$(scripts/pgbouncer.sh start)
if [ -n "$started" ]; then trap 'scripts/pgbouncer.sh stop' EXIT; fi
case "$url" in
postgres://*) ;;
*) echo "pgbouncer.sh start printed something other than a URL: $url" >&2; exit 1 ;;
esac
export TEST_POOLER_URL=$url TEST_POOLER_MODE=transaction

POOLER_TESTS='Pooler|ExecMode'
echo "== behind PgBouncer (transaction mode), pgx's default mode: the pooler tests"
"$GO" test -race -count=1 -run "$POOLER_TESTS" ./internal/pooler/ ./migrations/ ./pgstore/ ./outbox/ ./consumer/ ./worker/

# Held out of step 2, with why:
#   TestCleanupOneRunnerAtATime, TestLaneGrantedAsTheWaitTimesOut,
#   TestBatchTimeoutNacksTheBatchWhole, TestBatchTimeoutJudgedAtItsDeadline,
#   TestRelayAcrossWaitersMigration: take a session advisory lock (or
#     migrate) on the shared pool to set the scene; a transaction pooler
#     does not keep session state, which is the point of the run (the next
#     transaction may even run on the session that holds the lock).
#   TestRunLeavesNothingRunning, TestRegistrationCutShortLeavesNoWaiter:
#     exercise the relay's LISTEN connection and its waiter registration,
#     which a relay behind a transaction pooler turns off (it polls only).
#   TestSmallPoolEveryEntryPoint: behind a transaction pooler Cleanup holds
#     its lock on a second connection (docs/deployments.md), which a pool of
#     one or of two with one busy does not have.
#   TestCutJudgedBehindTransactionPooler: runs in step 1; with five suites
#     at once every server session of the pooler's pool (40) may be taken,
#     and the verdict's reads queue in the pooler past the deadline.
#   TestSingleTableRetireIsolationAndGuard,
#   TestScopeRegistrationWaitsOutAnUnavailableDatabase: connect with
#     default_transaction_isolation or lock_timeout as a startup parameter,
#     which PgBouncer refuses.
VIA_POOLER_SKIP=${VIA_POOLER_SKIP:-'TestCleanupOneRunnerAtATime|TestLaneGrantedAsTheWaitTimesOut|TestBatchTimeoutNacksTheBatchWhole|TestBatchTimeoutJudgedAtItsDeadline|TestRelayAcrossWaitersMigration|TestRunLeavesNothingRunning|TestRegistrationCutShortLeavesNoWaiter|TestSmallPoolEveryEntryPoint|TestCutJudgedBehindTransactionPooler|TestSingleTableRetireIsolationAndGuard|TestScopeRegistrationWaitsOutAnUnavailableDatabase'}
VIA_POOLER_PKGS=${VIA_POOLER_PKGS:-./pgstore/ ./outbox/ ./consumer/ ./worker/ ./httpkey/ ./console/}
echo "== behind PgBouncer (transaction mode), default_query_exec_mode=exec: $VIA_POOLER_PKGS"
# shellcheck disable=SC2086
TEST_VIA_POOLER=1 TEST_POOLER_URL="$url&default_query_exec_mode=exec" \
	"$GO" test -count=1 -skip "$VIA_POOLER_SKIP" $VIA_POOLER_PKGS
