package sqlcore

import (
	"fmt"
	"strings"
)

// Dialect names a supported database.
type Dialect string

// The supported dialects.
const (
	Postgres Dialect = "postgres"
	MySQL    Dialect = "mysql"
	SQLite   Dialect = "sqlite"
)

// Valid reports whether d is a supported dialect.
func (d Dialect) Valid() bool { return d == Postgres || d == MySQL || d == SQLite }

// nowExpr is the database clock in microseconds since the Unix epoch. Each is
// constant within one statement.
func (d Dialect) nowExpr() string {
	switch d {
	case Postgres:
		return "CAST(EXTRACT(EPOCH FROM now()) * 1000000 AS BIGINT)"
	case MySQL:
		return "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS SIGNED)"
	default:
		return "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
	}
}

// query is a statement compiled for one dialect from a template with @name
// parameters. @now stands for the injected clock or, when none is injected,
// the database clock.
type query struct {
	text  string
	names []string // argument order for positional dialects, or by $n for Postgres
}

// compile turns a template into dialect SQL. In PostgreSQL each distinct name
// becomes one $n; in MySQL and SQLite every occurrence becomes ? and the
// argument is repeated.
func (d Dialect) compile(template string) query {
	var b strings.Builder
	var names []string
	index := map[string]int{}
	for i := 0; i < len(template); i++ {
		c := template[i]
		if c != '@' {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(template) && (template[j] == '_' || template[j] >= 'a' && template[j] <= 'z' || template[j] >= '0' && template[j] <= '9') {
			j++
		}
		name := template[i+1 : j]
		i = j - 1
		placeholder := ""
		if d == Postgres {
			n, ok := index[name]
			if !ok {
				names = append(names, name)
				n = len(names)
				index[name] = n
			}
			placeholder = fmt.Sprintf("$%d", n)
		} else {
			names = append(names, name)
			placeholder = "?"
		}
		if name == "now" {
			cast := placeholder
			if d == Postgres {
				cast += "::BIGINT"
			}
			placeholder = "COALESCE(" + cast + ", " + d.nowExpr() + ")"
		}
		b.WriteString(placeholder)
	}
	return query{text: b.String(), names: names}
}

// args orders the named values for the compiled statement. A missing name is
// a programming error and panics in tests before any release.
func (q query) args(values map[string]any) []any {
	out := make([]any, len(q.names))
	for i, name := range q.names {
		v, ok := values[name]
		if !ok {
			panic("sqlcore: statement parameter @" + name + " has no value")
		}
		out[i] = v
	}
	return out
}
