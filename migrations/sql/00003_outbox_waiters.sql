-- +goose Up
-- Producers notify only while a relay sleeps. Postgres serialises the
-- commits of notifying transactions (one lock, held through the commit's WAL
-- flush), so a NOTIFY on every insert caps busy producers. A relay with
-- nothing left to publish registers here before it sleeps on LISTEN and
-- removes itself when it wakes; producers look at commit time (a deferred
-- trigger) and notify only when a live registration exists. A busy relay
-- polls on its own, so nobody needs to wake it.
CREATE TABLE exactly_outbox_waiters (
    relay      text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION exactly_outbox_notify() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF EXISTS (SELECT FROM exactly_outbox_waiters WHERE expires_at > clock_timestamp()) THEN
        PERFORM pg_notify('exactly_outbox', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

DROP TRIGGER exactly_outbox_notify ON exactly_outbox;
CREATE CONSTRAINT TRIGGER exactly_outbox_notify AFTER INSERT ON exactly_outbox
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION exactly_outbox_notify();

-- +goose Down
DROP TRIGGER exactly_outbox_notify ON exactly_outbox;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION exactly_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('exactly_outbox', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER exactly_outbox_notify AFTER INSERT ON exactly_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION exactly_outbox_notify();
DROP TABLE exactly_outbox_waiters;
