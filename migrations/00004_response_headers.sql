-- The headers a handler set besides Content-Type (Location, ETag…), stored
-- with its response and replayed (every replay is the first answer), as
-- "Name: value" lines.

-- +goose Up
ALTER TABLE idempotency_keys ADD COLUMN response_headers text;

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN response_headers;
