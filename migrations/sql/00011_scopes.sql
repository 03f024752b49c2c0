-- +goose Up
-- The consumer group that consumes a scope's commands on a topic
-- (worker.Config.Scope, Topic and Group; pgstore.Store.RegisterScope). A
-- second group with the same scope on the same topic would find every key
-- the first stored and skip its commands as duplicates, so a worker of
-- another group refuses to start, unless it takes the scope over on
-- purpose (worker.Config.TakeOver; a rebuild: docs/rebuild.md).
CREATE TABLE exactly_scopes (
    scope          text        NOT NULL,
    topic          text        NOT NULL,
    consumer_group text        NOT NULL,
    since          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, topic)
);

-- +goose Down
DROP TABLE exactly_scopes;
