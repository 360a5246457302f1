package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/millpond/millpond/outbox/sqlite"
)

// Opening a Store on an embedded SQLite file and installing its schema.
func ExampleOpen() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "millpond-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := sqlite.Open(ctx, "sqlite:"+filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(store.Dialect())
	// Output: sqlite
}
