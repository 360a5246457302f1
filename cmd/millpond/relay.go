package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

// EnvNATSURL names the environment variable read when -nats is not given.
const EnvNATSURL = "MILLPOND_NATS_URL"

const relayUsage = `Usage: millpond relay -nats URL -stream S[,S…] [-js-stream NAME] [-subject-prefix P]
       [-subject TEMPLATE] [-ordering-key-subject] [-strict] [-use-leases] [-group relay] [-db URL] …

Relay the events of outbox streams to NATS JetStream until SIGTERM or
SIGINT, then stop gracefully (publishes in flight are confirmed and
acknowledged). The relay is the consumer group -group of each stream
(registered at start: events enqueued before are not relayed). Each event is
acknowledged in the outbox only after JetStream's PubAck; Nats-Msg-Id is
"<stream>/<key>", so a re-publication after a crash is dropped within the
JetStream stream's duplicate window, which must be at least the longer of
-lease and 4 x -publish-timeout (held claims, PostgreSQL's default; -lease
alone with -use-leases or elsewhere) + -max-backoff + -publish-timeout:
60s by default (checked at start). -strict needs no
window: it publishes with the expected last sequence of a subject per
ordering key. Subjects: -subject template, default
{prefix}.{stream}.{kind} ({prefix}.{stream}.{kind}.{ordering_key} with
-ordering-key-subject or -strict); '.' inside a name becomes '~'.

The NATS URL is -nats or $` + EnvNATSURL + `; its credentials are never printed.
Credentials given with -nats or -db are visible to every user of the machine in
the process list (ps): set $` + EnvNATSURL + ` and $` + EnvDatabaseURL + ` instead.
`

func cmdRelay(e *env, args []string) error {
	fs := newFlagSet(e, "relay", relayUsage)
	natsURL := fs.String("nats", "", "NATS server URL(s), comma-separated (default $"+EnvNATSURL+")")
	streams := fs.String("stream", "", "outbox stream(s) to relay, comma-separated (required)")
	jsStream := fs.String("js-stream", "", "JetStream stream (default: the stream that captures the subjects)")
	prefix := fs.String("subject-prefix", relay.DefaultSubjectPrefix, "subject prefix, {prefix} in the template")
	template := fs.String("subject", "", "subject template (default {prefix}.{stream}.{kind})")
	keyInSubject := fs.Bool("ordering-key-subject", false, "append the ordering key to the default subject")
	strict := fs.Bool("strict", false, "strict mode: expected last sequence per subject instead of the duplicate window")
	group := fs.String("group", relay.DefaultGroup, "the relay's consumer group")
	window := fs.Int("window", relay.DefaultJetStreamWindow, "publishes in flight per stream")
	batch := fs.Int("batch", relay.DefaultBatchSize, "events claimed at once (at most 1000)")
	lease := fs.Duration("lease", relay.DefaultLease, "claim lease (held claims on PostgreSQL: the longest a held batch may stay idle, at least 4x the publish timeout)")
	useLeases := fs.Bool("use-leases", false, "on PostgreSQL, claim under leases instead of holding each batch in a transaction")
	maxBackoff := fs.Duration("max-backoff", relay.DefaultMaxBackoff, "longest retry delay after a failed publish")
	publishTimeout := fs.Duration("publish-timeout", relay.DefaultPublishTimeout, "wait for a PubAck at most this long")
	closeTimeout := fs.Duration("close-timeout", relay.DefaultCloseTimeout, "on stop, wait this long for publishes in flight")
	poll := fs.Duration("poll", 0, "idle poll interval (default 1s on PostgreSQL, woken sooner by notifications; 50ms otherwise)")
	verbose := fs.Bool("v", false, "log every failed publish (debug level)")
	dbFlag := addDBFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("relay: unexpected argument %q", pos[0])
	}
	if *natsURL == "" {
		*natsURL = e.getenv(EnvNATSURL)
	}
	if *natsURL == "" {
		return usagef("relay: no NATS server: give -nats URL or set %s", EnvNATSURL)
	}
	if *streams == "" {
		return usagef("relay: -stream is required")
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))
	shownNATS := relay.RedactURL(*natsURL)

	s, db, err := openWith(e, *dbFlag, outbox.WithLogger(logger))
	if err != nil {
		return err
	}
	defer s.Close()
	nc, err := relay.Connect(*natsURL, relayConnectOptions(logger)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	cfg := relay.JetStreamConfig{
		Config: relay.Config{
			Streams: strings.Split(*streams, ","), Group: *group, Window: *window, BatchSize: *batch,
			Lease: *lease, UseLeases: *useLeases, MaxBackoff: *maxBackoff, PublishTimeout: *publishTimeout,
			CloseTimeout: *closeTimeout, PollInterval: *poll, Logger: logger,
		},
		Stream: *jsStream, SubjectPrefix: *prefix, SubjectTemplate: *template,
		OrderingKeyInSubject: *keyInSubject, Strict: *strict,
	}
	r, err := relay.NewJetStream(e.ctx, s, nc, cfg)
	if err != nil {
		if errors.Is(err, relay.ErrInvalidConfig) || errors.Is(err, relay.ErrInvalidSubjectTemplate) {
			return usagef("relay: %s", db.addr.Scrub(err.Error()))
		}
		return fmt.Errorf("relay to %s: %s", shownNATS, db.addr.Scrub(err.Error()))
	}
	mode := fmt.Sprintf("duplicate window %s", r.DuplicateWindow())
	if *strict {
		mode = "strict mode"
	}
	fmt.Fprintf(e.stdout, "relaying %d stream(s) of %s to JetStream stream %s at %s (%s); stop with Ctrl-C or SIGTERM\n",
		len(cfg.Streams), db.shown, r.StreamName(), shownNATS, mode)
	if err := r.Run(e.ctx); err != nil {
		return fmt.Errorf("relay: %s", db.addr.Scrub(err.Error()))
	}
	st := r.Stats()
	fmt.Fprintf(e.stdout, "relay stopped: %d published, %d duplicates dropped by JetStream, %d failed publishes (retried or dead-lettered), %d dead-lettered\n",
		st.Published, st.Duplicates, st.Failed, st.DeadLettered)
	return nil
}

// relayConnectOptions logs connection changes, never the URL.
func relayConnectOptions(logger *slog.Logger) []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("NATS disconnected; reconnecting", "error", err.Error())
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { logger.Info("NATS reconnected") }),
	}
}
