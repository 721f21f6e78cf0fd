-- citus_installed: whether the database has the citus extension. Only then
-- may citus_distributed, which reads Citus's catalog, run.
SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')
