package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceonly/onceonly/migrations"
)

// migrateVerbs are what `api migrate` takes.
var migrateVerbs = verbs{"up", "down", "status", "version"}

// migrate runs `api migrate CMD` (one of migrateVerbs) on the database of
// pgCfg, printing what it did on stdout.
func migrate(ctx context.Context, pgCfg *pgxpool.Config, cmd string, stdout io.Writer) error {
	pool, err := pgxpool.NewWithConfig(ctx, pgCfg)
	if err != nil {
		return fmt.Errorf("connect to Postgres: %w", err)
	}
	defer pool.Close()
	m, err := migrations.NewMigrator(pool)
	if err != nil {
		return fmt.Errorf("migrator: %w", err)
	}
	defer m.Close()
	p := m.Provider()
	switch cmd {
	case "up":
		n, err := m.Up(ctx)
		if err != nil {
			return err
		}
		v, err := p.GetDBVersion(ctx)
		if err != nil {
			return fmt.Errorf("read version: %w", err)
		}
		fmt.Fprintf(stdout, "applied %d migration(s); schema at version %d\n", n, v)
	case "down":
		res, err := p.Down(ctx)
		if err != nil {
			return fmt.Errorf("migrate down: %w", err)
		}
		fmt.Fprintf(stdout, "rolled back %s\n", res.Source.Path)
	case "status":
		statuses, err := p.Status(ctx)
		if err != nil {
			return fmt.Errorf("migration status: %w", err)
		}
		for _, st := range statuses {
			applied := ""
			if !st.AppliedAt.IsZero() {
				applied = st.AppliedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(stdout, "%-8s %-40s %s\n", st.State, st.Source.Path, applied)
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
