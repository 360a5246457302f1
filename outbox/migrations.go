package outbox

import (
	"fmt"
	"io/fs"

	"github.com/millpond/millpond/internal/sqlcore"
)

// ErrUnknownDialect reports a dialect name other than "postgres", "mysql"
// and "sqlite" (the names Store.Dialect returns; MariaDB is "mysql").
var ErrUnknownDialect = sqlcore.ErrUnknownDialect

// MigrationsFS returns the outbox schema of a dialect ("postgres", "mysql"
// or "sqlite") as golang-migrate files at the root of the file system:
// NNNN_name.up.sql and NNNN_name.down.sql. golang-migrate's iofs source
// reads it directly:
//
//	fsys, err := outbox.MigrationsFS("postgres")
//	src, err := iofs.New(fsys, ".")
//	m, err := migrate.NewWithSourceInstance("iofs", src, databaseURL)
//
// On MySQL and MariaDB a file holds several statements: open the database
// with multiStatements=true. golang-migrate records its versions in its own
// table (schema_migrations by default).
//
// Use one tool to migrate a database: Store.Migrate keeps its own record
// (millpond_schema_migrations) and does not read goose's or golang-migrate's.
// Every step is written to be idempotent (IF NOT EXISTS, IF EXISTS, CREATE
// OR REPLACE), so Store.Migrate over a schema a tool installed re-runs the
// steps harmlessly and records them; over a schema at version 4 or later
// (millpond_outbox is then a view) it records steps 1 to 4 without running
// them. Moving from a tool to Store.Migrate is safe, running both on every
// deploy is not supported.
//
// Step 4 moves each event's content into millpond_events and each consumer
// group's delivery state into millpond_deliveries; millpond_outbox stays as
// a read-only view with the columns of step 3. Run it with the application
// stopped: the old code does not read the new layout. On PostgreSQL and
// SQLite it runs in one transaction; on MySQL and MariaDB, whose DDL is not
// transactional, each of its statements is safe to run again, so a step
// interrupted half-way finishes when it is run again.
func MigrationsFS(dialect string) (fs.FS, error) {
	fsys, err := sqlcore.MigrationsFS(sqlcore.Dialect(dialect))
	if err != nil {
		return nil, fmt.Errorf("outbox: migrations: %w", err)
	}
	return fsys, nil
}

// GooseMigrationsFS returns the outbox schema of a dialect ("postgres",
// "mysql" or "sqlite") as goose files at the root of the file system:
// NNNNN_name.sql with -- +goose Up and -- +goose Down sections, the same
// statements as MigrationsFS. goose reads it directly:
//
//	fsys, err := outbox.GooseMigrationsFS("postgres")
//	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys)
//	results, err := provider.Up(ctx)
//
// goose records its versions in its own table (goose_db_version by
// default). See MigrationsFS for using one tool only.
func GooseMigrationsFS(dialect string) (fs.FS, error) {
	fsys, err := sqlcore.GooseMigrationsFS(sqlcore.Dialect(dialect))
	if err != nil {
		return nil, fmt.Errorf("outbox: goose migrations: %w", err)
	}
	return fsys, nil
}
