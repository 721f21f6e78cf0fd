package outbox

import (
	"context"
	"embed"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlFiles holds the statements, one whole file each under sql/, named as in
// docs/state-machine.md.
//
//go:embed sql/*.sql
var sqlFiles embed.FS

// Every statement the store runs, loaded once when the package loads.
var (
	claimInsertSQL          = load("claim_insert")
	claimBatchSQL           = load("claim_batch")
	claimPeekSQL            = load("claim_peek")
	claimTakeoverSQL        = load("claim_takeover")
	finishSQL               = load("finish")
	singleBeginSQL          = load("single_begin")
	singleProbeSQL          = load("single_probe")
	batchBeginSQL           = load("batch_begin")
	batchProbeSQL           = load("batch_probe")
	batchFinishSQL          = load("batch_finish")
	lockSecretSQL           = load("lock_secret")
	singleFinishSQL         = load("single_finish")
	sessionKeepalivesSQL    = load("session_keepalives")
	heartbeatSQL            = load("heartbeat")
	getKeySQL               = load("get_key")
	currentKeysSQL          = load("current_keys")
	purgeSQL                = load("purge")
	reapLeasesSQL           = load("reap_leases")
	countReapableSQL        = load("count_reapable")
	deleteExpiredSQL        = load("delete_expired")
	raiseVersionFloorSQL    = load("raise_version_floor")
	countExpiredSQL         = load("count_expired")
	scanLiveSQL             = load("scan_live")
	liftStatementTimeoutSQL = load("lift_statement_timeout")
	liveKeysSQL             = load("live_keys")
	stepsInProgressSQL      = load("steps_in_progress")
	takeBatchSQL            = load("take_batch")
	requeueEventsSQL        = load("requeue_events")
	countEventsSQL          = load("count_events")
	notifySQL               = load("notify")
	recordStepSQL           = load("record_step")
	handOffSQL              = load("hand_off")
	resumeClaimSQL          = load("resume_claim")
	renewLeasesSQL          = load("renew_leases")
	tryLockSQL              = load("try_lock")
	unparkEventsSQL         = load("unpark_events")
	raiseVersionFloorKeySQL = load("raise_version_floor_key")
	deleteKeySQL            = load("delete_key")
	recordPassSQL           = load("record_pass")
	countStuckSQL           = load("count_stuck")

	// The statements of a distributed database (Citus) only.
	citusInstalledSQL    = load("citus_installed")
	citusDistributedSQL  = load("citus_distributed")
	citusRecordStepSQL   = load("citus_record_step")
	citusSingleFinishSQL = load("citus_single_finish")
	citusClaimInsertSQL  = load("citus_claim_insert")
	citusOutboxInsertSQL = load("citus_outbox_insert")
	outboxScopesSQL      = load("outbox_scopes")
	reapableScopesSQL    = load("reapable_scopes")
	resumableScopesSQL   = load("resumable_scopes")
	expiredScopesSQL     = load("expired_scopes")
	purgedVersionSQL     = load("purged_version")
	raiseFloorToSQL      = load("raise_version_floor_to")
)

// statement is one file of sql/, as the package loaded it.
type statement struct {
	// name is the file's name without .sql.
	name string
	// text is the statement as written, its markers expanded: named
	// parameters (@name), as pgx.NamedArgs takes them.
	text string
	// sql is text as sent: each named parameter replaced by its position
	// ($1, $2, …), as pgx.StrictNamedArgs would replace it at every call.
	sql string
	// params names the parameters by position: $1 is params[0].
	params []string
	// byScope, for a statement with and_scope or key lock markers, is its
	// variant for a distributed database: and_scope markers expanded to a
	// test of @scope, so that it runs on the one shard of that scope, and
	// key lock markers to true. Nil for the others.
	byScope *statement
}

// loaded lists the statements by name, for the tests.
var loaded = map[string]*statement{}

// load reads sql/name.sql, expands its markers and numbers its named
// parameters, once. A statement it cannot load is a bug of this package:
// it panics, so that no binary or test starts with it.
func load(name string) *statement {
	raw, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(fmt.Sprintf("keystore: %v", err))
	}
	s, err := newStatement(name, string(raw))
	if err != nil {
		panic(fmt.Sprintf("keystore: sql/%s.sql: %v", name, err))
	}
	loaded[name] = s
	return s
}

// newStatement expands the markers of text and numbers its named
// parameters: with pgx's own rewriting (pgx.NamedArgs), run once here
// instead of at every call, so that the statement's positional text and
// parameter order are exactly what pgx.StrictNamedArgs would send.
func newStatement(name, text string) (*statement, error) {
	s, err := compile(name, text, false)
	if err != nil || !hasDistributedMarker(text) {
		return s, err
	}
	if s.byScope, err = compile(name, text, true); err != nil {
		return nil, err
	}
	return s, nil
}

