// Package migrations creates and upgrades the tables exactly owns.
//
// The SQL files are goose migrations embedded in the binary. [Migrate] runs
// them with goose under a version table of our own
// (exactly_goose_db_version), so they never collide with the service's own
// goose, Flyway or Atlas history, and under a session advisory lock, so two
// processes starting at once do not both migrate:
//
//	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: "ledger"}); err != nil {
//		return err
//	}
//
// Teams that run goose themselves can take the files from [FS].
//
// # Roles and grants
//
// A deployment needs no superuser and only one role with DDL rights. The
// migrator owns the schema and every table in it, and runs [Migrate]; the
// consumer runs the middleware (pgstore) and writes to the outbox
// (outbox.Writer); the relay publishes the outbox (outbox.Relay). Neither
// the consumer nor the relay can change the schema. As an administrator,
// once (give each role a password, or whatever your authentication needs):
//
//	CREATE ROLE ledger_migrator LOGIN;
//	CREATE ROLE ledger_consumer LOGIN;
//	CREATE ROLE ledger_relay LOGIN;
//	CREATE SCHEMA ledger AUTHORIZATION ledger_migrator;
//
// Then run Migrate as ledger_migrator (no CREATE on the database needed: the
// schema exists), and after it, as ledger_migrator, the tables' owner:
//
//	GRANT USAGE ON SCHEMA ledger TO ledger_consumer, ledger_relay;
//	GRANT SELECT, INSERT, UPDATE, DELETE ON ledger.exactly_keys2 TO ledger_consumer;
//	GRANT SELECT, INSERT ON ledger.exactly_key_names TO ledger_consumer;
//	GRANT SELECT ON ledger.exactly_keys2_state TO ledger_consumer;
//	GRANT SELECT, UPDATE ON ledger.exactly_keys TO ledger_consumer;
//	GRANT SELECT, INSERT, UPDATE ON ledger.exactly_positions TO ledger_consumer;
//	GRANT SELECT, INSERT, UPDATE ON ledger.exactly_positions_claims TO ledger_consumer;
//	GRANT SELECT, INSERT, UPDATE ON ledger.exactly_scopes TO ledger_consumer;
//	GRANT INSERT ON ledger.exactly_outbox TO ledger_consumer;
//	GRANT USAGE ON SEQUENCE ledger.exactly_outbox_id_seq TO ledger_consumer;
//	GRANT SELECT, UPDATE, DELETE ON ledger.exactly_outbox TO ledger_relay;
//	GRANT SELECT, INSERT, UPDATE, DELETE ON ledger.exactly_outbox_waiters TO ledger_relay;
//
// What each grant is for: on exactly_keys2 (the partitioned key table; its
// partitions need no grant, the statements go through it), INSERT and
// SELECT claim a key and read the stored row, UPDATE locks it (FOR UPDATE),
// stores results and takes over, completes or releases leases, DELETE
// releases a failed lease; exactly_key_names holds the codes of scopes and
// topics (SELECT, INSERT a new name); exactly_keys2_state says which
// partitions exist; exactly_keys, the single table of a deployment that
// had one, is read (and a lease found there completed) until its keys
// expire. The key clean-up runs DDL, so it runs as the migrator, on a
// store of its own (pgstore.Store.Check creates the first partitions,
// Store.RunCleanup the next ones); the consumer's worker sets
// CleanupInterval to -1. A deployment on the single table
// (pgstore.LayoutSingleTable) grants SELECT, INSERT, UPDATE, DELETE on
// exactly_keys instead, and its clean-up (DELETE) may run as the consumer.
// On exactly_positions, SELECT reads a group's positions when partitions are
// assigned and INSERT and UPDATE save them (pgstore.Positions); on
// exactly_positions_claims, INSERT and UPDATE claim the partitions a
// member is assigned and SELECT (FOR SHARE, which needs UPDATE) fences its
// saves (migration 00013 gives it every grant exactly_positions had). On
// exactly_scopes, a worker records its group for its scope and topic at
// start (SELECT, INSERT; UPDATE to take a scope over: worker.Config.TakeOver,
// pgstore.Store.RegisterScope). A
// producer needs only INSERT on exactly_outbox and USAGE on its id sequence:
// the notify trigger that runs at its COMMIT reads exactly_outbox_waiters
// with the migrator's rights (migration 00004). The relay reads pending rows
// FOR UPDATE SKIP LOCKED and marks them (SELECT, UPDATE), deletes published
// ones (DELETE), and registers in exactly_outbox_waiters before it sleeps.
// LISTEN/NOTIFY and advisory locks need no grant. The consumer's own tables
// (the ledger's accounts, say) need their own grants, and a process that
// both consumes and relays needs both roles' grants (GRANT ledger_relay TO
// ledger_consumer). A database that revoked CONNECT from PUBLIC needs
// GRANT CONNECT ON DATABASE for each role. exactly_redrives is written by
// the replay tool's redrive and the console only (SELECT, INSERT, UPDATE:
// a redrive whose publish failed is recorded as uncertain): run it as the
// migrator, or grant those to an operator's role.
package migrations
