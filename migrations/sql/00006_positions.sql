-- +goose Up
-- A consumer group's committed offsets, kept with the effects they cover:
-- next_offset is the next offset of the partition to consume, written only
-- after every message below it was applied and committed. A database that
-- loses its last commits (an asynchronous standby promoted, a restore) loses
-- the positions past what it kept too, and the Subscriber starts from the
-- earlier of this and Kafka's committed offset.
CREATE TABLE exactly_positions (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    next_offset    bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);

-- +goose Down
DROP TABLE exactly_positions;
