package citus

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/oncetest"
)

// citusTable is a row of Citus's citus_tables view.
type citusTable struct {
	Name         string `db:"table_name"`
	Type         string `db:"citus_table_type"`
	Column       string `db:"distribution_column"`
	ColocationID int    `db:"colocation_id"`
}

// TestMigrateDistributes checks the Citus layout (docs/citus.md) after `api migrate up`
// and the gateway's own migration: the engine's keys and outbox by scope
// and the demo's payments by merchant_id, in one co-location group; the
// version floor and the gateway's tables as reference tables. A second
// `api migrate up` changes nothing.
func TestMigrateDistributes(t *testing.T) {
	db := oncetest.CitusDatabaseURL(t)
	migrateUp(t, db)
	// The gateway creates its schema when it starts (unless `api migrate
	// up` made it already).
	gw := oncetest.StartDaemon(t, bins+"/gateway", "DATABASE_URL="+db, "LOG_LEVEL=warn")
	if err := gw.Stop(); err != nil {
		t.Fatal(err)
	}
	migrateUp(t, db)

	ctx := oncetest.Context(t)
	pool := oncetest.Pool(t, db)
	rows, err := pool.Query(ctx, `SELECT table_name::text AS table_name, citus_table_type::text AS citus_table_type,
		distribution_column::text AS distribution_column, colocation_id::int AS colocation_id FROM citus_tables`)
	if err != nil {
		t.Fatalf("read citus_tables: %v", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[citusTable])
	if err != nil {
		t.Fatalf("read citus_tables: %v", err)
	}
	tables := map[string]citusTable{}
	for _, tb := range list {
		tables[tb.Name] = tb
	}
	t.Logf("citus_tables: %+v", list)

	for name, want := range map[string]citusTable{
		"idempotency_keys":          {Type: "distributed", Column: "scope"},
		"outbox":                    {Type: "distributed", Column: "scope"},
		"payments":                  {Type: "distributed", Column: "merchant_id"},
		"idempotency_version_floor": {Type: "reference", Column: "<none>"},
		"gateway.charges":           {Type: "reference", Column: "<none>"},
	} {
		got, ok := tables[name]
		switch {
		case !ok:
			t.Errorf("%s is a plain (local) table on the coordinator; want a %s table", name, want.Type)
		case got.Type != want.Type || got.Column != want.Column:
			t.Errorf("%s is a %s table (distribution column %s); want %s (%s)", name, got.Type, got.Column, want.Type, want.Column)
		}
	}
	keys, outbox, payments := tables["idempotency_keys"], tables["outbox"], tables["payments"]
	if keys.ColocationID != outbox.ColocationID || keys.ColocationID != payments.ColocationID {
		t.Errorf("co-location groups: idempotency_keys %d, outbox %d, payments %d; want one group",
			keys.ColocationID, outbox.ColocationID, payments.ColocationID)
	}

	// Every table the gateway made (goose's tables aside) is a
	// reference table: its rows are on every node.
	var local []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(c.oid::regclass::text ORDER BY c.relname), '{}')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'gateway' AND c.relkind IN ('r', 'p') AND c.relname NOT LIKE 'goose\_%'
		  AND NOT EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = c.oid AND p.partmethod = 'n')`).Scan(&local); err != nil {
		t.Fatalf("list the gateway's tables: %v", err)
	}
	if len(local) > 0 {
		t.Errorf("gateway tables that are not reference tables: %v", local)
	}
}
