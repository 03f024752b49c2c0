-- +goose Up
-- Retiring the single key table is exact, whatever the isolation level of
-- the transactions that write it. The clean-up of the partitioned layout
-- stops reading exactly_keys once none of its keys is live, with
-- exactly_keys2_retire(): it enables the row trigger
-- exactly_keys_retired_guard, which refuses every update of a row of
-- exactly_keys with SQLSTATE EXK02, checks again that no key there is live
-- (as pgstore judges it: not expired, or still leased), and clears the
-- state's legacy column; if a key is live it disables the trigger again and
-- changes nothing. Enabling a trigger takes a SHARE ROW EXCLUSIVE lock on
-- exactly_keys, so the retire waits for every transaction that wrote there
-- (and then sees the keys it wrote live), and a write that comes after it
-- is refused: a transaction that began while a key was live, of a store of
-- either layout and at any isolation level, cannot take the key over or
-- complete it in a table that no store reads any more. The trigger fires
-- per row, so a statement that updates no row of exactly_keys (a store
-- whose state still names the table, updating a key of the partitioned
-- table) is not refused. Both functions run with their owner's rights
-- (enabling the trigger needs the table's owner), so the consumer role needs
-- no grant.

-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format($f$
CREATE FUNCTION %1$I.exactly_keys_retired_guard() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $b$
BEGIN
    RAISE EXCEPTION 'exactly: the single key table of schema %% was retired: no store reads it any more, and its keys had expired', %2$L
        USING ERRCODE = 'EXK02',
              HINT = 'The key is claimed again on the partitioned key layout; a lease held on it was lost.';
END;
$b$$f$, current_schema(), current_schema());
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.exactly_keys_retired_guard() FROM PUBLIC', current_schema());
    EXECUTE format($f$
CREATE FUNCTION %1$I.exactly_keys2_retire() RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER AS $b$
BEGIN
    IF NOT EXISTS (SELECT FROM %1$I.exactly_keys2_state s WHERE s.started_at IS NOT NULL AND s.legacy IS NOT NULL) THEN
        RETURN false;
    END IF;
    IF pg_catalog.to_regclass(%2$L) IS NOT NULL THEN
        ALTER TABLE %1$I.exactly_keys ENABLE TRIGGER exactly_keys_retired_guard;
        IF EXISTS (SELECT FROM %1$I.exactly_keys o
                   WHERE o.expires_at >= pg_catalog.now() OR (o.status = 'PROCESSING' AND o.locked_until >= pg_catalog.now())) THEN
            ALTER TABLE %1$I.exactly_keys DISABLE TRIGGER exactly_keys_retired_guard;
            RETURN false;
        END IF;
    END IF;
    UPDATE %1$I.exactly_keys2_state SET legacy = NULL;
    RETURN true;
END;
$b$$f$, current_schema(), format('%I.exactly_keys', current_schema()));
END;
$do$;
-- +goose StatementEnd

-- exactly_keys is gone where it was retired and dropped; where it was
-- retired and not dropped yet, the guard is on at once.
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass(format('%I.exactly_keys', current_schema())) IS NOT NULL THEN
        CREATE TRIGGER exactly_keys_retired_guard BEFORE UPDATE ON exactly_keys
            FOR EACH ROW EXECUTE FUNCTION exactly_keys_retired_guard();
        IF NOT EXISTS (SELECT FROM exactly_keys2_state WHERE started_at IS NOT NULL AND legacy IS NULL) THEN
            ALTER TABLE exactly_keys DISABLE TRIGGER exactly_keys_retired_guard;
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
        DROP TRIGGER IF EXISTS exactly_keys_retired_guard ON exactly_keys;
    END IF;
END;
$$;
-- +goose StatementEnd
DROP FUNCTION exactly_keys2_retire();
DROP FUNCTION exactly_keys_retired_guard();
