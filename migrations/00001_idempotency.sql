-- The idempotency engine's tables: one row per (scope, key), and the outbox
-- that carries every state transition to the Redis cache.

-- +goose Up
CREATE TABLE idempotency_keys (
    scope                 text        NOT NULL CHECK (scope <> '' AND position(':' IN scope) = 0),
    key                   text        NOT NULL CHECK (key <> ''),
    status                text        NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed')),
    -- Bumped by every transition; the outbox event and the Redis copy carry it.
    version               bigint      NOT NULL CHECK (version > 0),
    -- Versioned digest of the request ("v1:<hex sha256>").
    fingerprint           text        NOT NULL,
    -- The execution that holds the lease; NULL once the key is completed or failed.
    owner                 uuid,
    lease_expires_at      timestamptz,
    response_status       integer,
    response_content_type text,
    response_body         bytea,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- When the row may be deleted; Redis TTLs follow it.
    expires_at            timestamptz NOT NULL,
    PRIMARY KEY (scope, key),
    CHECK ((status = 'in_progress') = (owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CHECK ((status = 'completed') = (response_status IS NOT NULL))
);

-- Retention deletes by expiry in bounded batches.
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

-- The reaper looks only at live leases.
CREATE INDEX idempotency_keys_lease_idx ON idempotency_keys (lease_expires_at)
    WHERE status = 'in_progress';

-- One row per transition, written in the transaction that made it. The relay
-- deletes a row only after Redis acknowledged it.
CREATE TABLE outbox (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope       text        NOT NULL,
    key         text        NOT NULL,
    version     bigint      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Set when an event could not be applied after several attempts; a parked
    -- event no longer blocks or slows the rest.
    attempts    integer     NOT NULL DEFAULT 0,
    parked_at   timestamptz,
    last_error  text
);

CREATE INDEX outbox_parked_idx ON outbox (id) WHERE parked_at IS NOT NULL;

-- +goose Down
DROP TABLE outbox;
DROP TABLE idempotency_keys;
