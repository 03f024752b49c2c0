-- +goose Up
-- The dead letters `replay redrive` published back to their source topic,
-- one row per dead-letter record (its topic, partition and offset). The
-- row is written in the transaction that is committed once the record was
-- published, so a second redrive skips what the first one published; a
-- record published again anyway (a commit lost after the publish) carries
-- its message ID, and the worker's keys absorb it.
CREATE TABLE exactly_redrives (
    dlq_topic     text        NOT NULL,
    dlq_partition integer     NOT NULL,
    dlq_offset    bigint      NOT NULL,
    message_id    text,
    record_key    bytea,
    target_topic  text        NOT NULL,
    reason        text        NOT NULL,
    redriven_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset)
);

-- +goose Down
DROP TABLE exactly_redrives;
