package fxmodule_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
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

// TestRelayModuleRefusesAMissingStreamAtStart: the stream is checked
// against the server when the app starts (fx.New contacts no server), and
// a missing one fails app.Start, leaving no connection of the relay.
func TestRelayModuleRefusesAMissingStreamAtStart(t *testing.T) {
	srv := testnats.Embedded(t)
	base := srv.NumClients()
	app := fx.New(
		fx.NopLogger,
		fx.Supply(zap.NewNop()),
		fx.Supply(fxmodule.Config{DatabaseURL: "sqlite:" + filepath.Join(t.TempDir(), "stream.db"), AutoMigrate: true}),
		fx.Supply(fxmodule.RelayConfig{NATSURL: srv.URL(), JetStream: relay.JetStreamConfig{
			Config: relay.Config{Streams: []string{"orders"}}, Stream: "NO_SUCH_STREAM_FX"}}),
		fxmodule.Module,
		fxmodule.RelayModule,
	)
	if err := app.Err(); err != nil {
		t.Fatalf("fx.New: %v; the stream is checked at start", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := app.Start(ctx); !errors.Is(err, relay.ErrStreamNotFound) {
		if err == nil {
			_ = app.Stop(ctx)
		}
		t.Fatalf("start: %v, want ErrStreamNotFound", err)
	}
	natsClientsBecome(t, srv, base, "after the failed start")
}

// natsClientsBecome waits up to 5 s for the embedded server to hold want
// client connections and fails the test if it does not.
func natsClientsBecome(t *testing.T, srv *testnats.Server, want int, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for srv.NumClients() != want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := srv.NumClients(); n != want {
		t.Fatalf("%s: the NATS server holds %d client connection(s), want %d", when, n, want)
	}
}

// goroutinesBackTo waits up to 5 s for the process to run at most
// baseline goroutines and fails the test, with their stacks, if it does
// not.
func goroutinesBackTo(t *testing.T, baseline int, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseline && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > baseline {
		buf := make([]byte, 1<<16)
		t.Errorf("%s: %d goroutine(s) before, %d 5 s after:\n%s", when, baseline, n, buf[:runtime.Stack(buf, true)])
	}
}

// TestFailedAppBuildLeavesNoRelayOpen: fx.New fails for a reason outside
// the module after RelayModule's constructor ran (another constructor's
// error, a missing dependency). fx runs no hook of an app that failed to
// build, so a NATS connection made by the constructor (and its
// goroutines) would stay for good. The relay connects in its OnStart hook
// instead: the server holds no connection of it and no goroutine is left.
func TestFailedAppBuildLeavesNoRelayOpen(t *testing.T) {
	srv := testnats.Embedded(t)
	_, js := srv.Connect(t)
	prefix := testnats.UniqueName("fxbuild")
	// A stream the relay would accept: only the failure outside the
	// module fails fx.New.
	testnats.Stream(t, js, strings.ToUpper(prefix), 2*time.Minute, prefix+".>")
	type missing interface{ Missing() }
	for _, c := range []struct {
		name string
		opts []fx.Option
	}{
		{"another constructor fails", []fx.Option{fx.Invoke(func(*relay.JetStream) error {
			return errors.New("payments: no API key configured")
		})}},
		{"a dependency is missing", []fx.Option{fx.Invoke(func(*relay.JetStream, missing) {})}},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := srv.NumClients()
			runtime.GC()
			baseline := runtime.NumGoroutine()
			var built atomic.Bool
			opts := append([]fx.Option{fx.Supply(zap.NewNop()), fx.NopLogger,
				fx.Supply(fxmodule.Config{DatabaseURL: "sqlite:" + filepath.Join(t.TempDir(), "build.db"), AutoMigrate: true}),
				fx.Supply(fxmodule.RelayConfig{NATSURL: srv.URL(), JetStream: relay.JetStreamConfig{
					Config: relay.Config{Streams: []string{"orders"}}, SubjectPrefix: prefix}}),
				fxmodule.Module, fxmodule.RelayModule,
				// The module's own invoke runs first: the relay is built
				// before the application's invokes fail.
				fx.Invoke(func(*relay.JetStream) { built.Store(true) })}, c.opts...)
			newFailingAfter(t, opts, &built, "the relay")
			goroutinesBackTo(t, baseline, "fx.New failed")
			natsClientsBecome(t, srv, base, "5 s after fx.New failed")
		})
	}
}

