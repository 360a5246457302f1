package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/fxmodule"
	"github.com/millpond/millpond/outbox"
)

// config is the service's configuration from flags and environment.
type config struct {
	// Addr is the HTTP listen address.
	Addr string
	// DatabaseURL is given to anydb.Open.
	DatabaseURL string
	// Lease is the outbox lease of every handler's claims.
	Lease time.Duration
	// HandlerDelay makes every handler sleep before its work (tests only).
	HandlerDelay time.Duration
	// AdminActions turns on the admin UI's actions (requeue, reroute, discard, unregister);
	// without it /admin/ is read-only.
	AdminActions bool
	// StatsInterval is how long one Stats snapshot feeds /metrics' backlog
	// gauges and /readyz.
	StatsInterval time.Duration
}

// Environment variables read as flag defaults.
const (
	envAddr        = "ORDERS_ADDR"
	envDatabaseURL = "ORDERS_DATABASE_URL"

	// defaultDatabaseURL is the zero-set-up database when neither -db nor
	// the environment names one.
	defaultDatabaseURL = "sqlite:orders.db"
	envLease           = "ORDERS_LEASE"
	envHandlerDelay    = "ORDERS_HANDLER_DELAY"
	envAdminActions    = "ORDERS_ADMIN_ACTIONS"
)

// parseConfig reads flags over environment variables over defaults.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	or := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	duration := func(name string, def time.Duration) (time.Duration, error) {
		v := getenv(name)
		if v == "" {
			return def, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		return d, nil
	}
	lease, err := duration(envLease, 30*time.Second)
	if err != nil {
		return config{}, err
	}
	delay, err := duration(envHandlerDelay, 0)
	if err != nil {
		return config{}, err
	}

	var cfg config
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Addr, "addr", or(envAddr, ":8080"), "HTTP listen address (env "+envAddr+")")
	fs.StringVar(&cfg.DatabaseURL, "db", or(envDatabaseURL, defaultDatabaseURL),
		"database: sqlite:path, a postgres:// or mysql:// URL, or a PostgreSQL key=value string (env "+envDatabaseURL+")")
	fs.DurationVar(&cfg.Lease, "lease", lease, "outbox lease of each handler's claims, 1s-1h (env "+envLease+")")
	fs.BoolVar(&cfg.AdminActions, "admin-actions", getenv(envAdminActions) == "1",
		"allow the admin UI at /admin/ to requeue, reroute and discard dead letters and unregister groups; it is read-only without (env "+envAdminActions+"=1)")
	fs.DurationVar(&cfg.StatsInterval, "stats-interval", outbox.DefaultStatsInterval,
		"how long one backlog query serves /metrics and /readyz (at most one query per interval)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	cfg.HandlerDelay = delay
	if cfg.Lease < outbox.MinLease || cfg.Lease > outbox.MaxLease {
		return config{}, fmt.Errorf("lease %s is outside %s-%s", cfg.Lease, outbox.MinLease, outbox.MaxLease)
	}
	if cfg.HandlerDelay < 0 {
		return config{}, fmt.Errorf("%s %s is negative", envHandlerDelay, cfg.HandlerDelay)
	}
	// Only a missing -db falls back to SQLite; anything given must be a
	// database address of a known form (never a file named after it).
	if _, err := dsn.Parse(cfg.DatabaseURL); err != nil {
		return config{}, fmt.Errorf("-db: %w", err)
	}
	return cfg, nil
}

// newLogger returns the application's zap logger.
func newLogger(lc fx.Lifecycle) (*zap.Logger, error) {
	log, err := zap.NewProduction()
	if err != nil {
		return nil, fmt.Errorf("orders: build logger: %w", err)
	}
	log = log.With(zap.String("service", "orders"))
	// Sync errors on a terminal's stderr are expected; ignore them.
	lc.Append(fx.StopHook(func() { _ = log.Sync() }))
	return log, nil
}

// newApp assembles the fx application.
func newApp(cfg config) *fx.App {
	return fx.New(
		fx.Supply(cfg),
		fx.Provide(newLogger),
		fx.Supply(fxmodule.Config{
			DatabaseURL:   cfg.DatabaseURL,
			AutoMigrate:   true,
			StatsInterval: cfg.StatsInterval,
			Bus: bus.Config{
				Subscriber:  subscriberDefaults(cfg),
				OtherGroups: groupNames, // served next to the bus, on its router
			},
		}),
		fxmodule.Module,
		fxmodule.WithZapLogger(),
		fx.Provide(
			newTelemetry,
			newDomain,
			newWorkers,
			fxmodule.AsHandler(newNotify),
			newOrderGroups,
			newHTTPServer,
		),
		fx.Invoke(func(*http.Server) {}),
	)
}

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(2)
	}
	newApp(cfg).Run()
}
