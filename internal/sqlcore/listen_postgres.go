package sqlcore

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
)

// NotifyChannel is the PostgreSQL channel that carries wake-ups, with the
// stream name as payload: sent by Notify inside an enqueueing transaction,
// and by a trigger when a row becomes pending again (fail, release,
// requeue). PostgreSQL delivers it on commit.
const NotifyChannel = "millpond_outbox"

// ListenPostgres holds one dedicated connection listening on NotifyChannel
// and calls wake with the stream of each notification. After every
// (re)connect it calls wake with "" so callers poll once for anything missed
// while disconnected. A dropped connection is re-established until ctx
// ends, after an exponential backoff with jitter (cenkalti/backoff) from
// 50 ms to 5 s, started again after every successful connection; onErr
// sees each failure.
func ListenPostgres(ctx context.Context, config *pgx.ConnConfig, wake func(stream string), onErr func(error)) {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     50 * time.Millisecond,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         5 * time.Second,
	}
	for ctx.Err() == nil {
		err := listenOnce(ctx, config, wake, b.Reset)
		if ctx.Err() != nil {
			return
		}
		if onErr != nil && err != nil {
			onErr(err)
		}
		timer := time.NewTimer(b.NextBackOff())
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

func listenOnce(ctx context.Context, config *pgx.ConnConfig, wake func(string), connected func()) error {
	config = config.Copy()
	if config.RuntimeParams["application_name"] == "" {
		config.RuntimeParams["application_name"] = "millpond-listener"
	}
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return err
	}
	connected()
	wake("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		wake(n.Payload)
	}
}
