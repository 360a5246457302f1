// Package fxmodule wires millpond into a go.uber.org/fx application: it
// provides the outbox Store, a Publisher and the Bus from a Config, collects
// handlers from the fx value group "millpond.handlers" (see AsHandler), and
// starts and stops them with the fx lifecycle. Everything logs through the
// application's *zap.Logger: Watermill through its slog adapter over zap's
// slog handler, fx itself through fxevent.ZapLogger (see WithZapLogger).
//
//	fx.New(
//		fx.Provide(zap.NewProduction),
//		fx.Supply(fxmodule.Config{DatabaseURL: os.Getenv("DATABASE_URL"), AutoMigrate: true}),
//		fxmodule.Module,
//		fxmodule.WithZapLogger(),
//		fx.Provide(fxmodule.AsHandler(NewReserveStock)),
//	).Run()
//
// The Store holds no connection until the app starts: it opens in its
// OnStart hook (outbox.NewDeferred), so an fx.New that fails after the
// module's constructors ran (another constructor's error, a missing
// dependency), for which fx runs no hook, leaves no pool, listener or
// goroutine behind. Use the Store from OnStart hooks or later: its SQLDB,
// Pool, or any method that takes a context, called in a constructor or an
// fx.Invoke, opens the store at once (and works), which such a failed
// fx.New would then leave open. Dialect works from the start.
//
// Start order: the Store opens and migrates (when AutoMigrate is set) and the Bus
// registers every handler's consumer group in OnStart hooks that run before
// the hooks of constructors invoked after the module, so an HTTP server
// started by the application cannot publish before the groups exist.
package fxmodule

import (
	"github.com/millpond/millpond/internal/safetext"
	"github.com/millpond/millpond/outbox/anydb"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/millpond/millpond/bus"
	"github.com/millpond/millpond/dsn"
	"github.com/millpond/millpond/handlers"
	"github.com/millpond/millpond/outbox"
)

// HandlerGroup is the fx value group the Bus collects handlers from.
const HandlerGroup = "millpond.handlers"

// Config configures the module.
type Config struct {
	// DatabaseURL is given to anydb.Open: postgres://, mysql://,
	// sqlite:path or a PostgreSQL key=value string (see package dsn). It is
	// required: an empty URL is refused rather than quietly keeping events
	// in a local file. The store logs its dialect and the address with the
	// password hidden when it opens.
	DatabaseURL string
	// AutoMigrate runs Store.Migrate on start. Replicas starting together
	// migrate once, under the migration lock. A migration that replaces
	// the layout (0004, upgrading from 0.1.0) needs the previous version
	// stopped first: its replicas fail to enqueue once it ran (see the
	// README, "Upgrading from 0.1.0"). It runs within fx's start timeout
	// (default 15 s, fx.StartTimeout), which a migration over a large
	// table can outlast (the README measures 0004 over a million rows at
	// 18.5 s on PostgreSQL): give the app a longer one, or migrate with
	// millpond migrate before deploying.
	AutoMigrate bool
	// MigrationLockTimeout bounds each wait of AutoMigrate's migration
	// for a lock on a table (outbox.WithMigrationLockTimeout; default
	// outbox.DefaultMigrationLockTimeout when zero or negative). The
	// migration tries again after a backoff until fx's start timeout ends,
	// then fails the start with outbox.ErrMigrationLockTimeout (or, when
	// another replica was migrating the database all that time,
	// outbox.ErrMigrationInProgress).
	MigrationLockTimeout time.Duration
	// OpenTimeout bounds connecting, in the store's OnStart hook (default 10 s;
	// negative is refused with ErrInvalidConfig).
	OpenTimeout time.Duration
	// Bus configures the bus; its Logger defaults to the app's zap logger.
	Bus bus.Config
	// StatsInterval is the store's stats interval (outbox.WithStatsInterval:
	// how long one Stats snapshot feeds the backlog gauges and readiness;
	// default 15 s, negative turns the gauges off).
	StatsInterval time.Duration
	// Health configures the readiness handler the module provides.
	Health bus.HealthOptions
}

// String describes the configuration with the database address's password
// hidden (dsn.Redact), so that an application printing or logging its
// Config shows no secret.
func (c Config) String() string {
	type plain Config
	p := plain(c)
	p.DatabaseURL = dsn.Redact(c.DatabaseURL)
	return fmt.Sprintf("%+v", p)
}

// GoString is String, so %#v hides the password too.
func (c Config) GoString() string { return c.String() }

// Format writes String for every verb (%q quotes it), so that no verb (%s
// or %x of the fields) prints the password.
func (c Config) Format(f fmt.State, verb rune) { safetext.Format(f, verb, c.String()) }

// LogValue is String, for log/slog (whose JSON handler would otherwise
// print every field).
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// MarshalJSON is String as a JSON string, so that encoding/json (slog's
// JSON handler and zap's reflection encoder marshal an application's own
// configuration holding a Config field by field) hides the password too.
func (c Config) MarshalJSON() ([]byte, error) { return json.Marshal(c.String()) }

// Module provides *outbox.Store, *outbox.Publisher (a context publisher:
// put the transaction on each message with outbox.ContextWithTx), *bus.Bus
// and *bus.ReadinessHandler (serve it at /readyz). It needs a Config and a
// *zap.Logger from the application. When the application's graph holds a
// metric.MeterProvider, a trace.TracerProvider or a
// propagation.TextMapPropagator (all optional), the store uses them for
// its metrics and traces; otherwise the global ones.
var Module = fx.Module("millpond",
	fx.Provide(newStore, newPublisher, newBus, newReadiness),
	// Build the bus even when nothing asks for it, so it starts.
	fx.Invoke(func(*bus.Bus) {}),
)

