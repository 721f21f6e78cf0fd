package onceonly_test

import (
	"embed"
	"io/fs"
	"testing"

	"go.uber.org/goleak"

	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncetest"
)

//go:embed testdata/appschema/*.sql
var appSchema embed.FS

// TestMain fails the package's tests when a goroutine outlives them, gives
// the runnable examples DATABASE_URL and REDIS_URL of their own, and puts
// the tests' business table (testdata/appschema) in every test database.
func TestMain(m *testing.M) {
	files, err := fs.Sub(appSchema, "testdata/appschema")
	if err != nil {
		panic(err)
	}
	oncetest.AlsoMigrate(files, migrations.WithFiles(files, "app_goose_db_version", "app_goose_lock", 1))
	goleak.VerifyTestMain(oncetest.WithExampleEnv(m, "onceonly"))
}
