-- +goose Up
-- The switch from the legacy key layout (exactly_keys) to the partitioned one
-- (exactly_keys2) is exact, even while workers of both run. A store of the
-- partitioned layout starts it once per schema, with exactly_keys2_start():
-- it enables the statement trigger exactly_keys_legacy_guard, which refuses
-- every insert into exactly_keys with SQLSTATE EXK01, and sets started_at.
-- Enabling a trigger takes a SHARE ROW EXCLUSIVE lock on exactly_keys, so
-- the start waits for every transaction that writes there (a legacy claim
-- in flight) and the legacy claims that come after it wait for the start,
-- then are refused: a store of the legacy layout (of any version) can no
-- longer claim a key that a store of the partitioned layout may claim, and
-- the keys it claimed before are all committed, and so seen by the
-- partitioned layout's probe of exactly_keys. Until the start the trigger
-- is disabled, so a legacy claim pays nothing for it. The keys already in
-- exactly_keys keep working for the partitioned layout, which reads them; a
-- legacy store still completes the leases it holds (an update), but every
-- claim of its is refused, duplicates included (a claim is an insert). Both
-- functions run with their owner's rights (enabling the trigger needs the
-- table's owner), so the consumer role needs no grant.
ALTER TABLE exactly_keys2_state ADD COLUMN started_at timestamptz;
-- A schema whose partitioned layout already holds keys has started.
UPDATE exactly_keys2_state SET started_at = now() WHERE EXISTS (SELECT FROM exactly_keys2);

-- The functions name every object with their schema (written in when they
-- are created), so they need no search_path of their own.
-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format($f$
CREATE FUNCTION %1$I.exactly_keys_legacy_guard() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $b$
BEGIN
    RAISE EXCEPTION 'exactly: the partitioned key layout started on schema %%: a store with the legacy layout may not claim new keys there', %2$L
        USING ERRCODE = 'EXK01',
              HINT = 'Run every worker of this schema with pgstore.LayoutPartitioned (worker.Config.KeyLayout); the keys in exactly_keys are still honoured.';
END;
$b$$f$, current_schema(), current_schema());
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.exactly_keys_legacy_guard() FROM PUBLIC', current_schema());
    EXECUTE format($f$
CREATE FUNCTION %1$I.exactly_keys2_start() RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER AS $b$
DECLARE
    started timestamptz;
BEGIN
    SELECT s.started_at INTO started FROM %1$I.exactly_keys2_state s;
    IF started IS NOT NULL THEN
        RETURN started;
    END IF;
    IF pg_catalog.to_regclass(%2$L) IS NOT NULL THEN
        ALTER TABLE %1$I.exactly_keys ENABLE TRIGGER exactly_keys_legacy_guard;
    END IF;
    UPDATE %1$I.exactly_keys2_state SET started_at = coalesce(started_at, pg_catalog.clock_timestamp())
        RETURNING started_at INTO started;
    RETURN started;
END;
$b$$f$, current_schema(), format('%I.exactly_keys', current_schema()));
END;
$do$;
-- +goose StatementEnd

-- exactly_keys is gone where it was retired and dropped.
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass(format('%I.exactly_keys', current_schema())) IS NOT NULL THEN
        CREATE TRIGGER exactly_keys_legacy_guard BEFORE INSERT ON exactly_keys
            FOR EACH STATEMENT EXECUTE FUNCTION exactly_keys_legacy_guard();
        IF NOT EXISTS (SELECT FROM exactly_keys2_state WHERE started_at IS NOT NULL) THEN
            ALTER TABLE exactly_keys DISABLE TRIGGER exactly_keys_legacy_guard;
        END IF;
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass(format('%I.exactly_keys', current_schema())) IS NOT NULL THEN
        DROP TRIGGER IF EXISTS exactly_keys_legacy_guard ON exactly_keys;
    END IF;
END;
$$;
-- +goose StatementEnd
DROP FUNCTION exactly_keys_legacy_guard();
DROP FUNCTION exactly_keys2_start();
ALTER TABLE exactly_keys2_state DROP COLUMN started_at;
