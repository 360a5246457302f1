package dsn_test

import (
	"errors"
	"fmt"

	"github.com/millpond/millpond/dsn"
)

// Parse tells an address's dialect; its String, and Redact, hide the
// password wherever the address is printed or logged.
func ExampleParse() {
	a, err := dsn.Parse("postgres://app:s3cret@db:5432/app?sslmode=disable")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(a.Dialect)
	fmt.Println(a)

	_, err = dsn.Parse("app.db") // a bare file name is refused, never guessed
	fmt.Println(errors.Is(err, dsn.ErrUnsupported))
	// Output:
	// postgres
	// postgres://app:xxxxx@db:5432/app?sslmode=disable
	// true
}

func ExampleRedact() {
	fmt.Println(dsn.Redact("host=db user=app password=s3cret dbname=app"))
	fmt.Println(dsn.Redact("app:s3cret@tcp(db:3306)/app"))
	// Output:
	// host=db user=app password=xxxxx dbname=app
	// app:xxxxx@tcp(db:3306)/app
}
