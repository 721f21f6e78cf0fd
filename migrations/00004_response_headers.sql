-- The headers a handler set besides Content-Type (Location, ETag…), stored
-- with its response and replayed (I2), as "Name: value" lines.

-- +goose Up
ALTER TABLE idempotency_keys ADD COLUMN response_headers text;

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN response_headers;
