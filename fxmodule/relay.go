package fxmodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/millpond/millpond/internal/safetext"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// RelayConfig configures RelayModule.
type RelayConfig struct {
	// NATSURL names the NATS server(s) (comma-separated); its credentials
	// are never logged. Required.
	NATSURL string
	// JetStream configures the relay (streams, JetStream stream, subjects,
	// strict mode…); its Logger defaults to the app's zap logger, its
	// MeterProvider to the application's metric.MeterProvider when the
	// graph holds one (as Module's store does), else the global one.
	JetStream relay.JetStreamConfig
}

// String describes the configuration with the NATS servers' credentials
// hidden (relay.RedactURL), so that an application printing or logging its
// RelayConfig shows no secret.
func (c RelayConfig) String() string {
	type plain RelayConfig
	p := plain(c)
	p.NATSURL = relay.RedactURL(c.NATSURL)
	return fmt.Sprintf("%+v", p)
}

// GoString is String, so %#v hides the credentials too.
func (c RelayConfig) GoString() string { return c.String() }

// Format writes String for every verb (%q quotes it), so that no verb (%s
// or %x of the fields) prints the password.
func (c RelayConfig) Format(f fmt.State, verb rune) { safetext.Format(f, verb, c.String()) }

// LogValue is String, for log/slog (whose JSON handler would otherwise
// print every field).
func (c RelayConfig) LogValue() slog.Value { return slog.StringValue(c.String()) }

// MarshalJSON is String as a JSON string, so that encoding/json (slog's
// JSON handler and zap's reflection encoder marshal an application's own
// configuration holding a RelayConfig field by field) hides the
// credentials too.
func (c RelayConfig) MarshalJSON() ([]byte, error) { return json.Marshal(c.String()) }

// ErrNoNATSURL is returned when RelayConfig.NATSURL is empty.
var ErrNoNATSURL = errors.New("fxmodule: RelayConfig.NATSURL is empty; name the NATS server (nats://…)")

// RelayModule runs a JetStream relay (package relay) in the application,
// over the Store of Module: supply a RelayConfig next to Config.
//
//	fx.Supply(fxmodule.RelayConfig{NATSURL: os.Getenv("NATS_URL"),
//		JetStream: relay.JetStreamConfig{Config: relay.Config{Streams: []string{"orders"}}, SubjectPrefix: "events"}}),
//	fxmodule.Module,
//	fxmodule.RelayModule,
//
// Its constructor checks what needs no server (relay.NewDeferredJetStream):
// an empty NATSURL (ErrNoNATSURL), a URL that does not parse, a bad
// configuration or subject template fail fx.New. It connects to nothing
// and starts no goroutine there, so an fx.New that fails after it for
// another reason leaves nothing open. Its OnStart hook connects to NATS
// and checks the stream (relay.JetStream.Open: a server that does not
// answer, relay.ErrUnreachable, or a missing stream, relay.ErrStreamNotFound,
// fails app.Start, closing what it opened), registers the relay's consumer
// group (before the hooks of constructors invoked after it, which may
// enqueue at once) and relays from then on; its OnStop hook lets the
// publishes in flight be confirmed before it closes its NATS connection.
// It provides the *relay.JetStream, for its Stats (its StreamName and
// DuplicateWindow are known once the app started). Its metrics go to the
// application's metric.MeterProvider when the graph holds one.
//
// Stopping waits for unconfirmed publishes up to JetStream.CloseTimeout
// (default 8 s), and the bus of Module for running handlers up to its own
// (default 13 s): each fits fx's default 15 s stop timeout, but when NATS
// and a handler both hang their sum does not, and fx then skips the later
// OnStop hooks (the store's Close among them). Nothing is lost (what was
// not acknowledged is delivered again), but to let every hook run, give
// the app fx.StopTimeout(25 * time.Second) or lower the close timeouts.
var RelayModule = fx.Module("millpond.relay",
	fx.Provide(newRelay),
	fx.Invoke(func(*relay.JetStream) {}),
)

type relayParams struct {
	fx.In
	Lifecycle fx.Lifecycle
	Store     *outbox.Store
	Config    RelayConfig
	Logger    *zap.Logger
	// MeterProvider is the application's, when its graph holds one.
	MeterProvider metric.MeterProvider `optional:"true"`
}

func newRelay(p relayParams) (*relay.JetStream, error) {
	if strings.TrimSpace(p.Config.NATSURL) == "" {
		return nil, ErrNoNATSURL
	}
	cfg := p.Config.JetStream
	if cfg.Logger == nil {
		cfg.Logger = SlogLogger(p.Logger.Named("millpond.relay"))
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = p.MeterProvider // nil: the global one
	}
	if cfg.CloseTimeout == 0 {
		cfg.CloseTimeout = 8 * time.Second // within fx's default 15 s stop timeout
	}
	// Nothing connects here: fx runs no hook of an app whose fx.New fails
	// after this constructor ran, so a connection made here could never
	// be closed. Open, in OnStart, connects and checks the stream.
	r, err := relay.NewDeferredJetStream(p.Store, p.Config.NATSURL, cfg)
	if err != nil {
		return nil, fmt.Errorf("fxmodule: %w", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			// fx runs no OnStop of a hook whose OnStart failed: a failing
			// Open closes what it opened, and a failing RegisterGroups
			// is followed by Close here.
			if err := r.Open(ctx); err != nil {
				return fmt.Errorf("fxmodule: %w", err)
			}
			// The group is registered before the hooks that follow start
			// (an HTTP server taking orders), as the bus's are: an event
			// enqueued before it would never be relayed.
			if err := r.RegisterGroups(ctx); err != nil {
				_ = r.Close()
				return fmt.Errorf("fxmodule: %w", err)
			}
			go func() { done <- r.Run(runCtx) }()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			stop()
			defer func() { _ = r.Close() }()
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	return r, nil
}
