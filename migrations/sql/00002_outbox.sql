-- +goose Up
-- The transactional outbox. A row is written in the producer's transaction
-- and published by a Relay after commit. lane spreads partition keys over
-- 16 lanes: one relay at a time works a lane, in id order, which keeps the
-- order of each key with several relays running.
CREATE TABLE exactly_outbox (
    id              bigserial   PRIMARY KEY,
    topic           text        NOT NULL,
    partition_key   text,
    uuid            text        NOT NULL,
    metadata        jsonb       NOT NULL DEFAULT '{}',
    payload         bytea       NOT NULL,
    lane            smallint    NOT NULL,
    status          text        NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'PUBLISHED', 'DEAD')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz
);

CREATE INDEX exactly_outbox_pending_idx ON exactly_outbox (lane, id) WHERE status = 'PENDING';
CREATE INDEX exactly_outbox_published_idx ON exactly_outbox (published_at) WHERE status = 'PUBLISHED';

-- +goose StatementBegin
CREATE FUNCTION exactly_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('exactly_outbox', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER exactly_outbox_notify AFTER INSERT ON exactly_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION exactly_outbox_notify();

-- +goose Down
DROP TABLE exactly_outbox;
DROP FUNCTION exactly_outbox_notify();
