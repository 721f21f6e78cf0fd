-- citus_distributed: whether idempotency_keys is distributed (Citus,
-- migration 00009): the store then runs its statements shard by shard.
SELECT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass)
