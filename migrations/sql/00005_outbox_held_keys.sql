-- +goose Up
-- The relay publishes only a key's first pending row, and a key whose first
-- row failed (waiting for its next attempt) or went DEAD is held: its later
-- rows wait, other keys' rows are read past them. This index holds exactly
-- the rows that hold a key (few), so the relay finds held keys without
-- reading the pending backlog, and finds when the next retry is due.
CREATE INDEX exactly_outbox_held_idx ON exactly_outbox (lane, partition_key)
    WHERE status = 'DEAD' OR (status = 'PENDING' AND attempts > 0);

-- +goose Down
DROP INDEX exactly_outbox_held_idx;
