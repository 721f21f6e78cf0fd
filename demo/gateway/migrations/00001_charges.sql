-- The simulated payment gateway's own schema: nothing here touches the
-- engine's tables. gateway.Migrate creates the schema first (its goose
-- version table, gateway.goose_db_version, lives in it); the statement below
-- keeps the file usable with the plain goose CLI as well.

-- +goose Up
CREATE SCHEMA IF NOT EXISTS gateway;

-- One row per Idempotency-Key. A call owns its key by inserting the row as
-- 'processing' (INSERT ... ON CONFLICT DO NOTHING) with a lease; it charges by
-- turning the row final ('succeeded' or 'declined') under its lease token, in
-- one statement, and stores the answer's exact body for replays. A row whose
-- lease ran out (its gateway process died mid-call) is taken over by the next
-- call with the key.
CREATE TABLE gateway.charges (
    idempotency_key text PRIMARY KEY
        CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    -- 'v1:' || hex(sha256(amount, currency, source, reference)): a key reused
    -- with other parameters is refused (422).
    request_hash    text NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),
    currency        text NOT NULL,
    source          text NOT NULL,
    reference       text NOT NULL,
    status          text NOT NULL
        CHECK (status IN ('processing', 'succeeded', 'declined')),
    lease_token     text,
    lease_until     timestamptz,
    charge_id       text UNIQUE,
    charged_at      timestamptz,
    response_body   text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT charges_lease_while_processing CHECK (
        (status = 'processing') = (lease_token IS NOT NULL AND lease_until IS NOT NULL)),
    CONSTRAINT charges_charged_when_final CHECK (
        (status = 'processing') = (charge_id IS NULL AND charged_at IS NULL AND response_body IS NULL))
);

-- The look-up: every final charge of a reference, in the order they were made.
CREATE INDEX charges_reference_idx ON gateway.charges (reference, charged_at, charge_id)
    WHERE status <> 'processing';

-- +goose Down
DROP TABLE gateway.charges;
