package fxmodule_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/zap"

	"github.com/millpond/millpond/fxmodule"
	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/internal/testnats"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

func TestRelayModule(t *testing.T) {
	db := testdb.New(t, "postgres")
	_, js := testnats.Connect(t)
	prefix := testnats.UniqueName("fx")
	st := testnats.Stream(t, js, strings.ToUpper(prefix), 2*time.Minute, prefix+".>")
	var store *outbox.Store
	var r *relay.JetStream
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	app := fxtest.New(t,
		fx.Supply(zap.NewNop()),
		fx.Supply(fx.Annotate(mp, fx.As(new(metric.MeterProvider)))),
		fx.Supply(fxmodule.Config{DatabaseURL: db.URL, AutoMigrate: true}),
		fx.Supply(fxmodule.RelayConfig{NATSURL: testnats.URL(), JetStream: relay.JetStreamConfig{
			Config: relay.Config{Streams: []string{"orders"}}, SubjectPrefix: prefix}}),
		fxmodule.Module,
		fxmodule.RelayModule,
		fx.Populate(&store, &r),
	)
	app.RequireStart()
	defer app.RequireStop()
	// The relay's group is registered by the time start returns (see
	// TestRelayModuleRegistersItsGroupBeforeLaterHooksStart).
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		regs, err := store.RegisteredGroups(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		if len(regs) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay registered no consumer group in 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	tx, commit, _ := db.Begin(t)
	if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: "orders", Key: "o-1", Kind: "OrderPlaced", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	for r.Stats().Published+r.Stats().Duplicates == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the relay published nothing in 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if msgs := testnats.Messages(t, st); len(msgs) != 1 || msgs[0].Subject != prefix+".orders.OrderPlaced" {
		t.Fatalf("stream holds %v", msgs)
	}
	// The relay's metrics go to the application's MeterProvider.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var published int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && sm.Scope.Name == relay.InstrumentationName && m.Name == "millpond.relay.published" {
				for _, p := range sum.DataPoints {
					published += p.Value
				}
			}
		}
	}
	if published != 1 {
		t.Errorf("millpond.relay.published in the application's MeterProvider = %d, want 1", published)
	}
}

func TestRelayModuleRefusesBadConfiguration(t *testing.T) {
	db := testdb.New(t, "postgres")
	testnats.Connect(t)
	app := fx.New(
		fx.NopLogger,
		fx.Supply(zap.NewNop()),
		fx.Supply(fxmodule.Config{DatabaseURL: db.URL}),
		fx.Supply(fxmodule.RelayConfig{NATSURL: testnats.URL(), JetStream: relay.JetStreamConfig{
			Config: relay.Config{Streams: []string{"orders"}}, Stream: "NO_SUCH_STREAM_FX"}}),
		fxmodule.Module,
		fxmodule.RelayModule,
	)
	if err := app.Err(); !errors.Is(err, relay.ErrStreamNotFound) {
		t.Fatalf("app error %v, want ErrStreamNotFound", err)
	}
}

// TestRelayModuleRegistersItsGroupBeforeLaterHooksStart: the hooks of
// constructors invoked after the modules (an HTTP server taking orders)
// start only once the relay's consumer group is registered, as the bus's
// groups are. An event enqueued by such a hook is relayed; a relay that
// registered its group in the background, after its OnStart returned,
// left it to the default group, never published.
func TestRelayModuleRegistersItsGroupBeforeLaterHooksStart(t *testing.T) {
	db := testdb.New(t, "postgres")
	db.Store(t) // migrated
	_, js := testnats.Connect(t)
	prefix := testnats.UniqueName("fxreg")
	testnats.Stream(t, js, strings.ToUpper(prefix), 2*time.Minute, prefix+".>")

	// Registrations wait behind this lock while the application starts:
	// whatever registers in the background has not registered yet when
	// the later hooks run. A registration made by the relay's OnStart
	// holds the start back until the lock goes.
	ctx := context.Background()
	lock, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, "LOCK TABLE millpond_subscriptions IN SHARE ROW EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	type seen struct {
		groups []string
		err    error
	}
	atAppStart := make(chan seen, 1)
	var r *relay.JetStream
	app := fx.New(
		fx.Supply(zap.NewNop()),
		fx.Supply(fxmodule.Config{DatabaseURL: db.URL}),
		fx.Supply(fxmodule.RelayConfig{NATSURL: testnats.URL(), JetStream: relay.JetStreamConfig{
			Config: relay.Config{Streams: []string{"orders"}}, SubjectPrefix: prefix}}),
		fxmodule.Module,
		fxmodule.RelayModule,
		fx.Populate(&r),
		// The application: takes an order as soon as it starts.
		fx.Invoke(func(lc fx.Lifecycle, store *outbox.Store) {
			lc.Append(fx.Hook{OnStart: func(ctx context.Context) error {
				var s seen
				regs, err := store.RegisteredGroups(ctx, "orders")
				for _, g := range regs {
					s.groups = append(s.groups, g.Group)
				}
				if err == nil {
					err = store.InTx(ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
						_, err := store.Enqueue(ctx, outbox.SQLTx(tx), outbox.Event{Stream: "orders", Key: "o-1", Kind: "OrderPlaced", Payload: []byte(`{}`)})
						return err
					})
				}
				s.err = err
				atAppStart <- s
				return err
			}})
		}),
		fx.NopLogger,
	)
	if err := app.Err(); err != nil {
		t.Fatal(err)
	}
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- app.Start(startCtx) }()
	var s seen
	ran := false
	select {
	case s = <-atAppStart:
		ran = true
	case <-time.After(time.Second):
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	defer func() { _ = app.Stop(context.Background()) }()
	if !ran {
		s = <-atAppStart
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	if !slices.Contains(s.groups, relay.DefaultGroup) {
		t.Errorf("when the application's hooks started, the groups of orders were %q: the relay's group %q was not registered yet", s.groups, relay.DefaultGroup)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().Published+r.Stats().Duplicates == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the order enqueued as the application started was not relayed in 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
