package main

import (
	"context"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/postgres"
)

// TestCommandsTakeASchemaMigratedByATool: a database migrated with goose
// (or golang-migrate, the documented alternatives to Store.Migrate) has no
// millpond_schema_migrations table. The commands used to call it not
// installed and send the operator to `millpond migrate`, which must not be
// mixed with those tools; they now check the catalogue: a complete schema
// is served, an incomplete one named as such.
func TestCommandsTakeASchemaMigratedByATool(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t, "postgres")
	s, err := postgres.New(db.Pool, outbox.WithoutListen())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fsys, err := outbox.GooseMigrationsFS("postgres")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, s.SQLDB(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 3); err != nil {
		t.Fatalf("goose up to 3: %v", err)
	}
	code, stdout, stderr := cli(t, nil, "-db", db.URL, "stats")
	if code != exitFailure || !strings.Contains(stderr, "is incomplete") || strings.Contains(stderr, "millpond migrate`") {
		t.Errorf("stats on a schema at goose version 3: exit %d, stdout %q, stderr %q; want it called incomplete", code, stdout, stderr)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("goose up: %v", err)
	}
	for _, args := range [][]string{{"stats"}, {"purge", "-older-than", "168h"}, {"groups", "list"}, {"dead", "list", "-stream", "s"}} {
		if code, stdout, stderr := cli(t, nil, append([]string{"-db", db.URL}, args...)...); code != exitOK {
			t.Errorf("%q on a schema goose migrated: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}
