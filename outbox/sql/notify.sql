-- notify: wakes the relays, which LISTEN on @channel (keystore.NotifyChannel).
-- Outside a transaction it writes no WAL.
SELECT pg_notify(@channel, '')
