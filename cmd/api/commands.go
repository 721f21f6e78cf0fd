package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/onceonly/onceonly/cmd/internal/config"
	"github.com/onceonly/onceonly/cmd/internal/daemon"
	"github.com/onceonly/onceonly/cmd/internal/daemon/shutdown"
	"github.com/onceonly/onceonly/cmd/internal/tracing"
)

// command is one of api's commands: `api NAME ARGS`.
type command struct {
	name    string // "" for the default command, serve
	args    string // its arguments, for the usage line
	summary string // what it does, in a few words
	// run runs it on the arguments after its name and returns the exit
	// code: 0, 1 for a failure, 2 for bad usage or configuration.
	run func(args []string, stdout, stderr io.Writer) int
}

// commands is api's command table; the usage and the unknown-command error
// are made from it.
func commands() []command {
	return []command{
		{"", "[flags]", "serve the payments API", runServe},
		{"migrate", migrateVerbs.String() + " [flags]", "run the database migrations", runMigrate},
		{"keys", keysVerbs.String() + " [--force] SCOPE KEY [flags]", "show or purge one key, in Postgres and Redis", runKeys},
		{"probe", "URL", "exit 0 if URL answers 200 (container health checks)", runProbe},
		{"help", "", "print this help", runHelp},
	}
}

// run runs the command args[0] names (serve, when args begin with a flag
// or are empty) on the arguments after the name.
func run(args []string, stdout, stderr io.Writer) int {
	name := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	table := commands()
	i := slices.IndexFunc(table, func(c command) bool { return c.name == name })
	if i < 0 {
		names := make(verbs, 0, len(table)-1)
		for _, c := range table[1:] {
			names = append(names, c.name)
		}
		fmt.Fprintf(stderr, "api: unknown command %q: say %s (api help)\n", name, names.say())
		return 2
	}
	if name != "" && len(args) > 0 && isHelp(args[0]) { // api migrate -h
		return usage(stderr)
	}
	return table[i].run(args, stdout, stderr)
}

// synopsis is the usage line of every command, aligned.
func synopsis() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for i, c := range commands() {
		lead := "       "
		if i == 0 {
			lead = "usage: "
		}
		line := strings.Join(slices.DeleteFunc([]string{"api", c.name, c.args}, func(s string) bool { return s == "" }), " ")
		fmt.Fprintf(tw, "%s%s\t%s\n", lead, line, c.summary)
	}
	_ = tw.Flush()
	return strings.TrimSuffix(b.String(), "\n")
}

// newSet returns the api's settings on a fresh set whose -h prints the
// synopsis and every flag to out.
func newSet(out io.Writer) (*config.Set, *settings) {
	set := config.NewSet("api", out)
	set.SetSynopsis(synopsis())
	return set, define(set)
}

// usage prints what -h prints, to w.
func usage(w io.Writer) int {
	set, _ := newSet(w)
	_ = set.Parse([]string{"-h"})
	return 0
}

func isHelp(arg string) bool {
	return slices.Contains([]string{"-h", "-help", "--h", "--help"}, arg)
}

// runHelp is `api help`: the usage, on stdout.
func runHelp(_ []string, stdout, _ io.Writer) int { return usage(stdout) }

// verbs are the first arguments a command takes.
type verbs []string

// String lists them for a usage line: up|down.
func (v verbs) String() string { return strings.Join(v, "|") }

// say lists them for an error: "up, down or status".
func (v verbs) say() string {
	if len(v) == 1 {
		return v[0]
	}
	return strings.Join(v[:len(v)-1], ", ") + " or " + v[len(v)-1]
}

// verb takes the verb from args: a one-line error (prefixed by command;
// then says what follows the verb) and ok false when it is missing or
// unknown.
func (v verbs) verb(command, then string, args []string, stderr io.Writer) (verb string, rest []string, ok bool) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "%s: say %s%s\n", command, v.say(), then)
		return "", nil, false
	}
	if !slices.Contains(v, args[0]) {
		fmt.Fprintf(stderr, "%s: unknown command %q: say %s\n", command, args[0], v.say())
		return "", nil, false
	}
	return args[0], args[1:], true
}

// runContext runs f on a context canceled by SIGINT or SIGTERM, with
// tracing as the OTEL_* variables ask, and returns the exit code: 1 when f
// fails, its error printed after command.
func runContext(command string, stderr io.Writer, f func(ctx context.Context) error) int {
	ctx, stop := shutdown.SignalContext()
	defer stop()
	stopTracing, err := tracing.Start(ctx, "onceonly-api")
	if err != nil {
		fmt.Fprintln(stderr, command+":", err)
		return 2
	}
	defer stopTracing()
	if err := f(ctx); err != nil {
		fmt.Fprintln(stderr, command+":", err)
		return 1
	}
	return 0
}

// runServe is `api [flags]`.
func runServe(args []string, _, stderr io.Writer) int {
	set, s := newSet(stderr)
	if code, ok := daemon.ParseArgs(set, "api", args, stderr); !ok {
		return code
	}
	setup, err := s.Validate(stderr, set, false)
	var deps validated
	if err == nil {
		// Everything is validated before the first log line or connection.
		deps, err = validate(s)
	}
	if err != nil {
		fmt.Fprintln(stderr, "api:", err)
		return 2
	}
	return runContext("api", stderr, func(ctx context.Context) error { return serve(ctx, s, deps, setup) })
}

// runMigrate is `api migrate up|down|status|version [flags]`.
func runMigrate(args []string, stdout, stderr io.Writer) int {
	verb, args, ok := migrateVerbs.verb("api migrate", "", args, stderr)
	if !ok {
		return 2
	}
	set, s := newSet(stderr)
	if code, ok := daemon.ParseArgs(set, "api migrate", args, stderr); !ok {
		return code
	}
	setup, err := s.Validate(stderr, set, false)
	if err != nil {
		fmt.Fprintln(stderr, "api migrate:", err)
		return 2
	}
	return runContext("api migrate", stderr, func(ctx context.Context) error { return migrate(ctx, setup.Postgres, verb, stdout) })
}

// keysVerbs are what `api keys` takes.
var keysVerbs = verbs{"show", "purge"}

// runKeys is `api keys show|purge [--force] SCOPE KEY [flags]`: SCOPE KEY
// come before the flags or after them.
func runKeys(args []string, stdout, stderr io.Writer) int {
	verb, args, ok := keysVerbs.verb("api keys", ", then SCOPE KEY", args, stderr)
	if !ok {
		return 2
	}
	var ref []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") && len(ref) < 2 {
		ref, args = append(ref, args[0]), args[1:]
	}
	set, s := newSet(stderr)
	if err := set.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "api keys:", err)
		return 2
	}
	if ref = append(ref, set.Args()...); len(ref) != 2 {
		fmt.Fprintln(stderr, "api keys: say show or purge, then SCOPE KEY")
		return 2
	}
	setup, err := s.Validate(stderr, set, false)
	if err != nil {
		fmt.Fprintln(stderr, "api keys:", err)
		return 2
	}
	return runContext("api keys", stderr, func(ctx context.Context) error {
		return keysCommand(ctx, setup.Postgres, setup.Redis, *s.RedisPrefix, verb, *s.force, ref[0], ref[1], stdout)
	})
}

// runProbe is `api probe URL`.
func runProbe(args []string, _, stderr io.Writer) int { return probe(args, stderr) }
