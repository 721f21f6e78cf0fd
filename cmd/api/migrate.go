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
var migrateVerbs = verbs{"up", "down", "status", verbVersion}

// verbVersion prints the engine's schema version alone, for scripts.
const verbVersion = "version"

// migrate runs `api migrate CMD` (one of migrateVerbs) on the database of
// pgCfg, printing what it did on stdout. Two migration sets take part: the
// engine's (recorded in onceonly_db_version), and the demo's own (its
// payments table, recorded in payments_goose_db_version). up runs the
// engine's, then the demo's; down rolls back the last of the engine's;
// status lists both; version is the engine's. Every verb first takes over
// the engine's versions an earlier release recorded in goose_db_version
// (migrations.Migrator.Adopt).
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
	// A database an earlier release migrated has the engine's versions in
	// goose_db_version: take them over first, so that every verb sees them.
	adopted, err := engine.Adopt(ctx)
	if err != nil {
		return err
	}
	if len(adopted.Versions) > 0 && cmd != verbVersion {
		fmt.Fprintf(stdout, "took over versions %d-%d of the engine from goose_db_version into %s%s\n",
			adopted.Versions[0], adopted.Versions[len(adopted.Versions)-1], migrations.VersionTable, leftOrRemoved(adopted.Removed))
	}
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
	case verbVersion:
		v, err := p.GetDBVersion(ctx)
		if err != nil {
			return fmt.Errorf("read version: %w", err)
		}
		fmt.Fprintln(stdout, v)
	}
	return nil
}

// leftOrRemoved says what became of the engine's versions in
// goose_db_version after they were taken over.
func leftOrRemoved(removed bool) string {
	if removed {
		return " (and removed them there)"
	}
	return " (goose_db_version holds other versions too, so it is left as it is: see docs/library.md)"
}
