package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly"
)

// maxShown is the most of a body or request the key page shows.
const maxShown = 64 << 10

// The agreement of a key's Redis value with its Postgres row, as the key
// page's data-sync attribute says it.
const (
	syncInSync  = "in_sync"
	syncMissing = "missing"
	syncDiffers = "differs"
)

// keyPage is what the key page shows.
type keyPage struct {
	Scope, Key string
	// Sync is in_sync, missing or differs; SyncText says it for people.
	// Drift names how a differing value differs, in the reconciler's
	// words (stale, wrong_state, corrupt, orphaned; in_flight for a claim
	// Postgres has not heard of yet, unknown when Redis could not be read).
	Sync, SyncText, Drift string
	// Fields are the row and the value side by side.
	Fields []fieldRow
	// InPostgres and InRedis say whether each side holds the key (a live
	// row; a value); RedisNote explains a Redis side that is not shown.
	InPostgres, RowExpired, InRedis bool
	RedisNote                       string
	// Response is the stored response (Postgres's); RedisResponse is the
	// Redis copy's when it differs from it.
	Response, RedisResponse *responseView
	Steps                   []stepView
	Handler                 string
	Request                 *blob
	StoredRequest           *storedRequestView
	Times                   []fieldRow
	// InProgress asks the purge for force.
	InProgress bool
	// CanRepair is true when Redis disagrees with Postgres.
	CanRepair bool
	// Repaired reports a repair just made ("" none).
	Repaired string
	// URL is the page's own path.
	URL string
}

// fieldRow is one line of a side-by-side table.
type fieldRow struct {
	Name, Postgres, Redis string
	Differs               bool
}

type responseView struct {
	Status      int
	ContentType string
	Headers     []headerLine
	Body        *blob
	// BodyInPostgres marks a Redis copy that keeps only a marker of its
	// large body.
	BodyInPostgres bool
	// Redacted is true when the body is not shown (Config.Redact).
	Redacted bool
}

type headerLine struct{ Name, Value string }

// blob is a stored body or request as the page shows it: text (indented
// when JSON) or a hex dump, at most maxShown bytes.
type blob struct {
	Size      string
	Text      string
	Binary    bool
	Truncated bool
	Empty     bool
}

type stepView struct {
	Name, DownstreamKey string
	// Settled is true once the step's outcome is recorded; Outcome is it
	// (as JSON).
	Settled bool
	Outcome *blob
}

// storedRequestView is the HTTP request the middleware keeps for a
// resumption, decoded.
type storedRequestView struct {
	Method, URI string
	Headers     []headerLine
	Body        *blob
}

// storedRequest is the middleware's encoding of a request kept for a
// resumption (onceonly's middleware.go): JSON, the body in base64.
type storedRequest struct {
	Method string              `json:"method"`
	URI    string              `json:"uri"`
	Header map[string][]string `json:"header"`
	Body   []byte              `json:"body"`
}

// keyDetail is what sql/key_detail.sql reads.
type keyDetail struct {
	created, updated, dbNow time.Time
	leaseUntil              *time.Time
	expires                 time.Time
	handler                 string
	request                 []byte
	steps                   string
	contentType             string
	bodySize                int
}

// serveKey serves one key: its Postgres row and its Redis value side by
// side.
func (c *Console) serveKey(w http.ResponseWriter, r *http.Request) {
	scope, key, ok := c.refOf(w, r)
	if !ok {
		return
	}
	v, found, err := c.readKey(r.Context(), scope, key)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if !found {
		c.notFound(w, r, fmt.Sprintf("No key %s in scope %s: neither Postgres nor Redis holds it.", key, scope))
		return
	}
	switch r.URL.Query().Get("repaired") {
	case "1":
		v.Repaired = "Redis now holds the Postgres state."
	case "0":
		v.Repaired = "Nothing to repair: Redis was in step (or a request in flight holds the key)."
	}
	c.render(w, r, http.StatusOK, "key", key, v)
}

