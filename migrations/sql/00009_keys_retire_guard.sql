-- +goose Up
-- Retiring the single key table is exact, whatever the isolation level of
-- the transactions that write it. The clean-up of the partitioned layout
-- stops reading exactly_keys once none of its keys is live, with
-- exactly_keys2_retire(): it locks exactly_keys in SHARE ROW EXCLUSIVE mode
-- (waiting for every transaction that wrote there), checks that no key is
-- live (as pgstore judges it: not expired, or still leased), creates the
-- row trigger exactly_keys_retired_guard, which refuses every update of a
-- row of exactly_keys with SQLSTATE EXK02, and clears the state's legacy
-- column; if a key is live it changes nothing and returns false. A write
-- that comes after the retire is refused: a transaction that began while a
-- key was live, of a store of either layout and at any isolation level,
-- cannot take the key over or complete it in a table that no store reads
-- any more. The trigger fires per row, so a statement that updates no row
-- of exactly_keys (a store whose state still names the table, updating a
-- key of the partitioned table) is not refused. It exists only once the
-- table is retired: a row trigger, even disabled, costs every update a
-- row lock. Both functions run with their owner's rights (creating the
-- trigger needs the table's owner) and a search_path of pg_catalog only, so
-- the consumer role needs no grant and a caller's objects are never used.
-- The retire runs in a READ COMMITTED transaction: each of its statements
-- reads what committed before it, the writers it waited for included.

-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format($f$
CREATE FUNCTION %1$I.exactly_keys_retired_guard() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $b$
BEGIN
    RAISE EXCEPTION 'exactly: the single key table of schema %% was retired: no store reads it any more, and its keys had expired', %2$L
        USING ERRCODE = 'EXK02',
              HINT = 'The key is claimed again on the partitioned key layout; a lease held on it was lost.';
END;
$b$$f$, current_schema(), current_schema());
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.exactly_keys_retired_guard() FROM PUBLIC', current_schema());
    EXECUTE format($f$
CREATE FUNCTION %1$I.exactly_keys2_retire() RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $b$
BEGIN
    IF current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION 'exactly: exactly_keys2_retire() runs in a READ COMMITTED transaction, not %%', current_setting('transaction_isolation')
            USING ERRCODE = '25001';
    END IF;
    -- exactly_keys is locked before the state is read: the order of
    -- every other statement that takes both (a TRUNCATE of the schema's
    -- tables, for one), so that none deadlocks with the retire.
    IF to_regclass(%2$L) IS NOT NULL THEN
        LOCK TABLE %1$I.exactly_keys IN SHARE ROW EXCLUSIVE MODE;
    END IF;
    IF NOT EXISTS (SELECT FROM %1$I.exactly_keys2_state s WHERE s.started_at IS NOT NULL AND s.legacy IS NOT NULL) THEN
        RETURN false;
    END IF;
    IF to_regclass(%2$L) IS NOT NULL THEN
        IF EXISTS (SELECT FROM %1$I.exactly_keys o
                   WHERE o.expires_at OPERATOR(pg_catalog.>=) now()
                      OR (o.status OPERATOR(pg_catalog.=) 'PROCESSING' AND o.locked_until OPERATOR(pg_catalog.>=) now())) THEN
            RETURN false;
        END IF;
        IF NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid OPERATOR(pg_catalog.=) %2$L::regclass
                       AND t.tgname OPERATOR(pg_catalog.=) 'exactly_keys_retired_guard') THEN
            CREATE TRIGGER exactly_keys_retired_guard BEFORE UPDATE ON %1$I.exactly_keys
                FOR EACH ROW EXECUTE FUNCTION %1$I.exactly_keys_retired_guard();
        END IF;
        ALTER TABLE %1$I.exactly_keys ENABLE TRIGGER exactly_keys_retired_guard;
    END IF;
    UPDATE %1$I.exactly_keys2_state SET legacy = NULL;
    RETURN true;
END;
$b$$f$, current_schema(), format('%I.exactly_keys', current_schema()));
END;
$do$;
-- +goose StatementEnd

-- Where exactly_keys was retired and not dropped yet, the guard is on at
-- once.
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass(format('%I.exactly_keys', current_schema())) IS NOT NULL
       AND EXISTS (SELECT FROM exactly_keys2_state WHERE started_at IS NOT NULL AND legacy IS NULL) THEN
        CREATE TRIGGER exactly_keys_retired_guard BEFORE UPDATE ON exactly_keys
            FOR EACH ROW EXECUTE FUNCTION exactly_keys_retired_guard();
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass(format('%I.exactly_keys', current_schema())) IS NOT NULL THEN
        DROP TRIGGER IF EXISTS exactly_keys_retired_guard ON exactly_keys;
    END IF;
END;
$$;
-- +goose StatementEnd
DROP FUNCTION exactly_keys2_retire();
DROP FUNCTION exactly_keys_retired_guard();
