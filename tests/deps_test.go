package tests

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/millpond/millpond/internal/testdb"
)

// foreignDrivers are the modules a PostgreSQL-only program must not link.
var foreignDrivers = []string{"modernc.org/sqlite", "github.com/go-sql-driver/mysql"}

func goTool(t *testing.T) string {
	t.Helper()
	g, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	return g
}

// Each database driver lives in its own package: the outbox, the bus, the
// handlers and the PostgreSQL driver package link neither SQLite nor the
// MySQL driver, and neither does a PostgreSQL-only Watermill program.
func TestPostgresOnlyProgramsLinkNoOtherDriver(t *testing.T) {
	pkgs := []string{
		"github.com/millpond/millpond/outbox",
		"github.com/millpond/millpond/outbox/postgres",
		"github.com/millpond/millpond/bus",
		"github.com/millpond/millpond/handlers",
		"github.com/millpond/millpond/dsn",
		"github.com/millpond/millpond/examples/pgwatermill",
	}
	for _, pkg := range pkgs {
		out, err := exec.Command(goTool(t), "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, foreign := range foreignDrivers {
				if dep == foreign || strings.HasPrefix(dep, foreign+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
	// The any-address opener links all three, as documented.
	out, err := exec.Command(goTool(t), "list", "-deps", "github.com/millpond/millpond/outbox/anydb").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps anydb: %v\n%s", err, out)
	}
	for _, want := range append(foreignDrivers, "github.com/jackc/pgx/v5") {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("anydb does not link %s", want)
		}
	}
}

// The PostgreSQL-only Watermill example runs: it publishes in a pgx
// transaction and consumes under a Watermill router.
func TestPostgresOnlyExampleRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs an example program")
	}
	db := testdb.New(t, "postgres")
	bin := filepath.Join(t.TempDir(), "pgwatermill")
	if out, err := exec.Command(goTool(t), "build", "-o", bin, "github.com/millpond/millpond/examples/pgwatermill").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-db", db.URL, "-n", "25").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "handled 25 of 25 messages") {
		t.Fatalf("pgwatermill: %v\n%s", err, out)
	}
}

// The library packages use the OpenTelemetry API only: the SDK and the
// Prometheus exporter belong to the application (the example, the tests).
func TestLibraryLinksNoTelemetrySDK(t *testing.T) {
	for _, pkg := range []string{"github.com/millpond/millpond/outbox", "github.com/millpond/millpond/bus", "github.com/millpond/millpond/fxmodule"} {
		out, err := exec.Command(goTool(t), "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "go.opentelemetry.io/otel/sdk") || strings.HasPrefix(dep, "go.opentelemetry.io/otel/exporters") ||
				strings.HasPrefix(dep, "github.com/prometheus/") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}