// compile expands the markers of text (and_scope markers to a test of
// @scope when byScope, to nothing otherwise) and numbers its parameters.
func compile(name, text string, byScope bool) (*statement, error) {
	text, err := expandMarkers(text, byScope)
	if err != nil {
		return nil, err
	}
	if m := positionalParam.FindString(text); m != "" {
		return nil, fmt.Errorf("positional parameter %s: name it (@name)", m)
	}
	sql, _, err := pgx.NamedArgs(nil).RewriteQuery(context.Background(), nil, text, nil)
	if err != nil {
		return nil, fmt.Errorf("number the parameters: %w", err)
	}
	params, err := paramOrder(text, sql)
	if err != nil {
		return nil, err
	}
	return &statement{name: name, text: text, sql: sql, params: params}, nil
}

// positionalParam finds a $1-style parameter.
var positionalParam = regexp.MustCompile(`\$[0-9]+`)

// paramOrder reads, from a statement's named text and pgx's positional
// rewriting of it, the name of each position. The two texts are the same
// but where the first has @name and the second $n.
func paramOrder(named, positional string) ([]string, error) {
	var params []string
	i, j := 0, 0
	for i < len(named) && j < len(positional) {
		if named[i] == positional[j] {
			i, j = i+1, j+1
			continue
		}
		if named[i] != '@' || positional[j] != '$' {
			return nil, fmt.Errorf("parameters: %q was rewritten as %q", excerpt(named, i), excerpt(positional, j))
		}
		i, j = i+1, j+1
		start := i
		for i < len(named) && isNameByte(named[i]) {
			i++
		}
		name := named[start:i]
		n := 0
		for ; j < len(positional) && positional[j] >= '0' && positional[j] <= '9'; j++ {
			n = n*10 + int(positional[j]-'0')
		}
		switch {
		case n == len(params)+1:
			params = append(params, name)
		case n < 1 || n > len(params) || params[n-1] != name:
			return nil, fmt.Errorf("parameters: @%s numbered $%d", name, n)
		}
	}
	if named[i:] != positional[j:] {
		return nil, fmt.Errorf("parameters: %q was rewritten as %q", excerpt(named, i), excerpt(positional, j))
	}
	return params, nil
}

// isNameByte reports whether c continues a parameter name, as pgx reads it.
func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

// excerpt returns a few bytes of s from i, for an error.
func excerpt(s string, i int) string { return s[i:min(i+20, len(s))] }

// args returns named as the statement's arguments, in the order of its
// parameters. As with pgx.StrictNamedArgs, a parameter without an argument,
// or an argument without a parameter, is an error: the statement then
// fails with it, unsent.
func (s *statement) args(named pgx.StrictNamedArgs) []any {
	args := make([]any, len(s.params))
	for i, p := range s.params {
		v, ok := named[p]
		if !ok {
			return argsError("sql/%s.sql: parameter @%s has no argument", s.name, p)
		}
		args[i] = v
	}
	if len(named) != len(s.params) {
		for name := range named {
			if !s.hasParam(name) {
				return argsError("sql/%s.sql: argument %s is no parameter of the statement", s.name, name)
			}
		}
	}
	return args
}

// hasParam reports whether name is one of the statement's parameters.
func (s *statement) hasParam(name string) bool {
	return slices.Contains(s.params, name)
}

// argsError returns the arguments of a statement that fails, unsent, with
// the error format describes: pgx returns it as a query rewriter's ("rewrite
// query failed: …").
func argsError(format string, a ...any) []any {
	return []any{failedRewrite{fmt.Errorf(format, a...)}}
}

// failedRewrite is a pgx.QueryRewriter that fails with err.
type failedRewrite struct{ err error }

// RewriteQuery implements pgx.QueryRewriter.
func (r failedRewrite) RewriteQuery(context.Context, *pgx.Conn, string, []any) (string, []any, error) {
	return "", nil, r.err
}

// exec runs the statement on db with args.
func (s *statement) exec(ctx context.Context, db DB, args pgx.StrictNamedArgs) (pgconn.CommandTag, error) {
	return db.Exec(ctx, s.sql, s.args(args)...)
}

// query runs the statement on db with args.
func (s *statement) query(ctx context.Context, db DB, args pgx.StrictNamedArgs) (pgx.Rows, error) {
	return db.Query(ctx, s.sql, s.args(args)...)
}

// queryRow runs the statement on db with args.
func (s *statement) queryRow(ctx context.Context, db Querier, args pgx.StrictNamedArgs) pgx.Row {
	return db.QueryRow(ctx, s.sql, s.args(args)...)
}

// queue queues the statement on b with args.
func (s *statement) queue(b *pgx.Batch, args pgx.StrictNamedArgs) *pgx.QueuedQuery {
	return b.Queue(s.sql, s.args(args)...)
}