// AsHandler annotates a constructor of a handlers.Handler (or of any type
// implementing it) so that its result joins the bus's handler group:
//
//	fx.Provide(fxmodule.AsHandler(NewReserveStock))
func AsHandler(constructor any) any {
	return fx.Annotate(constructor, fx.As(new(handlers.Handler)), fx.ResultTags(`group:"`+HandlerGroup+`"`))
}

// WithZapLogger makes fx log its own events through the app's *zap.Logger.
func WithZapLogger() fx.Option {
	return fx.WithLogger(func(l *zap.Logger) fxevent.Logger { return &fxevent.ZapLogger{Logger: l} })
}

// SlogLogger returns a log/slog logger writing to the zap logger, through
// zap's own slog handler.
func SlogLogger(l *zap.Logger) *slog.Logger {
	return slog.New(zapslog.NewHandler(l.Core(), zapslog.WithName(l.Name())))
}

// WatermillLogger returns a Watermill logger writing to the zap logger,
// through Watermill's slog adapter and zap's slog handler.
func WatermillLogger(l *zap.Logger) watermill.LoggerAdapter {
	return watermill.NewSlogLogger(SlogLogger(l))
}

type storeParams struct {
	fx.In
	Lifecycle      fx.Lifecycle
	Config         Config
	Logger         *zap.Logger
	MeterProvider  metric.MeterProvider          `optional:"true"`
	TracerProvider trace.TracerProvider          `optional:"true"`
	Propagator     propagation.TextMapPropagator `optional:"true"`
}

// ErrNoDatabaseURL is returned when Config.DatabaseURL is empty.
var ErrNoDatabaseURL = errors.New("fxmodule: Config.DatabaseURL is empty; name the database (postgres://…, mysql://…, sqlite:path)")

// ErrInvalidConfig reports a Config value out of its bounds (a negative
// OpenTimeout). The bus's own checks of Config.Bus return
// bus.ErrInvalidConfig.
var ErrInvalidConfig = errors.New("fxmodule: invalid configuration")

func newStore(p storeParams) (*outbox.Store, error) {
	url := p.Config.DatabaseURL
	if strings.TrimSpace(url) == "" {
		return nil, ErrNoDatabaseURL
	}
	addr, err := dsn.Parse(url)
	if err != nil {
		return nil, fmt.Errorf("fxmodule: DatabaseURL: %w", err)
	}
	timeout := p.Config.OpenTimeout
	if timeout < 0 {
		return nil, fmt.Errorf("%w: OpenTimeout %s is negative", ErrInvalidConfig, timeout)
	}
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	log := p.Logger.Named("millpond")
	opts := []outbox.Option{outbox.WithLogger(SlogLogger(log)), outbox.WithStatsInterval(p.Config.StatsInterval),
		outbox.WithMigrationLockTimeout(p.Config.MigrationLockTimeout)}
	if p.MeterProvider != nil {
		opts = append(opts, outbox.WithMeterProvider(p.MeterProvider))
	}
	if p.TracerProvider != nil {
		opts = append(opts, outbox.WithTracerProvider(p.TracerProvider))
	}
	if p.Propagator != nil {
		opts = append(opts, outbox.WithPropagator(p.Propagator))
	}
	// The store opens in the OnStart hook, not here: fx runs no hook of an
	// app whose fx.New fails, and fx.New can fail after this constructor
	// ran (another module's constructor, a missing dependency), which
	// would leave an opened store's pool, listener and goroutines behind.
	store, err := outbox.NewDeferred(string(addr.Dialect), func(ctx context.Context, opts ...outbox.Option) (*outbox.Store, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return anydb.Open(ctx, url, opts...)
	}, opts...)
	if err != nil {
		return nil, fmt.Errorf("fxmodule: %w", err)
	}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			if err := store.OpenDeferred(ctx); err != nil {
				return fmt.Errorf("fxmodule: %w", err)
			}
			log.Info("opened the outbox store", zap.String("dialect", store.Dialect()), zap.Stringer("database", addr))
			if p.Config.AutoMigrate {
				if err := store.Migrate(ctx); err != nil {
					// fx runs no OnStop of a hook whose OnStart failed:
					// the store closes here, or its connections stay.
					_ = store.Close()
					return err
				}
			}
			return nil
		},
		OnStop: func(context.Context) error { return store.Close() },
	})
	return store, nil
}

func newPublisher(store *outbox.Store) (*outbox.Publisher, error) {
	return outbox.NewContextPublisher(store)
}

type busParams struct {
	fx.In
	Lifecycle fx.Lifecycle
	Store     *outbox.Store
	Config    Config
	Logger    *zap.Logger
	Handlers  []handlers.Handler `group:"millpond.handlers"`
}

func newBus(p busParams) (*bus.Bus, error) {
	cfg := p.Config.Bus
	if cfg.Subscriber.CloseTimeout == 0 {
		// Finish within fx's default 15 s stop timeout.
		cfg.Subscriber.CloseTimeout = 8 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = WatermillLogger(p.Logger.Named("millpond.bus"))
	}
	b, err := bus.New(p.Store, cfg, p.Handlers...)
	if err != nil {
		// fx.New fails: no hook of the app ever runs. The store has not
		// opened, unless a constructor took its SQLDB or Pool: then it
		// closes here or never.
		_ = p.Store.Close()
		return nil, fmt.Errorf("fxmodule: %w", err)
	}
	p.Lifecycle.Append(fx.StartStopHook(b.Start, b.Stop))
	return b, nil
}

func newReadiness(b *bus.Bus, c Config) *bus.ReadinessHandler {
	return b.ReadinessHandler(c.Health)
}
