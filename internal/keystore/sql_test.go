package keystore

import (
	"context"
	"io/fs"
	"path"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestEveryStatementIsLoaded: each file of sql/ is a statement the package
// loads.
func TestEveryStatementIsLoaded(t *testing.T) {
	t.Parallel()
	files, err := fs.Glob(sqlFiles, "sql/*.sql")
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(path.Base(f), ".sql"))
	}
	var got []string
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
		named := pgx.StrictNamedArgs{}
		for _, p := range s.params {
			named[p] = "value of " + p
		}
		want, wantArgs, err := named.RewriteQuery(context.Background(), nil, s.text, nil)
		require.NoError(t, err, name)
		require.Equal(t, want, s.sql, name)
		require.Equal(t, wantArgs, s.args(named), name)
	}
	require.Equal(t, []string{"status", "response_status", "response_content_type", "response_body",
		"response_headers", "ttl", "scope", "key", "owner", "notify", "fail_when_lost"}, finishSQL.params,
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

// BenchmarkStatementArgs compares what naming the parameters costs per
// call: binding a pgx.StrictNamedArgs to the parameters numbered at load
// (what the store does), against pgx rewriting the statement's text at
// every call (passing the pgx.StrictNamedArgs to pgx).
func BenchmarkStatementArgs(b *testing.B) {
	args := func() pgx.StrictNamedArgs {
		return pgx.StrictNamedArgs{"scope": "s", "key": "k", "owner": "00000000-0000-0000-0000-000000000001",
			"status": "completed", "response_status": 201, "response_content_type": "application/json",
			"response_body": []byte(`{}`), "response_headers": "", "ttl": 1, "notify": true, "fail_when_lost": true}
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
