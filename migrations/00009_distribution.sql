-- Distributed Postgres (Citus, docs/citus.md): every tenant's keys on one
-- shard.
--
-- Citus distributes a table by one column and refuses a primary key that
-- does not include it, so the outbox's primary key includes scope, on
-- every database alike: (id, scope) keeps the relay's walk in id order on
-- one Postgres as before (ids are unique on their own).
--
-- On a database with the citus extension (a coordinator with its workers
-- added, CREATE EXTENSION citus before `api migrate up`), the step below
-- then distributes idempotency_keys and outbox by scope, co-located (a
-- key's row and its events on one shard, so a transition is one shard's
-- transaction), makes idempotency_version_floor a reference table (a copy
-- on every node, read by the claims of every shard), and adds the index the
-- relay takes a scope's events through. Without citus it does nothing.
-- The tables are distributed inside goose's transaction: that works on
-- empty tables and moves the rows of a small one; a large database is
-- distributed by hand first (create_distributed_table), then migrated (the
-- step skips tables already distributed).

-- +goose Up
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey, ADD PRIMARY KEY (id, scope);

-- +goose StatementBegin
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
		RETURN;
	END IF;
	IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'idempotency_version_floor'::regclass) THEN
		PERFORM create_reference_table('idempotency_version_floor');
	END IF;
	IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass) THEN
		PERFORM create_distributed_table('idempotency_keys', 'scope');
	END IF;
	IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'outbox'::regclass) THEN
		CREATE INDEX outbox_scope_idx ON outbox (scope, id) WHERE parked_at IS NULL;
		PERFORM create_distributed_table('outbox', 'scope', colocate_with => 'idempotency_keys');
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
	IF EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'outbox'::regclass) THEN
		PERFORM undistribute_table('outbox');
		DROP INDEX IF EXISTS outbox_scope_idx;
	END IF;
	IF EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass) THEN
		PERFORM undistribute_table('idempotency_keys');
	END IF;
	IF EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'idempotency_version_floor'::regclass) THEN
		PERFORM undistribute_table('idempotency_version_floor');
	END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey, ADD PRIMARY KEY (id);
