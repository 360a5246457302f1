package sqlcore

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var updateGoose = flag.Bool("update-goose", false, "rewrite migrations/goose from the golang-migrate files")

// gooseDir holds the goose copy of each dialect's migrations.
const gooseDir = "migrations/goose"

// splitMigrate splits a golang-migrate script into statements the way the
// database runs it: a statement ends at a line ending in ';' outside a
// dollar-quoted ($$) body. Leading comment lines are dropped.
func splitMigrate(script string) []string {
	var out []string
	var cur []string
	inDollar := false
	for _, line := range strings.Split(script, "\n") {
		trimmed := strings.TrimSpace(line)
		if len(cur) == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "--")) {
			continue
		}
		cur = append(cur, strings.TrimRight(line, " \t\r"))
		if strings.Count(line, "$$")%2 == 1 {
			inDollar = !inDollar
		}
		if !inDollar && strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.Join(cur, "\n"))
			cur = nil
		}
	}
	if len(cur) > 0 {
		out = append(out, strings.Join(cur, "\n")) // unterminated: compared as is
	}
	return out
}

// parseGoose reads a goose migration the way goose's SQL parser does: an
// -- +goose Up section, then an -- +goose Down section; statements end at
// a line ending in ';' unless they sit between StatementBegin and
// StatementEnd. It reports structural errors goose would reject or that
// would run different statements.
func parseGoose(text string) (up, down []string, err error) {
	const (
		start = iota
		inUp
		inDown
	)
	state := start
	block := false
	var cur []string
	emit := func() {
		stmt := strings.Join(cur, "\n")
		cur = nil
		if state == inUp {
			up = append(up, stmt)
		} else {
			down = append(down, stmt)
		}
	}
	for n, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") && strings.Contains(trimmed, "+goose") {
			switch strings.TrimSpace(strings.TrimPrefix(trimmed, "--")) {
			case "+goose Up":
				if state != start || block || len(cur) > 0 {
					return nil, nil, fmt.Errorf("line %d: unexpected Up", n+1)
				}
				state = inUp
			case "+goose Down":
				if state != inUp || block || len(cur) > 0 {
					return nil, nil, fmt.Errorf("line %d: Down must follow a complete Up section", n+1)
				}
				state = inDown
			case "+goose StatementBegin":
				if state == start || block || len(cur) > 0 {
					return nil, nil, fmt.Errorf("line %d: misplaced StatementBegin", n+1)
				}
				block = true
			case "+goose StatementEnd":
				if !block || len(cur) == 0 {
					return nil, nil, fmt.Errorf("line %d: StatementEnd without a statement", n+1)
				}
				block = false
				emit()
			default:
				return nil, nil, fmt.Errorf("line %d: unknown annotation %q", n+1, trimmed)
			}
			continue
		}
		if len(cur) == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "--")) {
			continue
		}
		if state == start {
			return nil, nil, fmt.Errorf("line %d: statement before -- +goose Up", n+1)
		}
		cur = append(cur, strings.TrimRight(line, " \t\r"))
		if !block && strings.HasSuffix(trimmed, ";") {
			emit()
		}
	}
	if block || len(cur) > 0 {
		return nil, nil, fmt.Errorf("unterminated statement at end of file")
	}
	if state != inDown {
		return nil, nil, fmt.Errorf("missing -- +goose Down section")
	}
	return up, down, nil
}

// renderGoose writes a migration in goose's annotated form; statements with
// a dollar-quoted body are wrapped in StatementBegin/StatementEnd.
func renderGoose(m Migration) string {
	var b strings.Builder
	section := func(annotation, script string) {
		b.WriteString("-- +goose " + annotation + "\n")
		for _, stmt := range splitMigrate(script) {
			if strings.Contains(stmt, "$$") {
				b.WriteString("-- +goose StatementBegin\n" + stmt + "\n-- +goose StatementEnd\n")
			} else {
				b.WriteString(stmt + "\n")
			}
		}
	}
	b.WriteString("-- Generated from the golang-migrate files of this dialect; keep in step\n")
	b.WriteString("-- (go test ./internal/sqlcore -run TestGooseMigrations -update-goose).\n\n")
	section("Up", m.Up)
	b.WriteString("\n")
	section("Down", m.Down)
	return b.String()
}

