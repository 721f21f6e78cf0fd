package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncetest"
)

// TestHelp: `api help` prints on stdout what `api -h` prints on stderr (and
// `api COMMAND -h` too): a usage line per command of the table, then every
// flag.
func TestHelp(t *testing.T) {
	code, help, stderr := runAPI(t, nil, "help")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	for _, c := range commands() {
		line := strings.Join(strings.Fields("api "+c.name+" "+c.args), " ")
		require.Contains(t, help, line, "the usage of %q", c.name)
		require.Contains(t, help, c.summary)
	}
	require.Contains(t, help, "\nflags:\n")
	require.Contains(t, help, "(env DATABASE_URL)")
	require.True(t, strings.HasPrefix(help, "usage: api [flags] "), help)

	for _, args := range [][]string{{"-h"}, {"--help"}, {"migrate", "-h"}, {"keys", "-h"}, {"keys", "show", "-h"}, {"probe", "-h"}} {
		code, stdout, stderr := runAPI(t, nil, args...)
		require.Equal(t, 0, code, args)
		require.Empty(t, stdout, args)
		require.Equal(t, help, stderr, args)
	}
}

// TestUsageErrors: a command or verb the table does not know, or missing
// arguments, is one line on stderr and exit code 2, before any
// configuration is read.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve"}, `api: unknown command "serve": say migrate, keys, probe or help (api help)`},
		{[]string{"migrate"}, "api migrate: say up, down, status or version"},
		{[]string{"migrate", "--dry-run"}, "api migrate: say up, down, status or version"},
		{[]string{"migrate", "sideways"}, `api migrate: unknown command "sideways": say up, down, status or version`},
		{[]string{"migrate", "up", "extra"}, `api migrate: unexpected argument "extra"`},
		{[]string{"keys"}, "api keys: say show or purge, then SCOPE KEY"},
		{[]string{"keys", "drop", "s", "k"}, `api keys: unknown command "drop": say show or purge`},
		{[]string{"keys", "show", "s"}, "api keys: say show or purge, then SCOPE KEY"},
		{[]string{"keys", "show", "s", "k", "x"}, "api keys: say show or purge, then SCOPE KEY"},
		{[]string{"keys", "purge", "--nope", "s", "k"}, "api keys: bad flag"},
		{[]string{"probe"}, "api probe: say one URL"},
		{[]string{"probe", "a", "b"}, "api probe: say one URL"},
		{[]string{"-database-url", "postgres://x", "extra"}, `api: unexpected argument "extra"`},
	} {
		code, stdout, stderr := runAPI(t, nil, tc.args...)
		oncetest.RequireOneLineError(t, code, stdout, stderr, tc.want)
		require.Equal(t, 2, code, tc.args)
	}
}

// TestSubcommandsNeedTheDatabase: migrate and keys, well formed, read the
// shared configuration.
func TestSubcommandsNeedTheDatabase(t *testing.T) {
	for _, args := range [][]string{{"migrate", "status"}, {"keys", "show", "s", "k"}, {"keys", "purge", "s", "--force", "k"}} {
		code, stdout, stderr := runAPI(t, nil, args...)
		oncetest.RequireOneLineError(t, code, stdout, stderr, "DATABASE_URL (or -database-url) is required")
		require.Equal(t, 2, code, args)
	}
}
