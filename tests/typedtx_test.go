package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// probe is a program that hands a value to the outbox where a transaction
// is wanted.
const probe = `package probe

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millpond/millpond/outbox"
)

var (
	_ = context.Background
	_ *sql.DB
	_ pgx.Tx
	_ *pgxpool.Pool
)

func Probe(ctx context.Context, store *outbox.Store, db *sql.DB, conn *sql.Conn, stx *sql.Tx, pool *pgxpool.Pool, pconn *pgx.Conn, ptx pgx.Tx) {
	%s
}
`

// Transactions are typed: the compiler refuses a pool, a connection or a
// bare transaction where the outbox wants an outbox.Tx, and accepts the
// wrapped transactions.
func TestTransactionsAreTypedAtCompileTime(t *testing.T) {
	compiles := func(t *testing.T, body string) (bool, string) {
		t.Helper()
		dir := t.TempDir()
		src := filepath.Join(dir, "probe.go")
		if err := os.WriteFile(src, []byte(strings.Replace(probe, "%s", body, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		// The probe joins the module as a package of its own without
		// touching the working tree: go build -overlay.
		target, err := filepath.Abs(filepath.Join("typedtxprobe", "probe.go"))
		if err != nil {
			t.Fatal(err)
		}
		overlay, _ := json.Marshal(map[string]any{"Replace": map[string]string{target: src}})
		overlayPath := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(overlayPath, overlay, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(goTool(t), "build", "-overlay", overlayPath, "./typedtxprobe").CombinedOutput()
		return err == nil, string(out)
	}
	for _, good := range []string{
		`_, _ = store.Enqueue(ctx, outbox.SQLTx(stx), outbox.Event{})`,
		`_, _ = store.Enqueue(ctx, outbox.PgxTx(ptx), outbox.Event{})`,
		`_, _ = outbox.NewPublisher(store, outbox.PgxTx(ptx))`,
		`_ = outbox.ContextWithTx(ctx, outbox.SQLTx(stx))`,
		`_ = store.AcknowledgeInTx(ctx, outbox.PgxTx(ptx))`,
	} {
		if ok, out := compiles(t, good); !ok {
			t.Errorf("%s does not compile:\n%s", good, out)
		}
	}
	for _, bad := range []string{
		`_, _ = store.Enqueue(ctx, db, outbox.Event{})`,
		`_, _ = store.Enqueue(ctx, pool, outbox.Event{})`,
		`_, _ = store.Enqueue(ctx, stx, outbox.Event{})`,
		`_, _ = store.Enqueue(ctx, outbox.SQLTx(db), outbox.Event{})`,
		`_, _ = store.Enqueue(ctx, outbox.SQLTx(conn), outbox.Event{})`,
		`_, _ = store.Enqueue(ctx, outbox.PgxTx(pool), outbox.Event{})`,
		`_, _ = store.Enqueue(ctx, outbox.PgxTx(pconn), outbox.Event{})`,
		`_, _ = outbox.NewPublisher(store, pool)`,
		`_ = outbox.ContextWithTx(ctx, db)`,
		`_ = store.AcknowledgeInTx(ctx, stx)`,
		`_ = store.AcknowledgeMessageInTx(ctx, ptx, nil)`,
	} {
		ok, out := compiles(t, bad)
		if ok {
			t.Errorf("%s compiles; the outbox must refuse it at compile time", bad)
		} else if !strings.Contains(out, "cannot use") {
			t.Errorf("%s fails for another reason:\n%s", bad, out)
		}
	}
}
