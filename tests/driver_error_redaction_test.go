package tests

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	driver "github.com/go-sql-driver/mysql"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/outbox/mysql"
)

// TestMySQLValueErrorsQuoteNoMetadata: MySQL and MariaDB quote the
// offending bytes of a value their column cannot hold ("Incorrect string
// value: '\xF0\x9F\x98\x80 S...'"): a metadata value with a character
// outside the connection's character set (charset=utf8, three bytes at
// most) was quoted in Enqueue's and Publish's errors. The errors now hide
// the value and still give the driver's error to errors.As.
func TestMySQLValueErrorsQuoteNoMetadata(t *testing.T) {
	db := testdb.New(t, "mysql")
	db.Store(t) // migrated
	ctx := context.Background()
	s, err := mysql.Open(ctx, db.URL+"?charset=utf8")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const secret = "SECRET-token-7731"
	ev := outbox.Event{Stream: "s", Key: "k1", Kind: "K", Payload: []byte("x"),
		Metadata: map[string]string{"token": "\U0001F600" + secret}}
	err = s.InTx(ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
		_, err := s.Enqueue(ctx, outbox.SQLTx(tx), ev)
		return err
	})
	hidesMetadataValue(t, "enqueue", err, secret)
	pub, err := outbox.NewAutoCommitPublisher(s)
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage("k2", []byte("x"))
	msg.Metadata.Set("token", "\U0001F600"+secret)
	hidesMetadataValue(t, "publish", pub.Publish("s", msg), secret)
}

func hidesMetadataValue(t *testing.T, what string, err error, secret string) {
	t.Helper()
	var me *driver.MySQLError
	if !errors.As(err, &me) || me.Number != 1366 {
		t.Fatalf("%s: %v, want MySQL error 1366 (incorrect string value)", what, err)
	}
	for _, part := range []string{secret[:2], `\xF0\x9F\x98\x80`} {
		if strings.Contains(err.Error(), part) {
			t.Errorf("%s: the error quotes the metadata value (%q): %v", what, part, err)
		}
	}
	if !strings.Contains(err.Error(), "1366") || !strings.Contains(err.Error(), "metadata") {
		t.Errorf("%s: the error no longer says what failed: %v", what, err)
	}
	t.Logf("%s: %v", what, err)
}
