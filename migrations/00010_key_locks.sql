-- One mutual exclusion per key, taken by every way of running an execution:
-- a transaction-scoped advisory lock whose id no caller can aim.
--
-- Every execution takes its key's lock before it reads or writes the key's
-- row: a one-commit execution holds it for its whole transaction, a
-- two-phase claim, a takeover, a claim batch, a resumption and a claim in a
-- caller's transaction (DoTx, DoSQLTx) for the transaction that writes the
-- claim. So two executions of one key never run at once, whatever their
-- modes.
--
-- The lock's id is keyed: the first 32 bits of SHA-256(secret || scope ':'
-- key), with a secret made here, once per database, from Postgres's strong
-- random source (gen_random_uuid). Without the secret nobody can compute
-- which keys share a lock, so no tenant can pick a key whose lock is
-- another tenant's. The lock lives in a class of its own: the two-integer
-- form of the advisory lock functions, class 1330529093 ('ONCE' in ASCII),
-- a space apart from every single-bigint advisory lock (the reconciler's
-- and the gateway's, and most applications' own). Two keys share a lock
-- with odds of 1 in 2^32: the only effect is a 409 to one of them while the
-- other runs.
--
-- Replace the secret only while no execution runs (it changes every key's
-- lock).

-- +goose Up
CREATE TABLE idempotency_lock_secret (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret   bytea   NOT NULL CHECK (length(secret) >= 16)
);

INSERT INTO idempotency_lock_secret (secret)
SELECT decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex');

-- The lock id of a key (pg_locks shows it as objid, with classid 1330529093
-- and objsubid 2). The engine computes the same id itself, from the secret
-- it reads once, and sends it with its statements; this function serves
-- the statements that find their keys by a query (the resumer's) and
-- operators.
-- +goose StatementBegin
CREATE FUNCTION onceonly_key_lock_id(scope text, key text) RETURNS integer
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    s bytea;
BEGIN
    SELECT secret INTO STRICT s FROM idempotency_lock_secret;
    RETURN ('x' || encode(substr(sha256(s || convert_to(scope || ':' || key, 'UTF8')), 1, 4), 'hex'))::bit(32)::integer;
END
$$;
-- +goose StatementEnd

-- Raised by a claim whose key's lock another transaction holds: an
-- execution of the key is under way (SQLSTATE OO002).
-- +goose StatementBegin
CREATE FUNCTION onceonly_key_busy(scope text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'onceonly: key %:% is held by another execution', scope, key
        USING ERRCODE = 'OO002';
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION onceonly_key_busy(text, text);
DROP FUNCTION onceonly_key_lock_id(text, text);
DROP TABLE idempotency_lock_secret;
