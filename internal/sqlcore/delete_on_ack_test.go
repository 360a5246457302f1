package sqlcore

import (
	"strings"
	"testing"
)

// TestDeleteOnAckStatements: with deleteOnAck every acknowledgement
// statement deletes instead of marking delivered (both forms are built
// from one template, see settling), and Purge's event statement exists
// only then.
func TestDeleteOnAckStatements(t *testing.T) {
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		keep, del := buildStatements(d, false), buildStatements(d, true)
		acks := map[string][2]query{
			"ack": {keep.ack, del.ack}, "ackMark": {keep.ackMark, del.ackMark}, "ackAll": {keep.ackAll, del.ackAll},
			"ackNext": {keep.ackNext, del.ackNext}, "ackOrdered": {keep.ackOrdered, del.ackOrdered},
		}
		for name, q := range acks {
			k, x := q[0].text, q[1].text
			if k == "" || d == MySQL && name == "ack" {
				continue // not a statement of this dialect; MySQL's ack locks, ackMark settles
			}
			if strings.Contains(x, "'delivered'") || !strings.Contains(x, "DELETE FROM millpond_deliveries") && !strings.Contains(x, "DELETE d FROM") {
				t.Errorf("%s %s with deleteOnAck does not delete:\n%s", d, name, x)
			}
			if strings.Contains(k, "DELETE") {
				t.Errorf("%s %s without deleteOnAck deletes", d, name)
			}
		}
		if keep.purgeEvents.text != "" || del.purgeEvents.text == "" {
			t.Errorf("%s: purgeEvents is built only with deleteOnAck", d)
		}
	}
}