// keyColumns is the key projection, sql/key_columns.sql: its lines after
// the leading comment. It is no statement of its own.
var keyColumns = func() string {
	raw, err := sqlFiles.ReadFile("sql/key_columns.sql")
	if err != nil {
		panic(fmt.Sprintf("keystore: %v", err))
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	for len(lines) > 0 && strings.HasPrefix(lines[0], "--") {
		lines = lines[1:]
	}
	return strings.Join(lines, "\n")
}()

// marker finds a {{…}} marker.
var marker = regexp.MustCompile(`\{\{([^{}]*)\}\}`)

// hasDistributedMarker reports whether text has a marker that a
// distributed database expands otherwise: and_scope, try_key_lock or
// key_locked.
func hasDistributedMarker(text string) bool {
	for _, m := range marker.FindAllStringSubmatch(text, -1) {
		if f := strings.Fields(m[1]); len(f) > 0 && (f[0] == "and_scope" || f[0] == "try_key_lock" || f[0] == "key_locked") {
			return true
		}
	}
	return false
}

// keyLockClass is the class of the keys' advisory locks ('ONCE' in ASCII):
// the two-integer form of the lock functions, a space apart from the
// single-bigint locks (the reconciler's, the gateway's, most
// applications'). See the key_locks migration.
const keyLockClass = "1330529093"

// tryKeyLock is the expansion of {{try_key_lock id}} on one Postgres.
func tryKeyLock(id string) string {
	return "pg_try_advisory_xact_lock(" + keyLockClass + ", " + id + ")"
}

// keyLockedOrBusy is the expansion of {{key_locked}} on one Postgres.
var keyLockedOrBusy = "CASE WHEN " + tryKeyLock("@lock_id::integer") + " THEN true ELSE onceonly_key_busy(@scope, @key) END"

// untakenLock is the expansion of a key lock marker on a distributed
// database, where the claims take no key lock (the engine's one-commit
// transaction takes the coordinator's; see docs/citus.md): true, reading a
// parameter the marker names, so the statement keeps its parameters.
func untakenLock(id string) string {
	if strings.Contains(id, "@") {
		return "(" + id + " IS NOT NULL)"
	}
	return "true"
}

// expandMarkers replaces each marker of text: {{key_columns}} with the
// key columns reading bodies whole, {{key_columns @name}} with the key
// columns leaving out bodies longer than @name bytes; {{and_scope}} and
// {{and_scope alias}}, with byScope, with a test of the row's scope
// (alias.scope) against @scope, and with nothing otherwise;
// {{try_key_lock id}} with a try of the key lock id (true when taken) and
// {{key_locked}} with a try of the key lock @lock_id that fails the
// statement (SQLSTATE OO002) when another transaction holds it, each
// with true under byScope. A marker stands in the statement, not in a
// comment.
func expandMarkers(text string, byScope bool) (string, error) {
	var out strings.Builder
	last := 0
	for _, m := range marker.FindAllStringSubmatchIndex(text, -1) {
		line := text[strings.LastIndexByte(text[:m[0]], '\n')+1 : m[0]]
		if strings.Contains(line, "--") {
			return "", fmt.Errorf("marker %s in a comment", text[m[0]:m[1]])
		}
		var expansion string
		switch f := strings.Fields(text[m[2]:m[3]]); {
		case len(f) == 1 && f[0] == "key_columns":
			expansion = strings.ReplaceAll(keyColumns, "@max_body", "NULL")
		case len(f) == 2 && f[0] == "key_columns" && len(f[1]) > 1 && f[1][0] == '@':
			expansion = strings.ReplaceAll(keyColumns, "@max_body", f[1])
		case len(f) == 1 && f[0] == "and_scope" && byScope:
			expansion = "AND scope = @scope"
		case len(f) == 2 && f[0] == "and_scope" && byScope:
			expansion = "AND " + f[1] + ".scope = @scope"
		case (len(f) == 1 || len(f) == 2) && f[0] == "and_scope":
			// One Postgres: no test of the scope, the statement as before.
		case len(f) == 2 && f[0] == "try_key_lock" && byScope:
			expansion = untakenLock(f[1])
		case len(f) == 2 && f[0] == "try_key_lock":
			expansion = tryKeyLock(f[1])
		case len(f) == 1 && f[0] == "key_locked" && byScope:
			expansion = untakenLock("@lock_id::integer")
		case len(f) == 1 && f[0] == "key_locked":
			expansion = keyLockedOrBusy
		default:
			return "", fmt.Errorf("unknown marker %s", text[m[0]:m[1]])
		}
		out.WriteString(text[last:m[0]])
		out.WriteString(expansion)
		last = m[1]
	}
	if last == 0 {
		return text, nil
	}
	out.WriteString(text[last:])
	return out.String(), nil
}
