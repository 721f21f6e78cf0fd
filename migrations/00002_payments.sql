-- Created the demo payments API's table until v0.9. The demo's schema now
-- lives with the demo (demo/payments/schema, run by `api migrate up`), so the
-- library creates no table of an application's. Kept, empty, so that the
-- version numbers of databases migrated before stay valid.

-- +goose Up
SELECT 1;

-- +goose Down
SELECT 1;
