package anydb_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/millpond/millpond/outbox/anydb"
)

// Opening a Store on an address taken from configuration, whatever its
// database: a postgres:// or mysql:// URL, a PostgreSQL key=value string,
// or sqlite:path as here.
func ExampleOpen() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "millpond-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := anydb.Open(ctx, "sqlite:"+filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err) // the error never holds the address's password
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(store.Dialect())
	// Output: sqlite
}
