// Package schema holds the demo payments API's goose migrations (its
// payments table), apart from the engine's: they are recorded in
// payments_goose_db_version and run after the engine's by `api migrate up`.
// The folder stays a plain goose folder.
package schema

import (
	"embed"

	"github.com/onceonly/onceonly/migrations"
)

//go:embed *.sql
var files embed.FS

// migrateLockID is the payments migrators' row in their lock table:
// crc32("onceonly/payments").
const migrateLockID int64 = 1483052786

// FS returns the embedded migration files.
func FS() embed.FS { return files }

// Migrations selects these migrations for migrations.NewMigrator and
// migrations.EnsureCurrent.
func Migrations() migrations.Option {
	return migrations.WithFiles(files, "payments_goose_db_version", "payments_goose_lock", migrateLockID)
}
