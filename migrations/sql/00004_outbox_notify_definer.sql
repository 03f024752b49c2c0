-- +goose Up
-- The deferred notify trigger reads exactly_outbox_waiters at commit, and a
-- trigger function runs with the rights of the role that commits: a producer
-- granted only INSERT on exactly_outbox (and USAGE on its sequence) failed
-- at COMMIT, after all its work. The function now runs with its owner's
-- rights (the role that migrates), so producers need no grant on the
-- waiters table. Its search_path is pinned to this schema, with pg_temp
-- last, so a producer's temporary tables cannot stand in for ours. Nobody
-- needs to call it: a trigger fires without EXECUTE rights.
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION %1$I.exactly_outbox_notify() SECURITY DEFINER SET search_path = %1$I, pg_temp',
        current_schema());
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.exactly_outbox_notify() FROM PUBLIC', current_schema());
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION %1$I.exactly_outbox_notify() SECURITY INVOKER SET search_path = %1$I',
        current_schema());
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.exactly_outbox_notify() TO PUBLIC', current_schema());
END;
$$;
-- +goose StatementEnd
