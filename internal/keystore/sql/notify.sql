-- notify: wakes the relays (LISTEN onceonly_outbox). Outside a transaction
-- it writes no WAL.
SELECT pg_notify('onceonly_outbox', '')
