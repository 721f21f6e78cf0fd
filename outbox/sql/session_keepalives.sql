-- session_keepalives: makes the server probe its client's TCP connection
-- every 5 seconds once it has been idle 5 seconds, and drop it after 3
-- unanswered probes, for the rest of the session. Sent once per
-- connection, before the first single-commit transaction on it: a client
-- host that died mid-transaction then loses its transaction, and with it
-- the key's advisory lock, within seconds (I5; the transaction's own
-- statement and idle timeouts bound it by the lease in any case). Setting
-- them per transaction instead costs every execution a dozen system calls.
SELECT set_config('tcp_keepalives_idle', '5', false),
	set_config('tcp_keepalives_interval', '5', false),
	set_config('tcp_keepalives_count', '3', false)
