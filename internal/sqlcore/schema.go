package sqlcore

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// schemaTables are the tables the store's statements read and write.
const schemaTables = "'millpond_events', 'millpond_deliveries', 'millpond_ordering', 'millpond_subscriptions'"

// SchemaColumnsSQL lists "table.column" for every column of schemaTables
// that the connection sees (PostgreSQL through the search path, as the
// statements resolve them; MySQL in the current database).
var SchemaColumnsSQL = map[Dialect]string{
	Postgres: `SELECT c.relname || '.' || a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.oid IN (SELECT to_regclass(t) FROM unnest(ARRAY[` + schemaTables + `]) AS t) AND a.attnum > 0 AND NOT a.attisdropped`,
	MySQL: `SELECT CONCAT(TABLE_NAME, '.', COLUMN_NAME) FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (` + schemaTables + `)`,
	SQLite: `SELECT m.name || '.' || p.name FROM sqlite_master m, pragma_table_info(m.name) p
WHERE m.type = 'table' AND m.name IN (` + schemaTables + `)`,
}

// SchemaColumns are the columns of the newest schema, per dialect, as
// "table.column": what the store's statements need. A test compares them
// with a freshly migrated database, so a migration that adds a column must
// add it here.
var SchemaColumns = map[Dialect][]string{
	Postgres: append(commonSchemaColumns(), "millpond_deliveries.settled"),
	MySQL:    append(commonSchemaColumns(), "millpond_deliveries.blocked_seq", "millpond_deliveries.phase"),
	SQLite:   commonSchemaColumns(),
}

func commonSchemaColumns() []string {
	var out []string
	for table, cols := range map[string]string{
		"millpond_events":        "id created_at stream event_key event_kind content_hash metadata payload",
		"millpond_deliveries":    "id event_id available_at delivered_at ordering_seq attempts key_released stream consumer_group status ordering_key claim_key claimed_by last_error",
		"millpond_ordering":      "stream consumer_group ordering_key last_seq unsettled",
		"millpond_subscriptions": "stream consumer_group event_kind created_at",
	} {
		for _, col := range strings.Fields(cols) {
			out = append(out, table+"."+col)
		}
	}
	slices.Sort(out)
	return out
}

// CheckSchema reports whether the database holds the schema this version
// of the store needs: every column of SchemaColumns. When some are
// missing the error wraps ErrSchemaOutdated and names them (schema names
// only, nothing from the rows).
func (c *Core) CheckSchema(ctx context.Context) error {
	rows, err := c.db.QueryContext(ctx, SchemaColumnsSQL[c.dialect])
	if err != nil {
		return fmt.Errorf("read the schema: %w", err)
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var col string
		if err := rows.Scan(&col); err != nil {
			return fmt.Errorf("read the schema: %w", err)
		}
		have[col] = true
	}
	if err := rowsErr(rows); err != nil {
		return fmt.Errorf("read the schema: %w", err)
	}
	var missing []string
	for _, col := range SchemaColumns[c.dialect] {
		if !have[col] {
			missing = append(missing, col)
		}
	}
	switch {
	case len(have) == 0:
		return fmt.Errorf("%w: %w", ErrSchemaOutdated, ErrSchemaNotInstalled)
	case len(missing) > 0:
		return fmt.Errorf("%w: missing %s", ErrSchemaOutdated, strings.Join(missing, ", "))
	}
	return nil
}
