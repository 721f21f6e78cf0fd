-- The version floor: at least the highest version any deleted key reached.
-- A key created again starts above it, so a key's versions never repeat,
-- even across its deletion, and a copy of its earlier life (in Redis, in an
-- old event) is always older than its current row.

-- +goose Up
CREATE TABLE idempotency_version_floor (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   bigint  NOT NULL CHECK (version >= 0)
);

-- Keys deleted before this migration left no trace; the highest version
-- still known is the best floor there is.
INSERT INTO idempotency_version_floor (version)
SELECT greatest((SELECT max(version) FROM idempotency_keys), (SELECT max(version) FROM outbox), 0);

-- +goose Down
DROP TABLE idempotency_version_floor;
