// Package chaos holds the chaos suite of exactly (in its tests): several
// ledger worker processes in one consumer group run against a Postgres
// cluster and a Kafka broker of the suite's own, through worker kills,
// database and broker crashes, pauses, producers with another partitioner
// and transactional producers that commit and abort, and a restore of the
// database to before the first position (restore_test.go); an audit that reads
// Postgres and Kafka directly then checks that every command was applied
// exactly once.
//
//	make chaos-short                                              # the short run, also part of make test
//	make chaos                                                    # the long run (CHAOS_LONG=1)
//	make chaos-topology                                           # three Kafka nodes (CHAOS_TOPOLOGY=1)
//	make chaos-keys                                               # partition maintenance forced (CHAOS_KEY_MAINTENANCE=1)
//	make chaos-pooler                                             # maintenance forced, the workers behind PgBouncer (CHAOS_KEY_MAINTENANCE=1 CHAOS_POOLER=1; pooler_test.go)
//	make chaos-franz                                              # the workers on franz-go, static members (CHAOS_TRANSPORT=franz-go CHAOS_STATIC=1)
//
// The topology run (topology_test.go) runs the workload on a three-node
// Kafka cluster (scripts/kafka.sh cluster; topics with replication factor 3
// and min.insync.replicas=2) and kills a partition leader, kills the active
// controller and pauses a node past its broker session, raises the commands
// topic's partition count (repartition_test.go), fails a Postgres
// primary over to its synchronous standby (standby_test.go) and puts a bad
// network between the workers and every server (netfault_test.go:
// toxiproxy proxies adding latency, resetting connections right after a
// COMMIT is durable, leaving connections half-open), each
// CHAOS_TOPOLOGY_FAULTS times (2), with worker kills between them; it also
// checks that every record a producer had acknowledged is in the log, and
// prints the recovery after each fault kind (see docs/chaos-topology.md).
//
// make test runs the short version (about 1.5 minutes on an idle machine);
// CHAOS=0 leaves it out, and so does -short.
//
// Environment: CHAOS_SEED repeats a run; CHAOS_LONG=1 selects the long run;
// CHAOS_RECOVERY_KILLS sets how many crashes are timed one at a time.
// Parts of the run can be switched off to see whether the rest holds:
// CHAOS_TRANSACTIONS=0 leaves out the transactional producers (their
// aborted transactions, and the transaction markers that commits leave in
// the log too), CHAOS_CROSS_PARTITION=0 the producer with another
// partitioner, CHAOS_BATCH=N sets the batch size of the workers with an odd
// id, which run in batch mode beside per-message ones in the same group
// (200 by default; 0 runs every worker per message), CHAOS_STARTUP_WAIT=0 the check that a worker started while the
// broker is down waits for it instead of exiting.
//
// The workers keep their keys in the default, partitioned layout
// (keys_test.go): half the IDs are UUIDv7s minted as the workload is
// generated, which go to the time partitions, half UUIDv4s, which go to
// exactly_keys2_other. The audit reads the keys from the partitioned
// tables, and the run fails unless both the time partitions and
// exactly_keys2_other hold keys, IDs of both kinds were repeated in the
// log, and the single table exactly_keys holds none.
// CHAOS_KEY_MAINTENANCE=1 forces partition maintenance: time partitions 2
// seconds wide (exactly_keys2_state.width, set before the first worker
// starts) and the key clean-up, which creates them ahead and drops them,
// every second (--key-cleanup 1s); the run then also fails unless at least
// 20 time partitions are attached at the end, and it has no restore fault
// (a restore of rows would bring back keys of dropped partitions).
// CHAOS_KEY_LAYOUT=single-table runs the workers on the single table
// (--key-layout single-table).
//
// CHAOS_TRANSPORT=franz-go runs the workers on the franz-go transport
// (--transport franz-go: cooperative-sticky rebalances, franz-go's
// idempotent producer for the relay and the dead letters); CHAOS_STATIC=1
// makes each of them a static member (--instance-id chaos-<id>, the same
// at every restart of that worker, so a kill -9 and the restart move no
// partition). make chaos-franz runs the short run so.
package chaos