// readKey reads (scope, key) on both sides; found is false when neither
// holds it.
func (c *Console) readKey(ctx context.Context, scope, key string) (keyPage, bool, error) {
	v := keyPage{Scope: scope, Key: key, URL: c.keyURL(scope, key)}
	in, err := c.cfg.Engine.Inspect(ctx, scope, key)
	if err != nil {
		return v, false, fmt.Errorf("inspect key: %w", err)
	}
	var d keyDetail
	var found bool
	if in.Postgres != nil {
		err := c.read(ctx, func(ctx context.Context, rd reader) error {
			var err error
			d, found, err = readDetail(ctx, rd, scope, key)
			return err
		})
		if err != nil {
			return v, false, err
		}
	}
	if in.Postgres == nil && !in.RedisFound {
		return v, false, nil
	}
	var detail *keyDetail
	if found {
		detail = &d
	}
	c.describe(&v, in, detail)
	return v, true, nil
}

// readDetail reads what sql/key_detail.sql reads of a key; found is false
// when its row went since Inspect read it.
func readDetail(ctx context.Context, rd reader, scope, key string) (d keyDetail, found bool, err error) {
	err = rd.queryRow(ctx, keyDetailSQL, pgx.NamedArgs{paramScope: scope, paramKey: key}).Scan(
		&d.created, &d.updated, &d.leaseUntil, &d.expires, &d.dbNow, &d.handler, &d.request, &d.steps,
		&d.contentType, &d.bodySize)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return d, false, nil
	case err != nil:
		return d, false, fmt.Errorf("read key: %w", err)
	}
	return d, true, nil
}

// describe fills v from an inspection and the row's detail (nil when the
// row went in between).
func (c *Console) describe(v *keyPage, in onceonly.Inspection, d *keyDetail) {
	pg, rd := in.Postgres, in.Redis
	v.InPostgres = pg != nil && pg.ExpiresIn > 0
	v.RowExpired = pg != nil && pg.ExpiresIn <= 0
	v.InRedis = in.RedisFound
	v.Sync, v.Drift, v.SyncText = syncOf(in)
	v.CanRepair = in.RedisEnabled && v.Sync != syncInSync && (in.RedisErr == nil || in.RedisFound) // not when Redis cannot be read
	switch {
	case !in.RedisEnabled:
		v.RedisNote = "The engine runs without Redis."
	case in.RedisErr != nil && !in.RedisFound:
		v.RedisNote = "Redis could not be read: " + in.RedisErr.Error()
	case in.RedisErr != nil:
		v.RedisNote = "Redis holds a value that does not decode: " + in.RedisErr.Error()
	case !in.RedisFound:
		v.RedisNote = "Redis holds no value for this key."
	}
	field := func(name, p, r string) {
		v.Fields = append(v.Fields, fieldRow{Name: name, Postgres: p, Redis: r, Differs: pg != nil && rd != nil && p != r})
	}
	var pState, rState, pVersion, rVersion, pOwner, rOwner, pStatus, rStatus string
	if pg != nil {
		pState, pVersion, pOwner = string(pg.Status), strconv.FormatInt(pg.Version, 10), pg.Owner
		if pg.Status == onceonly.StatusCompleted {
			pStatus = strconv.Itoa(statusOf(pg.Response))
		}
		v.InProgress = pg.Status == onceonly.StatusInProgress
	}
	if rd != nil {
		rState, rVersion, rOwner = string(rd.Status), strconv.FormatInt(rd.Version, 10), rd.Owner
		if rd.Status == onceonly.StatusCompleted {
			rStatus = strconv.Itoa(statusOf(rd.Response))
		}
	}
	field("state", pState, rState)
	field("version", pVersion, rVersion)
	field("owner", pOwner, rOwner)
	field("stored status", pStatus, rStatus)
	var pFingerprint, pLease, rLease, pExpiry, rTTL, pFailures string
	if pg != nil {
		pFingerprint, pFailures = pg.Fingerprint, strconv.Itoa(pg.Failures)
		if pg.Status == onceonly.StatusInProgress {
			pLease = relative(pg.LeaseRemaining.Milliseconds())
		}
		pExpiry = relative(pg.ExpiresIn.Milliseconds())
	}
	if rd != nil && rd.LeaseRead {
		rLease = relative(rd.LeaseRemaining.Milliseconds())
	}
	if in.RedisFound && in.RedisTTL > 0 {
		rTTL = "in " + span(in.RedisTTL.Milliseconds())
	}
	if rd != nil && rd.Provisional {
		v.Fields = append(v.Fields, fieldRow{Name: "provisional", Redis: "a claim Redis made for a request in flight; Postgres has not confirmed it yet"})
	}
	v.Fields = append(v.Fields,
		fieldRow{Name: "fingerprint", Postgres: pFingerprint, Redis: digestNote(rd)},
		fieldRow{Name: "lease", Postgres: pLease, Redis: rLease},
		fieldRow{Name: "failed executions", Postgres: pFailures},
		fieldRow{Name: "expiry", Postgres: pExpiry, Redis: rTTL,
			Differs: pg != nil && rd != nil && !closeDurations(pg.ExpiresIn, in.RedisTTL)})

	if pg != nil && pg.Status == onceonly.StatusCompleted {
		v.Response = c.responseOf(pg.Response, false)
	}
	if rd != nil && rd.Status == onceonly.StatusCompleted {
		rr := c.responseOf(rd.Response, rd.BodyInPostgres)
		if v.Response == nil || !sameResponse(pg.Response, rd.Response, rd.BodyInPostgres) {
			v.RedisResponse = rr
		}
	}
	if d != nil {
		c.describeDetail(v, d)
	}
}

