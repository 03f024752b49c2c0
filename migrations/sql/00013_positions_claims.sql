-- +goose Up
-- Who owns a partition's position: a Subscriber that is assigned a
-- partition claims it (epoch + 1) as it loads the position, and each of its
-- saves carries the epoch it claimed. A save whose epoch is below the
-- partition's (another member claimed the partition since: this one lost it
-- without knowing it, cut off from Kafka or paused past its session)
-- stores nothing for it. An epoch is above the last one and at least the
-- clock in microseconds: a database that went back in time holds an older
-- epoch, which refuses no save of the members running, and a claim made
-- after it is still above every claim made before.
CREATE TABLE exactly_positions_claims (
    consumer_group text        NOT NULL,
    topic          text        NOT NULL,
    partition      integer     NOT NULL,
    epoch          bigint      NOT NULL CHECK (epoch > 0),
    claimed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);

-- The roles that save positions claim them too: the claims get the owner
-- of exactly_positions (when the role migrating may give it: a member of
-- that role, as a migrator may be, or the owner itself), and every grant
-- on exactly_positions is made on the claims as well, so an upgrade needs
-- no new grant.
-- +goose StatementBegin
DO $$
DECLARE
    g text;
    owner name;
BEGIN
    SELECT pg_get_userbyid(c.relowner) INTO owner FROM pg_class c
    WHERE c.oid = format('%I.exactly_positions', current_schema())::regclass;
    IF owner <> current_user AND pg_has_role(current_user, owner, 'MEMBER') THEN
        EXECUTE format('ALTER TABLE %I.exactly_positions_claims OWNER TO %I', current_schema(), owner);
    END IF;
    FOR g IN
        SELECT format('GRANT %s ON %I.exactly_positions_claims TO %s', a.privilege_type, current_schema(),
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END)
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
        WHERE c.oid = format('%I.exactly_positions', current_schema())::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE g;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE exactly_positions_claims;
