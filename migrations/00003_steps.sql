-- Executions in steps: what a live engine needs to resume an execution that
-- reached a system outside Postgres and whose process died (I12).

-- +goose Up
ALTER TABLE idempotency_keys
    -- The registered handler that continues the execution; set with the
    -- first step's intent.
    ADD COLUMN handler text,
    -- The request it continues with; dropped once the key is finished.
    ADD COLUMN request bytea,
    -- Recovery points, by step name: {} once the step's intent is recorded,
    -- {"outcome": …} once its outcome is. NULL: no step started, so a dead
    -- holder's key is reaped (failed) rather than resumed.
    ADD COLUMN steps jsonb;

-- Until v0.9 this migration also added the demo's payments.charge_id; the
-- demo's own schema (demo/payments/schema) has it now.

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN steps, DROP COLUMN request, DROP COLUMN handler;
