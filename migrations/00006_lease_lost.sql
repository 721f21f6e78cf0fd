-- A completion sent in one round trip with its COMMIT must fail, not return
-- no row, when the execution lost its key: after a failed statement Postgres
-- skips the rest of the pipeline, COMMIT included, so the business writes of
-- an execution whose lease was taken over never commit (see finish.sql).

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION onceonly_lease_lost(scope text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'onceonly: lease lost on %:%: the key is no longer held by this execution', scope, key
        USING ERRCODE = 'OO001';
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION onceonly_lease_lost(text, text);