// TestGooseMigrations fails when the goose migrations drift from the
// golang-migrate ones: same versions and names, same statements in the same
// order once goose's annotations are stripped, and every dollar-quoted body
// kept whole.
func TestGooseMigrations(t *testing.T) {
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		t.Run(string(d), func(t *testing.T) {
			want, err := LoadMigrations(d)
			if err != nil {
				t.Fatal(err)
			}
			if len(want) == 0 {
				t.Fatal("no golang-migrate migrations")
			}
			dir := path.Join(gooseDir, string(d))
			if *updateGoose {
				if err := os.RemoveAll(filepath.FromSlash(dir)); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(filepath.FromSlash(dir), 0o755); err != nil {
					t.Fatal(err)
				}
				for _, m := range want {
					name := fmt.Sprintf("%05d_%s.sql", m.Version, m.Name)
					if err := os.WriteFile(filepath.Join(filepath.FromSlash(dir), name), []byte(renderGoose(m)), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				t.Logf("rewrote %s; rebuild to embed it", dir)
				return
			}
			entries, err := fs.ReadDir(Migrations, dir)
			if err != nil {
				t.Fatalf("read %s: %v", dir, err)
			}
			var files []string
			for _, e := range entries {
				if !e.IsDir() && strings.HasSuffix(e.Name(), ".sql") {
					files = append(files, e.Name())
				}
			}
			if len(files) != len(want) {
				t.Fatalf("%s has %d files, golang-migrate has %d migrations", dir, len(files), len(want))
			}
			for i, name := range files {
				m := want[i]
				num, title, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
				version, verr := strconv.Atoi(num)
				if !ok || verr != nil || version != m.Version || title != m.Name {
					t.Errorf("%s: want version %d named %q", name, m.Version, m.Name)
					continue
				}
				body, err := fs.ReadFile(Migrations, path.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				up, down, err := parseGoose(string(body))
				if err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				compare(t, name+" Up", up, splitMigrate(m.Up))
				compare(t, name+" Down", down, splitMigrate(m.Down))
			}
		})
	}
}

func compare(t *testing.T, label string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d statements, golang-migrate has %d (run go test ./internal/sqlcore -run TestGooseMigrations -update-goose)", label, len(got), len(want))
		return
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%s: statement %d differs:\ngoose:\n%s\ngolang-migrate:\n%s", label, i+1, got[i], want[i])
		}
	}
}

// TestGooseParserCatchesDrift makes sure the drift check can fail.
func TestGooseParserCatchesDrift(t *testing.T) {
	fn := "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$\nBEGIN\n    RETURN NULL;\nEND\n$$;"
	m := Migration{Up: "CREATE TABLE a (x INT);\n" + fn + "\n", Down: "DROP TABLE a;\n"}
	up, down, err := parseGoose(renderGoose(m))
	if err != nil {
		t.Fatal(err)
	}
	if len(up) != 2 || up[1] != fn || len(down) != 1 {
		t.Fatalf("rendered goose parses to %q / %q", up, down)
	}
	// Without StatementBegin/End goose would split the function body.
	unwrapped := "-- +goose Up\nCREATE TABLE a (x INT);\n" + fn + "\n-- +goose Down\nDROP TABLE a;\n"
	up, _, err = parseGoose(unwrapped)
	if err != nil {
		t.Fatal(err)
	}
	if len(up) == 2 {
		t.Fatal("a function body without StatementBegin/End was kept whole")
	}
	for _, bad := range []string{
		"CREATE TABLE a (x INT);\n-- +goose Up\n-- +goose Down\n",
		"-- +goose Up\nCREATE TABLE a (x INT);\n",
		"-- +goose Down\n-- +goose Up\n",
		"-- +goose Up\n-- +goose StatementBegin\nSELECT 1;\n-- +goose Down\n",
		"-- +goose Up\nCREATE TABLE a (x INT)\n-- +goose Down\n",
		"-- +goose Up\n-- +goose NO TRANSACTION\n-- +goose Down\n",
	} {
		if _, _, err := parseGoose(bad); err == nil {
			t.Errorf("parseGoose accepted:\n%s", bad)
		}
	}
}