// The kinds of drift the key page names, as the reconciler counts them
// (reconcile.Report), and the two that are not drift.
const (
	driftStale      = "stale"
	driftWrongState = "wrong_state"
	driftCorrupt    = "corrupt"
	driftOrphaned   = "orphaned"
	driftInFlight   = "in_flight"
	driftUnknown    = "unknown"
)

// syncOf judges the agreement of Redis with Postgres, as Inspection.InSync
// does: in_sync, missing (a live row, no Redis value) or differs, and for
// differs, how, as the reconciler classifies it (reconcile's compare).
func syncOf(in onceonly.Inspection) (sync, drift, text string) {
	live := in.Postgres != nil && in.Postgres.ExpiresIn > 0
	pg, rd := in.Postgres, in.Redis
	switch {
	case !in.RedisEnabled:
		return syncMissing, "", "No Redis: the engine runs from Postgres alone."
	case in.RedisErr != nil && !in.RedisFound:
		return syncDiffers, driftUnknown, "Unknown: Redis could not be read."
	case in.InSync() && live:
		return syncInSync, "", "In sync: Redis holds the Postgres state and version."
	case in.InSync():
		return syncInSync, "", "In sync: no live row, and no Redis value."
	case live && !in.RedisFound:
		return syncMissing, "", "Missing: Postgres holds a live row, Redis no value (a request reads Postgres; the relay or the next reconcile pass writes it)."
	case !live:
		return syncDiffers, driftOrphaned, "Differs (orphaned): Redis holds a value for a key Postgres no longer has."
	case rd == nil:
		return syncDiffers, driftCorrupt, "Differs (corrupt): Redis holds a value that does not decode."
	case rd.Provisional && rd.Version == pg.Version:
		return syncDiffers, driftInFlight, "In flight: Redis holds a claim a request made that Postgres has not confirmed yet (not drift: Postgres hears of it next)."
	case rd.Version != pg.Version:
		return syncDiffers, driftStale, fmt.Sprintf("Differs (stale): Redis holds version %d, Postgres version %d.", rd.Version, pg.Version)
	}
	return syncDiffers, driftWrongState, fmt.Sprintf("Differs (wrong state): Redis holds %s, Postgres %s, at the same version.", rd.Status, pg.Status)
}

// digestNote is what the key page says of the Redis copy's fingerprint:
// Redis keeps only a digest of it.
func digestNote(rd *onceonly.CachedKey) string {
	if rd == nil {
		return ""
	}
	return "kept as a digest"
}

// closeDurations reports whether a row's expiry and a Redis TTL agree to
// within the time between the two reads.
func closeDurations(a, b time.Duration) bool {
	d := a - b
	return d < 2*time.Second && d > -2*time.Second
}

// statusOf is a stored response's status; 0 stands for 200.
func statusOf(r onceonly.Result) int {
	if r.Status == 0 {
		return http.StatusOK
	}
	return r.Status
}

func sameResponse(p, r onceonly.Result, bodyInPostgres bool) bool {
	if statusOf(p) != statusOf(r) || p.ContentType != r.ContentType || !equalHeaders(p.Header, r.Header) {
		return false
	}
	return bodyInPostgres || bytes.Equal(p.Body, r.Body)
}

func equalHeaders(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for name, values := range a {
		if !slices.Equal(values, b[name]) {
			return false
		}
	}
	return true
}

