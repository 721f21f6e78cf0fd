package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly"
)

// The key list's page size, and how many keys one page walks at most
// (sql/keys_page.sql): a filter that matches few keys still answers in
// bounded time, with fewer rows and a link to search on.
const (
	keysPerPage  = 50
	keysExamined = 2000
)

// keysPage is what the key list shows.
type keysPage struct {
	Scope, Prefix, State string
	States               []string
	Rows                 []keyListRow
	// Next is the URL of the next page ("" on the last); Cut says the
	// page ended at the walk's bound (Examined keys walked) rather than
	// full.
	Next     string
	Cut      bool
	Examined string
	// First is true on the first page; FirstURL leads back to it.
	First    bool
	FirstURL string
	// Purged names the key just purged, for the page's notice.
	Purged string
	// Problem says why the filter cannot match anything.
	Problem string
}

type keyListRow struct {
	Scope, Key, Status, URL string
	Version                 int64
	ResponseStatus          int
	Lease                   string
	Expires                 string
	Expired                 bool
	Updated                 string
}

// keyFilter is a request of the key list.
type keyFilter struct {
	scope, prefix, state    string
	afterScope, afterKey    string
	prefixEnd               string
	byCodePoint, haveCursor bool
}

// serveKeys serves the key list: filtered by scope, key prefix and state,
// in (scope, key) order, a page at a time after a cursor.
func (c *Console) serveKeys(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := keyFilter{
		scope: q.Get("scope"), prefix: q.Get("prefix"), state: q.Get("state"),
		afterScope: q.Get("after_scope"), afterKey: q.Get("after_key"),
	}
	f.haveCursor = f.afterScope != ""
	v := keysPage{
		Scope: f.scope, Prefix: f.prefix, State: f.state, States: keyStates,
		First: !f.haveCursor, Purged: q.Get("purged"),
		FirstURL: c.keysURL(f, "", ""),
	}
	if v.Problem = f.problem(); v.Problem != "" {
		c.render(w, r, http.StatusBadRequest, "keys", "Keys", v)
		return
	}
	err := c.read(r.Context(), func(ctx context.Context, rd reader) error {
		byCodePoint, err := c.keysSortByCodePoint(ctx, rd)
		if err != nil {
			return err
		}
		f.byCodePoint = byCodePoint
		return c.readKeys(ctx, rd, f, &v)
	})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "keys", "Keys", v)
}

// problem says why no key can match f ("" when one can): a state that is
// none of the three, or a scope, a key prefix or a cursor the engine would
// refuse as a scope or a key (NUL or invalid UTF-8 would also fail in
// Postgres).
func (f keyFilter) problem() string {
	switch {
	case f.state != "" && !slices.Contains(keyStates, f.state):
		return fmt.Sprintf("state %q is none of in_progress, completed, failed", f.state)
	case f.scope != "" && onceonly.ValidateScope(f.scope) != nil:
		return fmt.Sprintf("no key has scope %q: %v", f.scope, onceonly.ErrInvalidScope)
	case f.prefix != "" && onceonly.ValidateKey(f.prefix) != nil:
		return "no key starts with this prefix: keys hold 1 to 255 printable ASCII characters (0x21–0x7E)"
	case f.haveCursor && onceonly.ValidateScope(f.afterScope) != nil,
		f.afterKey != "" && onceonly.ValidateKey(f.afterKey) != nil:
		return "the page cursor (after_scope, after_key) names no key"
	}
	return ""
}

// keysSortByCodePoint reports, once per console, whether the key column
// sorts by code point (sql/key_collation.sql).
func (c *Console) keysSortByCodePoint(ctx context.Context, rd reader) (bool, error) {
	if b := c.keysByCodePoint.Load(); b != nil {
		return *b, nil
	}
	var b bool
	if err := rd.queryRow(ctx, keyCollationSQL, nil).Scan(&b); err != nil {
		return false, fmt.Errorf("read the key column's collation: %w", err)
	}
	c.keysByCodePoint.Store(&b)
	return b, nil
}

// readKeys reads one page of the key list into v.
func (c *Console) readKeys(ctx context.Context, rd reader, f keyFilter, v *keysPage) error {
	after := [2]string{f.afterScope, f.afterKey}
	if !f.haveCursor && f.scope != "" {
		after = [2]string{f.scope, ""} // the scope's first key, through the index
	}
	if f.byCodePoint && f.prefix != "" {
		// The strings that start with prefix lie in [prefix, prefixEnd):
		// a prefix holds printable ASCII only (checked), so its last byte
		// has a successor.
		end := []byte(f.prefix)
		end[len(end)-1]++
		f.prefixEnd = string(end)
	}
	rows, err := rd.query(ctx, keysPageSQL, pgx.NamedArgs{
		"after_scope": after[0], "after_key": after[1], paramScope: f.scope, "prefix": f.prefix,
		"prefix_end": f.prefixEnd, "state": f.state, "examine": keysExamined, paramLimit: keysPerPage + 1,
	})
	if err != nil {
		return fmt.Errorf("list keys: %w", err)
	}
	defer rows.Close()
	var last struct {
		scope, key string
		n          int64
	}
	read := 0
	for rows.Next() {
		var row keyListRow
		var leaseMs, expiresMs, updatedMs, n int64
		var matched bool
		if err := rows.Scan(&row.Scope, &row.Key, &row.Status, &row.Version, &row.ResponseStatus,
			&leaseMs, &expiresMs, &updatedMs, &n, &matched); err != nil {
			return fmt.Errorf("list keys: %w", err)
		}
		read++
		last.scope, last.key, last.n = row.Scope, row.Key, n
		if !matched || len(v.Rows) == keysPerPage {
			continue
		}
		if row.Status == string(onceonly.StatusInProgress) {
			row.Lease = relative(leaseMs)
		}
		row.Expires, row.Expired, row.Updated = relative(expiresMs), expiresMs <= 0, span(updatedMs)+" ago"
		row.URL = c.keyURL(row.Scope, row.Key)
		v.Rows = append(v.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list keys: %w", err)
	}
	switch {
	case read > keysPerPage: // a row past a full page: more follow the page's last
		end := v.Rows[len(v.Rows)-1]
		v.Next = c.keysURL(f, end.Scope, end.Key)
	case last.n == keysExamined: // the walk's bound: more may follow the last key walked
		v.Next, v.Cut, v.Examined = c.keysURL(f, last.scope, last.key), true, count(keysExamined)
	}
	return nil
}

// keysURL returns the key list's URL for filter f after the cursor
// (afterScope, afterKey), the first page when afterScope is "".
func (c *Console) keysURL(f keyFilter, afterScope, afterKey string) string {
	q := url.Values{}
	for name, value := range map[string]string{paramScope: f.scope, "prefix": f.prefix, "state": f.state, "after_scope": afterScope, "after_key": afterKey} {
		if value != "" {
			q.Set(name, value)
		}
	}
	if len(q) == 0 {
		return c.prefix + "/keys"
	}
	return c.prefix + "/keys?" + q.Encode()
}
