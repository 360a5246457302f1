package sqlcore

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// The fuzz targets below check each input bound against an independent
// oracle. They run their seed corpus as normal tests; explore further with
// e.g. go test -fuzz=FuzzValidateKey ./internal/sqlcore

var keyOracle = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{
		"", "a", "orders", "Order.Placed", "tenant-1:orders_v2", strings.Repeat("k", 128), strings.Repeat("k", 129),
		"a b", "a/b", "a\x00", "é", "k\n", "'; DROP TABLE millpond_outbox; --", "%", "@now", "\xff", "日本",
		"0123456789abcdef0123456789abcdef", ".", "-", ":", "_",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidateKey("stream", s)
		want := keyOracle.MatchString(s)
		if (err == nil) != want {
			t.Fatalf("ValidateKey(%q) = %v, oracle accepts: %v", s, err, want)
		}
		if err != nil && !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("ValidateKey(%q) error %v does not wrap ErrInvalidKey", s, err)
		}
		// The default group is the only empty group.
		gerr := ValidateGroup(s)
		if (gerr == nil) != (want || s == "") {
			t.Fatalf("ValidateGroup(%q) = %v", s, gerr)
		}
	})
}

func FuzzErrorText(f *testing.F) {
	for _, s := range []string{
		"", " ", "boom", "line\nbreak", "tab\there", "\x00", "\x7f", "\u0085", "\u200b", "\xff\xfe", "é",
		strings.Repeat("x", 512), strings.Repeat("x", 513), strings.Repeat("é", 256), strings.Repeat("é", 257),
		strings.Repeat("€", 171), strings.Repeat("😀", 129), "  padded  ", "\u00a0nbsp\u00a0", strings.Repeat(" ", 600) + "x",
		strings.Repeat("a", 511) + " b", "panic: runtime error\n\tgoroutine 1 [running]:",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		valid := ValidateErrorText(s)
		oracle := s != "" && len(s) <= MaxErrorBytes && utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
		if (valid == nil) != oracle {
			t.Fatalf("ValidateErrorText(%q) = %v, oracle accepts: %v", s, valid, oracle)
		}
		if valid != nil && !errors.Is(valid, ErrInvalidErrorText) {
			t.Fatalf("ValidateErrorText(%q) error %v does not wrap ErrInvalidErrorText", s, valid)
		}
		clean := SanitizeErrorText(s)
		if err := ValidateErrorText(clean); err != nil {
			t.Fatalf("SanitizeErrorText(%q) = %q, which ValidateErrorText refuses: %v", s, clean, err)
		}
		if err := (Failure{Reason: clean, MaxAttempts: 1}).Validate(); err != nil {
			t.Fatalf("Failure with sanitized text %q refused: %v", clean, err)
		}
		// Valid text without surrounding space is kept as it is.
		if valid == nil && strings.TrimSpace(s) == s && clean != s {
			t.Fatalf("SanitizeErrorText changed valid text %q to %q", s, clean)
		}
		if len(clean) > MaxErrorBytes {
			t.Fatalf("sanitized text is %d bytes", len(clean))
		}
	})
}

