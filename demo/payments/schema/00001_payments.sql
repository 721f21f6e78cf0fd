-- The demo payments API's business table. Until v0.9 the engine's migration
-- 00002 created it; a database that ran it already has the table, hence
-- IF NOT EXISTS.

-- +goose Up
CREATE TABLE IF NOT EXISTS payments (
    id              text        PRIMARY KEY,
    merchant_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    amount          bigint      NOT NULL CHECK (amount BETWEEN 1 AND 99999999),
    currency        text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    customer        text        NOT NULL,
    description     text,
    status          text        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    -- The gateway's charge, recorded with the payment.
    charge_id       text,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- Deliberately not UNIQUE: exactly-once comes from the idempotency engine
-- alone, and the tests count rows here to prove it.
CREATE INDEX IF NOT EXISTS payments_merchant_key_idx ON payments (merchant_id, idempotency_key);

-- +goose Down
DROP TABLE payments;
