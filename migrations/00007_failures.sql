-- How many executions of a key ended failed in its current lifecycle: the
-- handler returned an error, panicked or answered with a status that is not
-- stored. A consumer reads it to stop redelivering a message that keeps
-- failing (onceonly.SettlePolicy.MaxFailures). Reaped leases, purges,
-- hand-offs and failures of the store do not count; a new lifecycle (the
-- row expired) starts again at 0.

-- +goose Up
ALTER TABLE idempotency_keys ADD COLUMN failures integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN failures;