func FuzzEventBounds(f *testing.F) {
	f.Add("orders", "k1", "Order.Placed", 10, "trace", "v", 1, int64(0))
	f.Add("orders", "k1", "Order.Placed", MaxPayloadBytes, "trace", "v", 1, int64(0))
	f.Add("orders", "k1", "Order.Placed", MaxPayloadBytes+1, "trace", "v", 1, int64(0))
	f.Add("orders", "k1", "Order.Placed", 0, "", "v", 1, int64(0))
	f.Add("orders", "k1", "Order.Placed", 0, "big", "vvvvvvvv", MaxMetadataBytes/8, int64(0))
	f.Add("orders", "k1", "Order.Placed", 0, "big", "\x00", MaxMetadataBytes/6, int64(0))
	f.Add("orders", "k1", "Order.Placed", 0, "k", "é", MaxMetadataBytes, int64(0))
	f.Add("orders", "k1", "Order.Placed", 0, "k", "v", 1, int64(MaxDelay))
	f.Add("orders", "k1", "Order.Placed", 0, "k", "v", 1, int64(MaxDelay)+1)
	f.Add("orders", "k1", "Order.Placed", 0, "k", "v", 1, int64(-1))
	f.Add("", "k1", "Order.Placed", 0, "k", "v", 1, int64(0))
	f.Add("orders", "bad key", "Order.Placed", 0, "k", "v", 1, int64(0))
	f.Add("orders", "k1", strings.Repeat("K", 129), 0, "k", "v", 1, int64(0))
	f.Fuzz(func(t *testing.T, stream, key, kind string, payloadLen int, mdKey, mdValue string, repeat int, delay int64) {
		if payloadLen < 0 || payloadLen > MaxPayloadBytes+16 || repeat < 0 || repeat > 2*MaxMetadataBytes || len(mdValue)*repeat > 4*MaxMetadataBytes {
			t.Skip()
		}
		ev := Event{Stream: stream, Key: key, Kind: kind, Payload: make([]byte, payloadLen),
			Metadata: map[string]string{mdKey: strings.Repeat(mdValue, repeat)}, Delay: time.Duration(delay)}
		var want error
		switch {
		case !keyOracle.MatchString(stream), !keyOracle.MatchString(key), !keyOracle.MatchString(kind):
			want = ErrInvalidKey
		case payloadLen > MaxPayloadBytes:
			want = ErrPayloadTooLarge
		case mdKey == "":
			want = ErrInvalidMetadata
		case delay < 0 || time.Duration(delay) > MaxDelay:
			want = ErrInvalidDelay
		}
		err := ev.Validate()
		if want == nil && err != nil || want != nil && !errors.Is(err, want) {
			t.Fatalf("Validate: got %v, want %v", err, want)
		}
		// The metadata bound is on the stored JSON.
		stored, _ := json.Marshal(ev.Metadata)
		text, err := encodeMetadata(ev.Metadata)
		if len(stored) > MaxMetadataBytes {
			if !errors.Is(err, ErrInvalidMetadata) {
				t.Fatalf("metadata of %d JSON bytes accepted: %v", len(stored), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("metadata of %d JSON bytes refused: %v", len(stored), err)
		}
		back, err := decodeMetadata(text)
		if err != nil {
			t.Fatal(err)
		}
		// JSON replaces invalid UTF-8, so only valid text round-trips exactly.
		if utf8.ValidString(mdKey) && utf8.ValidString(mdValue) && !maps.Equal(back, ev.Metadata) {
			t.Fatalf("metadata round trip: %q became %q", ev.Metadata, back)
		}
	})
}

func FuzzReceiptBounds(f *testing.F) {
	for _, s := range []string{"", "0123456789abcdef0123456789abcdef", "0123456789ABCDEF0123456789ABCDEF", strings.Repeat("a", 31), strings.Repeat("a", 33), strings.Repeat("g", 32), "' OR 1=1 --"} {
		f.Add(int64(1), s)
		f.Add(int64(0), s)
	}
	f.Add(int64(-1), "0123456789abcdef0123456789abcdef")
	hex := regexp.MustCompile(`^[0-9a-f]{32}$`)
	f.Fuzz(func(t *testing.T, id int64, key string) {
		err := ValidateReceipt(Receipt{ID: id, ClaimKey: key})
		switch {
		case id <= 0:
			if !errors.Is(err, ErrInvalidID) {
				t.Fatalf("id %d: %v", id, err)
			}
		case !hex.MatchString(key):
			if !errors.Is(err, ErrInvalidClaimKey) {
				t.Fatalf("claim key %q: %v", key, err)
			}
		default:
			if err != nil {
				t.Fatalf("valid receipt refused: %v", err)
			}
		}
		r := Receipt{ID: id, ClaimKey: key}
		want := fmt.Sprintf("Receipt{ID:%d ClaimKey:[REDACTED]}", id)
		for _, got := range []string{fmt.Sprintf("%v", r), fmt.Sprintf("%+v", r), fmt.Sprintf("%#v", r), r.String()} {
			if got != want {
				t.Fatalf("receipt prints as %q, want %q", got, want)
			}
		}
	})
}

func FuzzNumericBounds(f *testing.F) {
	for _, v := range []int64{0, 1, -1, 99, 100, 101, 999, 1000, 1001, int64(time.Second) - 1, int64(time.Second), int64(time.Hour), int64(time.Hour) + 1, int64(MaxDelay), int64(MaxDelay) + 1, 1 << 62, -1 << 62} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v int64) {
		d := time.Duration(v)
		check := func(name string, err error, ok bool, sentinel error) {
			t.Helper()
			if (err == nil) != ok || err != nil && !errors.Is(err, sentinel) {
				t.Fatalf("%s(%d) = %v, want ok=%v", name, v, err, ok)
			}
		}
		check("ValidateLease", ValidateLease(d), d >= time.Second && d <= time.Hour, ErrInvalidLease)
		check("ValidateDelay", ValidateDelay(d), d >= 0 && d <= 24*time.Hour, ErrInvalidDelay)
		if v >= -1<<31 && v < 1<<31 {
			n := int(v)
			check("ValidateAttempts", ValidateAttempts(n), n >= 1 && n <= 100, ErrInvalidAttempts)
			check("ValidateBatch", ValidateBatch(n), n >= 1 && n <= 1000, ErrInvalidBatch)
		}
	})
}

