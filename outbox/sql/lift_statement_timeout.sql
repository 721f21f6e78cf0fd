-- lift_statement_timeout: lifts statement_timeout for the caller's
-- transaction, before a statement that runs as long as it is read (the
-- reconciler's scan_live streams the whole table).
SELECT set_config('statement_timeout', '0', true)
