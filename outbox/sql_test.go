package outbox

import (
	"context"
	"io/fs"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestEveryStatementIsLoaded: each file of sql/ but the key projection is a
// statement the package loads.
func TestEveryStatementIsLoaded(t *testing.T) {
	t.Parallel()
	files, err := fs.Glob(sqlFiles, "sql/*.sql")
	require.NoError(t, err)
	names := make([]string, 0, len(files))
	for _, f := range files {
		if name := strings.TrimSuffix(path.Base(f), ".sql"); name != "key_columns" {
			names = append(names, name)
		}
	}
	got := make([]string, 0, len(loaded))
	for name := range loaded {
		got = append(got, name)
	}
	require.ElementsMatch(t, names, got)
}

// TestStatementsBindAsPgxDoes: the text and arguments a statement sends
// are those pgx.StrictNamedArgs makes of its named text at every call.
func TestStatementsBindAsPgxDoes(t *testing.T) {
	t.Parallel()
	for name, s := range loaded {
		for _, s := range []*statement{s, s.byScope} {
			if s == nil {
				continue
			}
			named := pgx.StrictNamedArgs{}
			for _, p := range s.params {
				named[p] = "value of " + p
			}
			want, wantArgs, err := named.RewriteQuery(context.Background(), nil, s.text, nil)
			require.NoError(t, err, name)
			require.Equal(t, want, s.sql, name)
			require.Equal(t, wantArgs, s.args(named), name)
		}
	}
	for _, s := range []*statement{takeBatchSQL, reapLeasesSQL, deleteExpiredSQL, resumeClaimSQL, renewLeasesSQL} {
		require.NotNil(t, s.byScope, s.name)
		require.NotContains(t, s.params, "scope", s.name)
		require.Contains(t, s.byScope.params, "scope", s.name)
	}
	require.Equal(t, []string{"status", "response_status", "response_content_type", "response_body",
		"response_headers", "count_failure", "ttl", "scope", "key", "owner", "notify", "channel", "fail_when_lost"}, finishSQL.params,
		"each name once, numbered where it first appears outside comments")
}

// TestStatementArgsAreStrict: a parameter without an argument, or an
// argument without a parameter, fails the statement before it is sent.
func TestStatementArgsAreStrict(t *testing.T) {
	t.Parallel()
	rewriteErr := func(args []any) error {
		require.Len(t, args, 1)
		r, ok := args[0].(pgx.QueryRewriter)
		require.True(t, ok)
		_, _, err := r.RewriteQuery(context.Background(), nil, "", nil)
		return err
	}
	err := rewriteErr(heartbeatSQL.args(pgx.StrictNamedArgs{"scope": "s", "key": "k", "owner": "o"}))
	require.EqualError(t, err, "sql/heartbeat.sql: parameter @lease has no argument")
	err = rewriteErr(heartbeatSQL.args(pgx.StrictNamedArgs{"scope": "s", "key": "k", "owner": "o", "lease": 1, "leese": 1}))
	require.EqualError(t, err, "sql/heartbeat.sql: argument leese is no parameter of the statement")
	require.Empty(t, countEventsSQL.args(nil), "a statement without parameters goes without arguments")
}

// TestNewStatement: what a statement may hold.
func TestNewStatement(t *testing.T) {
	t.Parallel()
	s, err := newStatement("t", "-- @a in a comment is not a parameter\n"+
		"SELECT @b::int, '@c', @a_1, @b, \"@d\", $$@e$$ -- @f\n")
	require.NoError(t, err)
	require.Equal(t, []string{"b", "a_1"}, s.params)
	require.Equal(t, "-- @a in a comment is not a parameter\nSELECT $1::int, '@c', $2, $1, \"@d\", $$@e$$ -- @f\n", s.sql)
	_, err = newStatement("t", "SELECT $1, @a")
	require.ErrorContains(t, err, "positional parameter $1")
}

// TestKeyColumns: the key projection lists the columns keyRow.dest scans,
// in its order, and every statement that returns keys selects it first.
func TestKeyColumns(t *testing.T) {
	t.Parallel()
	matches := regexp.MustCompile(`AS (\w+)(,|$)`).FindAllStringSubmatch(keyColumns, -1)
	aliases := make([]string, 0, len(matches))
	for _, m := range matches {
		aliases = append(aliases, m[1])
	}
	require.Equal(t, []string{"scope", "key", "status", "version", "fingerprint", "owner", "lease_ms",
		"response_status", "response_content_type", "response_headers", "response_body", "body_omitted", "expires_ms",
		"failures"},
		aliases, "in the order of keyRow.dest")
	var r keyRow
	require.Len(t, r.dest(), len(aliases))

	whole := strings.ReplaceAll(keyColumns, "@max_body", "NULL")
	for _, s := range []*statement{claimBatchSQL, claimInsertSQL, claimPeekSQL, claimTakeoverSQL, finishSQL,
		getKeySQL, handOffSQL, purgeSQL, resumeClaimSQL, singleFinishSQL} {
		require.Contains(t, s.text, "SELECT "+whole, s.name)
		require.NotContains(t, s.params, "max_body", s.name)
	}
	for _, s := range []*statement{currentKeysSQL, takeBatchSQL} {
		require.Contains(t, s.text, "SELECT "+keyColumns, s.name)
		require.Contains(t, s.params, "max_body", s.name)
	}
}

// TestExpandMarkers: the markers a statement may hold.
func TestExpandMarkers(t *testing.T) {
	t.Parallel()
	got, err := expandMarkers("SELECT {{key_columns}}, {{ key_columns @limit }} FROM idempotency_keys k", false)
	require.NoError(t, err)
	require.Equal(t, "SELECT "+strings.ReplaceAll(keyColumns, "@max_body", "NULL")+", "+
		strings.ReplaceAll(keyColumns, "@max_body", "@limit")+" FROM idempotency_keys k", got)
	const scoped = "SELECT 1 FROM outbox o WHERE true {{and_scope}} {{and_scope o}}"
	got, err = expandMarkers(scoped, false)
	require.NoError(t, err)
	require.Equal(t, "SELECT 1 FROM outbox o WHERE true  ", got, "one Postgres: no test of the scope")
	got, err = expandMarkers(scoped, true)
	require.NoError(t, err)
	require.Equal(t, "SELECT 1 FROM outbox o WHERE true AND scope = @scope AND o.scope = @scope", got, "by scope")
	for text, want := range map[string]string{
		"SELECT {{key_colums}}":          "unknown marker {{key_colums}}",
		"SELECT {{key_columns 100}}":     "unknown marker {{key_columns 100}}",
		"-- {{key_columns}}\nSELECT 1":   "marker {{key_columns}} in a comment",
		"SELECT 1 -- as {{key_columns}}": "marker {{key_columns}} in a comment",
		"SELECT {{and_scope a b}}":       "unknown marker {{and_scope a b}}",
	} {
		_, err := expandMarkers(text, false)
		require.EqualError(t, err, want, text)
	}
}

// BenchmarkStatementArgs compares what naming the parameters costs per
// call: binding a pgx.StrictNamedArgs to the parameters numbered at load
// (what the store does), against pgx rewriting the statement's text at
// every call (passing the pgx.StrictNamedArgs to pgx).
func BenchmarkStatementArgs(b *testing.B) {
	args := func() pgx.StrictNamedArgs {
		return pgx.StrictNamedArgs{"scope": "s", "key": "k", "owner": "00000000-0000-0000-0000-000000000001",
			"status": "completed", "response_status": 201, "response_content_type": "application/json",
			"response_body": []byte(`{}`), "response_headers": "", "ttl": 1, "notify": true, "channel": NotifyChannel,
			"fail_when_lost": true}
	}
	b.Run("numbered_at_load", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(finishSQL.args(args())) != len(finishSQL.params) {
				b.Fatal("args")
			}
		}
	})
	b.Run("rewritten_per_call", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := args().RewriteQuery(context.Background(), nil, finishSQL.text, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestChannelIsAnArgument: the statements that notify take the channel as
// an argument; its name is written in NotifyChannel only.
func TestChannelIsAnArgument(t *testing.T) {
	t.Parallel()
	for name, s := range loaded {
		require.NotContains(t, s.text, NotifyChannel, name)
		require.Equal(t, strings.Contains(s.text, "pg_notify("), s.hasParam("channel"), name)
	}
}