// placeholderOracle finds every @name of a template the way the statement
// templates are written: @ then lowercase letters, digits or underscores.
var placeholderOracle = regexp.MustCompile(`@[a-z0-9_]*`)

func FuzzCompile(f *testing.F) {
	for _, s := range []string{
		"SELECT @now",
		"SELECT 1",
		"",
		"@",
		"@@",
		"@a@b@a",
		"UPDATE t SET a = @x, b = @y WHERE c = @x AND d = @now AND e = @now",
		"x@now_y @now",
		"@A @é @1 @_",
		"SELECT '$1', ? FROM t WHERE a = @a",
		"WHERE (id, claim_key) IN ({pairs}) AND @stream = @stream",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, template string) {
		locs := placeholderOracle.FindAllStringIndex(template, -1)
		var occurrences []string
		for _, l := range locs {
			occurrences = append(occurrences, template[l[0]+1:l[1]])
		}
		for _, d := range []Dialect{Postgres, MySQL, SQLite} {
			q := d.compile(template)
			// Rebuild the expected text independently of compile.
			number := map[string]int{}
			var distinct []string
			var b strings.Builder
			last := 0
			for i, l := range locs {
				b.WriteString(template[last:l[0]])
				last = l[1]
				name := occurrences[i]
				ph := "?"
				if d == Postgres {
					if _, ok := number[name]; !ok {
						distinct = append(distinct, name)
						number[name] = len(distinct)
					}
					ph = fmt.Sprintf("$%d", number[name])
				}
				if name == "now" {
					if d == Postgres {
						ph += "::BIGINT"
					}
					ph = "COALESCE(" + ph + ", " + d.nowExpr() + ")"
				}
				b.WriteString(ph)
			}
			b.WriteString(template[last:])
			if q.text != b.String() {
				t.Fatalf("%s: compile(%q) =\n%q\nwant\n%q", d, template, q.text, b.String())
			}
			wantNames := occurrences
			if d == Postgres {
				wantNames = distinct
			}
			if strings.Join(q.names, ",") != strings.Join(wantNames, ",") || len(q.names) != len(wantNames) {
				t.Fatalf("%s: names %q, want %q", d, q.names, wantNames)
			}
			if strings.Count(q.text, "@") != 0 {
				t.Fatalf("%s: compiled text keeps an @: %q", d, q.text)
			}
			// args orders the values so that the i-th placeholder gets its
			// own name's value.
			values := map[string]any{}
			for _, n := range occurrences {
				values[n] = "v:" + n
			}
			args := q.args(values)
			for i, a := range args {
				if a != "v:"+q.names[i] {
					t.Fatalf("%s: argument %d is %v, want the value of %q", d, i, a, q.names[i])
				}
			}
		}
	})
}