// countingListener accepts TCP connections on a loopback port and counts
// them, answering nothing.
func countingListener(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String(), accepted
}

// TestRelayModuleRefusesBadConfiguration: what needs no server to be
// refused still fails fx.New, and no server is contacted for it.
func TestRelayModuleRefusesBadConfiguration(t *testing.T) {
	addr, accepted := countingListener(t)
	const secret = "Pw-s3cret"
	good := relay.JetStreamConfig{Config: relay.Config{Streams: []string{"orders"}}}
	for _, c := range []struct {
		name string
		cfg  fxmodule.RelayConfig
		want error
	}{
		{"no NATS URL", fxmodule.RelayConfig{NATSURL: " ", JetStream: good}, fxmodule.ErrNoNATSURL},
		{"bad subject template", fxmodule.RelayConfig{NATSURL: "nats://" + addr, JetStream: relay.JetStreamConfig{
			Config: good.Config, SubjectTemplate: "{prefix}.{nope}"}}, relay.ErrInvalidSubjectTemplate},
		{"no outbox stream", fxmodule.RelayConfig{NATSURL: "nats://" + addr}, relay.ErrInvalidConfig},
		{"unencoded '/' in the password", fxmodule.RelayConfig{NATSURL: "nats://alice:12/" + secret + "@" + addr, JetStream: good}, relay.ErrInvalidConfig},
	} {
		t.Run(c.name, func(t *testing.T) {
			app := fx.New(
				fx.NopLogger,
				fx.Supply(zap.NewNop()),
				fx.Supply(fxmodule.Config{DatabaseURL: "sqlite:" + filepath.Join(t.TempDir(), "bad.db")}),
				fx.Supply(c.cfg),
				fxmodule.Module,
				fxmodule.RelayModule,
			)
			err := app.Err()
			if !errors.Is(err, c.want) {
				t.Fatalf("fx.New: %v, want %v", err, c.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("fx.New's error %q shows the password", err)
			}
			if n := accepted.Load(); n != 0 {
				t.Errorf("%d connection(s) to the NATS address for a configuration refused without it", n)
			}
		})
	}
}

// TestRelayModuleUnreachableNATSFailsStart: a NATS server that does not
// answer fails app.Start (not fx.New) with relay.ErrUnreachable, without
// the URL's password, and leaves no goroutine behind: the store the start
// opened is closed again.
func TestRelayModuleUnreachableNATSFailsStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there
	const secret = "Pw-s3cret"
	runtime.GC()
	baseline := runtime.NumGoroutine()
	app := fx.New(
		fx.NopLogger,
		fx.Supply(zap.NewNop()),
		fx.Supply(fxmodule.Config{DatabaseURL: "sqlite:" + filepath.Join(t.TempDir(), "unreachable.db"), AutoMigrate: true}),
		fx.Supply(fxmodule.RelayConfig{NATSURL: "nats://alice:" + secret + "@" + addr, JetStream: relay.JetStreamConfig{
			Config: relay.Config{Streams: []string{"orders"}}}}),
		fxmodule.Module,
		fxmodule.RelayModule,
	)
	if err := app.Err(); err != nil {
		t.Fatalf("fx.New: %v; the server is contacted at start", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = app.Start(ctx)
	if !errors.Is(err, relay.ErrUnreachable) {
		if err == nil {
			_ = app.Stop(ctx)
		}
		t.Fatalf("start: %v, want ErrUnreachable", err)
	}
	t.Logf("start failed as intended: %v", err)
	if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "alice") {
		t.Errorf("start's error %q shows the credentials", err)
	}
	goroutinesBackTo(t, baseline, "app.Start failed")
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
