-- key_collation: whether idempotency_keys.key sorts by code point (the C,
-- POSIX or C.UTF-8 collation of the libc provider), so that the keys
-- starting with a prefix form one range of the primary key's index. Under a
-- linguistic collation (en_US.UTF-8, ICU) they do not: keys_page then
-- filters by prefix as it walks.
SELECT coalesce(bool_and(CASE
	WHEN c.collname = 'default' THEN d.datlocprovider = 'c' AND d.datcollate IN ('C', 'POSIX', 'C.UTF-8', 'C.utf8')
	ELSE c.collprovider = 'c' AND c.collcollate IN ('C', 'POSIX', 'C.UTF-8', 'C.utf8')
END), false)
FROM pg_attribute a
JOIN pg_collation c ON c.oid = a.attcollation
CROSS JOIN pg_database d
WHERE a.attrelid = 'idempotency_keys'::regclass AND a.attname = 'key' AND d.datname = current_database()
