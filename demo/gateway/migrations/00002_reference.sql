-- Distributed Postgres (Citus, DESIGN §5): on a database with the citus
-- extension the gateway's charges are a reference table (a copy on every
-- node; its unique charge_id rules out distributing it), whether the
-- gateway or `api migrate up` creates them. Without citus this does
-- nothing.

-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
	-- Two tests: pg_dist_partition exists only with citus.
	IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
		RETURN;
	END IF;
	IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'gateway.charges'::regclass) THEN
		PERFORM create_reference_table('gateway.charges');
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
	IF EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'gateway.charges'::regclass) THEN
		PERFORM undistribute_table('gateway.charges');
	END IF;
END
$$;
-- +goose StatementEnd