// responseOf is a stored response as the page shows it; with Redact its
// body is left out.
func (c *Console) responseOf(r onceonly.Result, bodyInPostgres bool) *responseView {
	v := &responseView{
		Status: statusOf(r), ContentType: r.ContentType, Headers: headerLines(r.Header),
		BodyInPostgres: bodyInPostgres, Redacted: c.cfg.Redact,
	}
	if !c.cfg.Redact && !bodyInPostgres {
		v.Body = blobOf(r.Body)
	}
	return v
}

func headerLines(h http.Header) []headerLine {
	var lines []headerLine
	for name, values := range h {
		for _, value := range values {
			lines = append(lines, headerLine{Name: name, Value: value})
		}
	}
	slices.SortStableFunc(lines, func(a, b headerLine) int { return cmp.Compare(a.Name, b.Name) })
	return lines
}

// describeDetail adds the row's times, handler, request and steps.
func (c *Console) describeDetail(v *keyPage, d *keyDetail) {
	at := func(t time.Time) string {
		return t.UTC().Format(time.RFC3339) + " (" + relative(t.Sub(d.dbNow).Milliseconds()) + ")"
	}
	v.Times = []fieldRow{{Name: "created", Postgres: at(d.created)}, {Name: "updated", Postgres: at(d.updated)}}
	if d.leaseUntil != nil {
		v.Times = append(v.Times, fieldRow{Name: "lease ends", Postgres: at(*d.leaseUntil)})
	}
	v.Times = append(v.Times, fieldRow{Name: "expires", Postgres: at(d.expires)})
	v.Handler = d.handler
	if d.request != nil && !c.cfg.Redact {
		var sr storedRequest
		if json.Unmarshal(d.request, &sr) == nil && sr.Method != "" {
			v.StoredRequest = &storedRequestView{Method: sr.Method, URI: sr.URI, Headers: headerLines(sr.Header), Body: blobOf(sr.Body)}
		} else {
			v.Request = blobOf(d.request)
		}
	}
	if d.steps == "" {
		return
	}
	var steps map[string]struct {
		Outcome json.RawMessage `json:"outcome"`
	}
	if err := json.Unmarshal([]byte(d.steps), &steps); err != nil {
		v.Steps = []stepView{{Name: "(steps do not decode: " + err.Error() + ")"}}
		return
	}
	for name, s := range steps {
		sv := stepView{Name: name, DownstreamKey: onceonly.DownstreamKey(v.Scope, v.Key, name), Settled: s.Outcome != nil}
		if sv.Settled && !c.cfg.Redact {
			sv.Outcome = blobOf(s.Outcome)
		}
		v.Steps = append(v.Steps, sv)
	}
	slices.SortFunc(v.Steps, func(a, b stepView) int { return cmp.Compare(a.Name, b.Name) })
}

// blobOf prepares b for the page: UTF-8 text as it is (JSON indented), other
// bytes as a hex dump, at most maxShown bytes either way.
func blobOf(b []byte) *blob {
	v := &blob{Size: byteSize(len(b)), Empty: len(b) == 0}
	if len(b) > maxShown {
		b, v.Truncated = b[:maxShown], true
	}
	switch {
	case utf8.Valid(b):
		var indented bytes.Buffer
		if !v.Truncated && json.Valid(b) && json.Indent(&indented, b, "", "  ") == nil {
			v.Text = indented.String()
		} else {
			v.Text = string(b)
		}
	default:
		v.Text, v.Binary = hex.Dump(b), true
	}
	return v
}

// keyURL returns the key page's path: the scope and the key one path
// segment each, percent-encoded (pathSegment).
func (c *Console) keyURL(scope, key string) string {
	return c.prefix + "/keys/" + pathSegment(scope) + "/" + pathSegment(key)
}

// pathSegment percent-encodes s as one path segment. A scope or a key "."
// or ".." would be a dot segment, which clients resolve and ServeMux
// cleans away (redirecting to the parent path): it is encoded whole
// (%2E), which Go's clients and ServeMux (it matches on the escaped path)
// leave alone. Browsers resolve %2E too (the WHATWG URL standard).
func pathSegment(s string) string {
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}

