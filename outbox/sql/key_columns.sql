-- key_columns: the columns of a key, the row k, that every statement
-- returning keys selects first, in the order keyRow scans them (store.go).
-- It is no statement: a statement names it {{key_columns}}, and sql.go puts
-- these lines in its place once, when the package loads, so the statement
-- is sent whole, as if they were written out in it.
--
-- Every column reads a missing value as its zero value: the owner and lease
-- of a key nobody holds, the response of a key not completed, the whole row
-- when an outer join found none (take_batch: found says which). lease_ms and
-- expires_ms count from the statement's now(), the database's clock.
--
-- {{key_columns @max_body}} leaves out bodies longer than @max_body bytes
-- (body_omitted is then true and response_body NULL: the cache keeps a
-- marker for them). {{key_columns}} reads every body whole: @max_body
-- becomes NULL, and Postgres folds the comparisons away when it plans the
-- statement.
coalesce(k.scope, '') AS scope, coalesce(k.key, '') AS key, coalesce(k.status, '') AS status,
	coalesce(k.version, 0) AS version, coalesce(k.fingerprint, '') AS fingerprint,
	coalesce(k.owner, '00000000-0000-0000-0000-000000000000'::uuid) AS owner,
	coalesce((extract(epoch FROM k.lease_expires_at - now()) * 1000)::bigint, 0) AS lease_ms,
	coalesce(k.response_status, 0) AS response_status,
	coalesce(k.response_content_type, '') AS response_content_type,
	coalesce(k.response_headers, '') AS response_headers,
	CASE WHEN octet_length(k.response_body) > @max_body THEN NULL ELSE k.response_body END AS response_body,
	coalesce(octet_length(k.response_body) > @max_body, false) AS body_omitted,
	coalesce((extract(epoch FROM k.expires_at - now()) * 1000)::bigint, 0) AS expires_ms,
	coalesce(k.failures, 0) AS failures
