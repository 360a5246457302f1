package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/millpond/millpond/dsn"
)

func TestParseConfig(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }

	cfg, err := parseConfig(nil, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != ":8080" || cfg.DatabaseURL != "sqlite:orders.db" || cfg.Lease != 30*time.Second || cfg.HandlerDelay != 0 {
		t.Errorf("defaults: %+v", cfg)
	}

	env[envAddr], env[envDatabaseURL], env[envLease], env[envHandlerDelay] = ":9000", "postgres://u@h/db", "5s", "20ms"
	cfg, err = parseConfig(nil, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != ":9000" || cfg.DatabaseURL != "postgres://u@h/db" || cfg.Lease != 5*time.Second || cfg.HandlerDelay != 20*time.Millisecond {
		t.Errorf("from the environment: %+v", cfg)
	}

	cfg, err = parseConfig([]string{"-addr", "127.0.0.1:1", "-db", "sqlite:/data/x.db", "-lease", "2s"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "127.0.0.1:1" || cfg.DatabaseURL != "sqlite:/data/x.db" || cfg.Lease != 2*time.Second {
		t.Errorf("flags over the environment: %+v", cfg)
	}

	for _, args := range [][]string{{"-lease", "500ms"}, {"-lease", "2h"}, {"extra"}, {"-nope"}} {
		if _, err := parseConfig(args, getenv, io.Discard); err == nil {
			t.Errorf("%q: want an error", args)
		}
	}
	if _, err := parseConfig([]string{"-h"}, getenv, io.Discard); err != flag.ErrHelp {
		t.Errorf("-h: got %v, want flag.ErrHelp", err)
	}
	env[envHandlerDelay] = "soon"
	if _, err := parseConfig(nil, getenv, io.Discard); err == nil || !strings.Contains(err.Error(), envHandlerDelay) {
		t.Errorf("bad %s: got %v", envHandlerDelay, err)
	}
}

func TestDatabaseURLIsStrict(t *testing.T) {
	getenv := func(string) string { return "" }
	for _, good := range []string{"sqlite:o.db", "sqlite:///var/lib/o.db", "postgres://u@h:5432/d", "PostgreSQL://u@h/d",
		"mysql://root@127.0.0.1/db", "host=h user=u dbname=d"} {
		cfg, err := parseConfig([]string{"-db", good}, getenv, io.Discard)
		if err != nil || cfg.DatabaseURL != good {
			t.Errorf("-db %q: %v, %q", good, err, cfg.DatabaseURL)
		}
	}
	const secret = "pw-Unique-77"
	for _, bad := range []string{"orders.db", "/var/lib/o.db", "nonsense://", "postgress://u:" + secret + "@h/d",
		"u:" + secret + "@tcp(h:3306)/d", ""} {
		_, err := parseConfig([]string{"-db", bad}, getenv, io.Discard)
		if !errors.Is(err, dsn.ErrUnsupported) {
			t.Errorf("-db %q: got %v, want dsn.ErrUnsupported", dsn.Redact(bad), err)
		} else if strings.Contains(err.Error(), secret) {
			t.Errorf("-db %q: the error shows the password: %v", dsn.Redact(bad), err)
		}
	}
}

func TestRebindDollar(t *testing.T) {
	got := rebindDollar("UPDATE stock SET available = available - ? WHERE sku = ? AND available >= ?")
	if want := "UPDATE stock SET available = available - $1 WHERE sku = $2 AND available >= $3"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestValidatePlaceOrder(t *testing.T) {
	ok := placeOrderRequest{Customer: "  ada ", SKU: "widget", Qty: 3}
	if err := ok.validate(); err != nil || ok.Customer != "ada" {
		t.Errorf("valid request: %v, customer %q", err, ok.Customer)
	}
	for _, bad := range []placeOrderRequest{
		{SKU: "widget", Qty: 1},
		{Customer: strings.Repeat("x", maxCustomerLen+1), SKU: "widget", Qty: 1},
		{Customer: "a\nb", SKU: "widget", Qty: 1},
		{Customer: "ada", Qty: 1},
		{Customer: "ada", SKU: "wid get", Qty: 1},
		{Customer: "ada", SKU: "widget"},
		{Customer: "ada", SKU: "widget", Qty: -1},
		{Customer: "ada", SKU: "widget", Qty: maxQty + 1},
	} {
		if err := bad.validate(); err == nil {
			t.Errorf("%+v: want an error", bad)
		}
	}
}

func TestDBTimeScan(t *testing.T) {
	want := time.Date(2025, 3, 4, 5, 6, 7, 123456000, time.UTC)
	for _, src := range []any{
		want,
		want.In(time.FixedZone("x", 3600)),
		[]byte("2025-03-04 05:06:07.123456"),
		"2025-03-04 05:06:07.123456+00:00",
		"2025-03-04T05:06:07.123456Z",
	} {
		var got dbTime
		if err := got.Scan(src); err != nil || !got.Equal(want) {
			t.Errorf("Scan(%v) = %v, %v; want %v", src, got.Time, err, want)
		}
	}
	var n nullDBTime
	if err := n.Scan(nil); err != nil || n.Valid {
		t.Errorf("Scan(nil) = %+v, %v", n, err)
	}
	var bad dbTime
	if err := bad.Scan(42); err == nil {
		t.Error("Scan(42): want an error")
	}
}
