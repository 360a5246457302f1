package outbox_test

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"testing"

	"github.com/golang-migrate/migrate/v4/source/iofs"

	"github.com/millpond/millpond/outbox"
)

var dialects = []string{"postgres", "mysql", "sqlite"}

// Unknown dialect names are refused with ErrUnknownDialect, by every
// function that takes one, and the message lists the accepted names.
func TestMigrationsUnknownDialect(t *testing.T) {
	for _, name := range []string{"", "oracle", "Postgres", "postgresql", "mariadb", "sqlite3", "postgres/"} {
		_, err1 := outbox.MigrationsFS(name)
		_, err2 := outbox.GooseMigrationsFS(name)
		_, err3 := outbox.Migrations(name)
		for i, err := range []error{err1, err2, err3} {
			if !errors.Is(err, outbox.ErrUnknownDialect) {
				t.Errorf("%q (call %d): got %v, want ErrUnknownDialect", name, i+1, err)
				continue
			}
			if want := `"postgres", "mysql" or "sqlite"`; !regexp.MustCompile(regexp.QuoteMeta(want)).MatchString(err.Error()) {
				t.Errorf("%q (call %d): %v does not list %s", name, i+1, err, want)
			}
		}
	}
}

// Both file systems hold the dialect's migrations at their root, files
// only, named the way each tool expects, one per step and direction.
func TestMigrationsFSLayout(t *testing.T) {
	migrateName := regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.(up|down)\.sql$`)
	gooseName := regexp.MustCompile(`^(\d{5})_([a-z0-9_]+)\.sql$`)
	for _, dialect := range dialects {
		t.Run(dialect, func(t *testing.T) {
			ms, err := outbox.Migrations(dialect)
			if err != nil || len(ms) == 0 {
				t.Fatalf("Migrations: %v, %v", ms, err)
			}
			var wantMigrate, wantGoose []string
			for _, m := range ms {
				wantMigrate = append(wantMigrate, fmt.Sprintf("%04d_%s.down.sql", m.Version, m.Name), fmt.Sprintf("%04d_%s.up.sql", m.Version, m.Name))
				wantGoose = append(wantGoose, fmt.Sprintf("%05d_%s.sql", m.Version, m.Name))
			}
			for _, c := range []struct {
				label string
				open  func(string) (fs.FS, error)
				name  *regexp.Regexp
				want  []string
			}{
				{"MigrationsFS", outbox.MigrationsFS, migrateName, wantMigrate},
				{"GooseMigrationsFS", outbox.GooseMigrationsFS, gooseName, wantGoose},
			} {
				fsys, err := c.open(dialect)
				if err != nil {
					t.Fatalf("%s: %v", c.label, err)
				}
				entries, err := fs.ReadDir(fsys, ".")
				if err != nil {
					t.Fatalf("%s: %v", c.label, err)
				}
				var got []string
				for _, e := range entries {
					if e.IsDir() || !c.name.MatchString(e.Name()) {
						t.Errorf("%s: unexpected entry %q at the root", c.label, e.Name())
					}
					got = append(got, e.Name())
				}
				if fmt.Sprint(got) != fmt.Sprint(c.want) {
					t.Errorf("%s: root holds %v, want %v", c.label, got, c.want)
				}
			}
		})
	}
}

// golang-migrate's iofs source reads MigrationsFS directly: it finds every
// version in order and reads the same up and down SQL as Migrations.
func TestMigrationsFSReadByGolangMigrateIOFS(t *testing.T) {
	for _, dialect := range dialects {
		t.Run(dialect, func(t *testing.T) {
			ms, err := outbox.Migrations(dialect)
			if err != nil {
				t.Fatal(err)
			}
			fsys, err := outbox.MigrationsFS(dialect)
			if err != nil {
				t.Fatal(err)
			}
			src, err := iofs.New(fsys, ".")
			if err != nil {
				t.Fatalf("iofs.New: %v", err)
			}
			defer src.Close()
			var versions []uint
			v, err := src.First()
			for err == nil {
				versions = append(versions, v)
				v, err = src.Next(v)
			}
			if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("walking versions: %v", err)
			}
			if len(versions) != len(ms) {
				t.Fatalf("iofs lists versions %v, Migrations has %d steps", versions, len(ms))
			}
			for i, m := range ms {
				if versions[i] != uint(m.Version) {
					t.Fatalf("iofs version %d is %d, want %d", i, versions[i], m.Version)
				}
				for _, dir := range []struct {
					read func(uint) (io.ReadCloser, string, error)
					want string
				}{{src.ReadUp, m.Up}, {src.ReadDown, m.Down}} {
					r, ident, err := dir.read(versions[i])
					if err != nil {
						t.Fatalf("read version %d: %v", versions[i], err)
					}
					body, err := io.ReadAll(r)
					r.Close()
					if err != nil {
						t.Fatal(err)
					}
					if ident != m.Name || string(body) != dir.want {
						t.Errorf("version %d: iofs read %q (%d bytes), want %q (%d bytes)", versions[i], ident, len(body), m.Name, len(dir.want))
					}
				}
			}
		})
	}
}
