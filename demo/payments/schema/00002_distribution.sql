-- Distributed Postgres (Citus, DESIGN §5): a merchant's payments on the
-- shard of its idempotency keys (the merchant is the keys' scope), so a
-- payment and its key's completion commit in one shard's transaction.
-- The primary key includes the distribution column, merchant_id, on every
-- database alike (Citus refuses one without it; ids are unique on their
-- own). With the citus extension, and the engine's tables distributed
-- (its migration 00009, run first by `api migrate up`), payments is
-- distributed by merchant_id, co-located with idempotency_keys; without
-- citus the step does nothing.

-- +goose Up
ALTER TABLE payments DROP CONSTRAINT payments_pkey, ADD PRIMARY KEY (id, merchant_id);

-- +goose StatementBegin
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
		RETURN;
	END IF;
	IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass) THEN
		PERFORM create_distributed_table('payments', 'merchant_id', colocate_with => 'idempotency_keys');
	END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
		RETURN;
	END IF;
	IF EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass) THEN
		PERFORM undistribute_table('payments');
	END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE payments DROP CONSTRAINT payments_pkey, ADD PRIMARY KEY (id);