// refOf returns the scope and the key of a key's path, checked as the
// engine checks them (onceonly.ValidateScope, onceonly.ValidateKey): a
// scope with ':' would name another key's Redis value, NUL or invalid
// UTF-8 would fail in Postgres. ok is false once it has answered 400.
func (c *Console) refOf(w http.ResponseWriter, r *http.Request) (scope, key string, ok bool) {
	scope, key = r.PathValue("scope"), r.PathValue("key")
	if err := onceonly.ValidateScope(scope); err != nil {
		c.badRequest(w, r, fmt.Sprintf("Scope %q: %v.", scope, err))
		return "", "", false
	}
	if err := onceonly.ValidateKey(key); err != nil {
		c.badRequest(w, r, fmt.Sprintf("Key %q: %v.", key, err))
		return "", "", false
	}
	return scope, key, true
}

// purgePage is what the purge confirmation shows.
type purgePage struct {
	Scope, Key, URL string
	InProgress      bool
	Problem         string
}

// servePurgeConfirm asks for the purge's confirmation. It changes nothing.
func (c *Console) servePurgeConfirm(w http.ResponseWriter, r *http.Request) {
	if c.cfg.ReadOnly {
		http.Error(w, "403 forbidden: the console is read-only (CONSOLE_READONLY)", http.StatusForbidden)
		return
	}
	scope, key, ok := c.refOf(w, r)
	if !ok {
		return
	}
	in, err := c.cfg.Engine.Inspect(r.Context(), scope, key)
	if err != nil {
		c.fail(w, r, fmt.Errorf("inspect key: %w", err))
		return
	}
	if in.Postgres == nil {
		c.notFound(w, r, fmt.Sprintf("No key %s in scope %s in Postgres: nothing to purge.", key, scope))
		return
	}
	c.render(w, r, http.StatusOK, "purge", "Purge "+key, purgePage{
		Scope: scope, Key: key, URL: c.keyURL(scope, key), InProgress: in.Postgres.Status == onceonly.StatusInProgress,
	})
}

// servePurge purges a key (Engine.Delete): its row is deleted and its Redis
// value with it, once confirmed.
func (c *Console) servePurge(w http.ResponseWriter, r *http.Request) {
	scope, key, ok := c.refOf(w, r)
	if !ok {
		return
	}
	page := purgePage{Scope: scope, Key: key, URL: c.keyURL(scope, key), InProgress: r.PostFormValue("force") != ""}
	if r.PostFormValue("confirm") != "yes" {
		page.Problem = "Confirm the purge first."
		c.render(w, r, http.StatusBadRequest, "purge", "Purge "+key, page)
		return
	}
	err := c.cfg.Engine.Delete(r.Context(), scope, key, r.PostFormValue("force") == "yes")
	switch {
	case errors.Is(err, onceonly.ErrKeyInProgress):
		page.InProgress, page.Problem = true, "The key is in progress: tick the box to purge it anyway."
		c.render(w, r, http.StatusConflict, "purge", "Purge "+key, page)
		return
	case errors.Is(err, onceonly.ErrNoSuchKey):
		c.notFound(w, r, fmt.Sprintf("No key %s in scope %s in Postgres: nothing to purge.", key, scope))
		return
	case err != nil:
		c.fail(w, r, err)
		return
	}
	c.log.Info("console: key purged", "user", userOf(r), "scope", scope, "key", key)
	http.Redirect(w, r, c.prefix+"/keys?"+url.Values{"scope": {scope}, "purged": {key}}.Encode(), http.StatusSeeOther)
}

// serveRepair writes the key's Postgres state into Redis
// (Engine.RepairCache).
func (c *Console) serveRepair(w http.ResponseWriter, r *http.Request) {
	scope, key, ok := c.refOf(w, r)
	if !ok {
		return
	}
	changed, err := c.cfg.Engine.RepairCache(r.Context(), scope, key)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.log.Info("console: Redis repaired from Postgres", "user", userOf(r), "scope", scope, "key", key, "changed", changed)
	done := "0"
	if changed {
		done = "1"
	}
	//nolint:gosec // G710: a path under the console's own prefix, scope and key escaped (pathSegment): it cannot leave the site
	http.Redirect(w, r, c.keyURL(scope, key)+"?repaired="+done, http.StatusSeeOther)
}

// userOf returns the user a request acts as.
func userOf(r *http.Request) string {
	user, _ := r.Context().Value(userKey{}).(string)
	return user
}
