-- +goose Up
-- A redrive whose publish failed or outlived its deadline may have reached
-- the broker anyway: it is recorded with state 'uncertain', so a second
-- redrive does not publish the letter again unless the operator forces it
-- (replay redrive --force, the console's Force button). A letter is keyed
-- by its message ID too: a dead-letter topic deleted and created again
-- numbers its records from 0 again, and a new letter at the offset of one
-- redriven before is another letter.
ALTER TABLE exactly_redrives ADD COLUMN state text NOT NULL DEFAULT 'published'
    CHECK (state IN ('published', 'uncertain'));
UPDATE exactly_redrives SET message_id = '' WHERE message_id IS NULL;
ALTER TABLE exactly_redrives ALTER COLUMN message_id SET DEFAULT '',
    ALTER COLUMN message_id SET NOT NULL,
    DROP CONSTRAINT exactly_redrives_pkey,
    ADD PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset, message_id);

-- +goose Down
DELETE FROM exactly_redrives r WHERE EXISTS (SELECT 1 FROM exactly_redrives o
    WHERE o.dlq_topic = r.dlq_topic AND o.dlq_partition = r.dlq_partition AND o.dlq_offset = r.dlq_offset
      AND o.redriven_at > r.redriven_at);
ALTER TABLE exactly_redrives DROP CONSTRAINT exactly_redrives_pkey,
    ADD PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset),
    ALTER COLUMN message_id DROP NOT NULL,
    ALTER COLUMN message_id DROP DEFAULT,
    DROP COLUMN state;
UPDATE exactly_redrives SET message_id = NULL WHERE message_id = '';
