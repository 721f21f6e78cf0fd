-- The business table of the engine's own tests: what an application's
-- handler writes in the key's transaction (the tests count its rows to
-- prove each effect happened once). The engine's migrations create no
-- business table; oncetest.AlsoMigrate adds this one to every test
-- database of the root package.

-- +goose Up
CREATE TABLE payments (
    id              text        PRIMARY KEY,
    merchant_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    amount          bigint      NOT NULL CHECK (amount BETWEEN 1 AND 99999999),
    currency        text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    customer        text        NOT NULL,
    description     text,
    status          text        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    charge_id       text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payments_merchant_key_idx ON payments (merchant_id, idempotency_key);

-- +goose Down
DROP TABLE payments;