// TestStatementsBindEveryParameter compiles every statement of every
// dialect and checks that each names only parameters its caller supplies:
// a missing value panics in args.
func TestStatementsBindEveryParameter(t *testing.T) {
	known := map[string]bool{}
	for _, n := range []string{"now", "stream", "group", "key", "kind", "payload", "metadata", "hash", "delay", "worker",
		"limit", "max", "lease", "ids", "keys", "id", "reason", "all_groups", "after", "horizon", "expires",
		"hold", "okey", "seq", "status", "head", "streams", "groups", "okeys", "eid", "secret", "key_bytes"} {
		known[n] = true
	}
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		s := newStatements(d)
		for name, q := range map[string]query{
			"enqueue": s.enqueue, "existing": s.existing, "claim": s.claim, "claimDue": s.claimDue, "claimSelect": s.claimSelect, "claimDead": s.claimDead,
			"ack": s.ack, "ackMark": s.ackMark, "ackAll": s.ackAll, "fail": s.fail, "failStatus": s.failStatus, "extend": s.extend, "extendCheck": s.extendCheck,
			"release": s.release, "requeue": s.requeue, "listDead": s.listDead, "purgeSelect": s.purgeSelect, "purgeCount": s.purgeCount, "stats": s.stats,
			"register": s.register, "unregister": s.unregister, "now": s.now,
			"enqueueOrdered": s.enqueueOrdered, "enqueueOrderedNotify": s.enqueueOrderedNotify, "orderedGroups": s.orderedGroups,
			"bumpKey": s.bumpKey, "keyState": s.keyState, "insertOrdered": s.insertOrdered, "unbumpKey": s.unbumpKey,
			"ackOrdered": s.ackOrdered, "failSkip": s.failSkip, "releaseKeys": s.releaseKeys, "keyUnsettled": s.keyUnsettled,
			"promoteKeys": s.promoteKeys, "nextBlocked": s.nextBlocked, "promoteIDs": s.promoteIDs, "orderedDead": s.orderedDead, "requeueHead": s.requeueHead, "rejoinKey": s.rejoinKey,
			"requeueRejoined": s.requeueRejoined, "deadOrdering": s.deadOrdering,
			"ackNext": s.ackNext, "promoteNext": s.promoteNext, "nextBlockedDue": s.nextBlockedDue, "handOverIDs": s.handOverIDs, "lockBlocked": s.lockBlocked,
			"insertEvent": s.insertEvent, "eventsByID": s.eventsByID, "eventsOf": s.eventsOf, "deleteDeliveries": s.deleteDeliveries,
			"lockEvents": s.lockEvents, "dropOrphans": s.dropOrphans, "copyToGroup": s.copyToGroup, "deadKind": s.deadKind,
		} {
			for _, n := range q.names {
				if !known[n] {
					t.Errorf("%s %s: unexpected parameter @%s", d, name, n)
				}
			}
			if strings.Contains(q.text, "@") {
				t.Errorf("%s %s: uncompiled @ in %q", d, name, q.text)
			}
		}
	}
}

// TestInvalidKeyErrorQuotesNothingOfTheValue: a stream, key or ordering key
// may carry customer data, and the error refusing one is returned to code
// that logs it, so, like the seed's, it names the field and the rule but
// shows nothing of the value, not even the offending character.
func TestInvalidKeyErrorQuotesNothingOfTheValue(t *testing.T) {
	for _, v := range []string{"ada@example", "ada;lovelace", "adé", "ada/1", "ada\x00", "ada#"} {
		err := ValidateKey("event key", v)
		if !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("ValidateKey(%q) = %v, want ErrInvalidKey", v, err)
		}
		bad := strings.TrimLeft(v, "ad")
		r, _ := utf8.DecodeRuneInString(bad)
		for _, shown := range []string{string(r), fmt.Sprintf("%q", bad[0]), fmt.Sprintf("%q", r), fmt.Sprintf("%x", bad[0])} {
			if strings.Contains(err.Error(), shown) {
				t.Errorf("ValidateKey(%q): the error shows %s of the value: %v", v, shown, err)
			}
		}
	}
}
