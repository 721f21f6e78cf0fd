package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly/demo/payments/schema"
	"github.com/onceonly/onceonly/migrations"
)

// migrateVerbs are what `api migrate` takes.
var migrateVerbs = verbs{"up", "down", "status", "version"}

// migrate runs `api migrate CMD` (one of migrateVerbs) on the database of
// pgCfg, printing what it did on stdout. Two migration sets take part: the
// engine's, and the demo's own (its payments table, recorded apart). up
// runs the engine's, then the demo's; down rolls back the last of the
// engine's; status lists both; version is the engine's.
func migrate(ctx context.Context, pgCfg *pgxpool.Config, cmd string, stdout io.Writer) error {
	pool, err := pgxpool.NewWithConfig(ctx, pgCfg)
	if err != nil {
		return fmt.Errorf("connect to Postgres: %w", err)
	}
	defer pool.Close()
	engine, err := migrations.NewMigrator(pool)
	if err != nil {
		return fmt.Errorf("migrator: %w", err)
	}
	defer engine.Close()
	demo, err := migrations.NewMigrator(pool, schema.Migrations())
	if err != nil {
		return fmt.Errorf("demo migrator: %w", err)
	}
	defer demo.Close()
	p := engine.Provider()
	switch cmd {
	case "up":
		n, err := engine.Up(ctx)
		if err != nil {
			return err
		}
		nd, err := demo.Up(ctx)
		if err != nil {
			return fmt.Errorf("demo schema: %w", err)
		}
		v, err := p.GetDBVersion(ctx)
		if err != nil {
			return fmt.Errorf("read version: %w", err)
		}
		fmt.Fprintf(stdout, "applied %d migration(s); schema at version %d\n", n, v)
		fmt.Fprintf(stdout, "demo schema: applied %d migration(s)\n", nd)
	case "down":
		res, err := p.Down(ctx)
		if err != nil {
			return fmt.Errorf("migrate down: %w", err)
		}
		fmt.Fprintf(stdout, "rolled back %s\n", res.Source.Path)
	case "status":
		for _, set := range []struct {
			name string
			m    *migrations.Migrator
		}{{"engine", engine}, {"demo", demo}} {
			statuses, err := set.m.Provider().Status(ctx)
			if err != nil {
				return fmt.Errorf("migration status: %w", err)
			}
			for _, st := range statuses {
				applied := ""
				if !st.AppliedAt.IsZero() {
					applied = st.AppliedAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(stdout, "%-8s %-7s %-40s %s\n", st.State, set.name, st.Source.Path, applied)
			}
		}
	case "version":
		v, err := p.GetDBVersion(ctx)
		if err != nil {
			return fmt.Errorf("read version: %w", err)
		}
		fmt.Fprintln(stdout, v)
	}
	return nil
}
