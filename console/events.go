package console

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// eventsPerPage is the length of a page of parked events.
const eventsPerPage = 100

// eventsPage is what the parked events page shows.
type eventsPage struct {
	Events []eventRow
	// Next is the URL of the next page ("" on the last).
	Next  string
	First bool
	// Unparked reports an unpark just made ("" none).
	Unparked string
}

type eventRow struct {
	ID                  int64
	Scope, Key          string
	Version             int64
	Attempts            int
	LastError           string
	Age, ParkedAgo, URL string
}

// serveEvents serves the parked outbox events, oldest first, a page at a
// time after an id.
func (c *Console) serveEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after, _ := strconv.ParseInt(q.Get("after"), 10, 64)
	v := eventsPage{First: after == 0}
	if n := q.Get("unparked"); n != "" {
		v.Unparked = n + " event(s) back in the relay's queue."
	}
	err := c.read(r.Context(), func(ctx context.Context, rd reader) error {
		rows, err := rd.query(ctx, parkedEventsSQL, pgx.NamedArgs{"after": after, paramLimit: eventsPerPage + 1})
		if err != nil {
			return fmt.Errorf("read parked events: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var e eventRow
			var ageMs, parkedMs int64
			if err := rows.Scan(&e.ID, &e.Scope, &e.Key, &e.Version, &e.Attempts, &e.LastError, &ageMs, &parkedMs); err != nil {
				return fmt.Errorf("read parked events: %w", err)
			}
			e.Age, e.ParkedAgo, e.URL = span(ageMs), span(parkedMs), c.keyURL(e.Scope, e.Key)
			v.Events = append(v.Events, e)
		}
		return rows.Err()
	})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if len(v.Events) > eventsPerPage {
		v.Events = v.Events[:eventsPerPage]
		v.Next = c.prefix + "/events?after=" + strconv.FormatInt(v.Events[eventsPerPage-1].ID, 10)
	}
	c.render(w, r, http.StatusOK, "events", "Parked events", v)
}

// serveUnpark puts the parked events named by the form's ids back in the
// relay's queue (Engine.Unpark).
func (c *Console) serveUnpark(w http.ResponseWriter, r *http.Request) {
	var ids []int64
	for _, s := range r.PostForm["ids"] {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			http.Error(w, fmt.Sprintf("400 bad request: event id %q is not a number", s), http.StatusBadRequest)
			return
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		http.Error(w, "400 bad request: no event chosen", http.StatusBadRequest)
		return
	}
	n, err := c.cfg.Engine.Unpark(r.Context(), ids)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.log.Info("console: outbox events unparked", "user", userOf(r), "asked", len(ids), "unparked", n)
	http.Redirect(w, r, c.prefix+"/events?unparked="+strconv.Itoa(n), http.StatusSeeOther)
}
