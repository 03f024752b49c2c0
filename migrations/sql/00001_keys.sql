-- +goose Up
CREATE TABLE exactly_keys (
    scope            text        NOT NULL,
    key              text        NOT NULL,
    fingerprint      char(64)    NOT NULL,
    status           text        NOT NULL CHECK (status IN ('PROCESSING', 'COMPLETED')),
    result           bytea,
    attempts         integer     NOT NULL DEFAULT 1,
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    locked_until     timestamptz,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX exactly_keys_expires_at_idx ON exactly_keys (expires_at);

-- +goose Down
DROP TABLE IF EXISTS exactly_keys;
