package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"

	"github.com/millpond/millpond/internal/claimbound"
	"github.com/millpond/millpond/internal/sqlcore"
)

// SubscriberConfig configures a Subscriber. Zero values take the defaults.
type SubscriberConfig struct {
	// ConsumerGroup is the group whose delivery state this subscriber
	// shares; "" is the default group. Subscribers of one group split the
	// events; each group gets every event enqueued after it registered.
	ConsumerGroup string
	// Kinds limits the group's subscription to these event kinds; empty
	// means every kind of the topic. Events of a stream that no group
	// subscribes to (for their kind) go to the default group "".
	Kinds []string
	// SkipRegistration consumes the group's rows without subscribing the
	// group to the topic. Use it for the default group "" to process the
	// events that no registered group takes (the bus does, for its
	// unrouted-event policy); registering "" would give it every event.
	// Use it too when the group is registered otherwise before Subscribe
	// (the bus registers its handlers' groups at Start), to spare a write.
	SkipRegistration bool
	// Worker names this process in claimed rows; default host-pid-random.
	Worker string
	// BatchSize is the most events claimed at once (default 100).
	BatchSize int
	// MaxInFlight is how many messages a subscription hands out before
	// their Ack or Nack (default 1: the next message waits for the
	// previous one to be settled).
	MaxInFlight int
	// Lease is how long a claim holds before another worker may take the
	// event; it is extended every Lease/3 while a message is unsettled
	// (default 30 s, bound 1 s-1 h).
	Lease time.Duration
	// MaxAttempts dead-letters an event after this many claims (default 10).
	MaxAttempts int
	// Backoff gives the retry delay after a Nack of the given attempt
	// (1 for the first). Default: DefaultBackoff, 1 s doubling per attempt
	// with ±20% jitter, at most 5 min.
	Backoff func(attempt int) time.Duration
	// PollInterval is how often an idle subscription looks for due events
	// (default 1 s on PostgreSQL, where NOTIFY wakes it sooner; 50 ms
	// elsewhere). Below 1 ms is refused (ErrInvalidDuration).
	PollInterval time.Duration
	// CloseTimeout is how long Close waits for messages already handed out
	// to be acked or nacked before it cancels their contexts and returns
	// (default 30 s). Their leases then expire and the events are retried.
	// Negative is refused (ErrInvalidDuration).
	CloseTimeout time.Duration
	// Logger receives the subscriber's logs (default: none).
	Logger watermill.LoggerAdapter
	// DeadLetterPolicy is the group's policy for a dead-lettered event with
	// an ordering key: DeadLetterHold (the default) blocks the key's later
	// events until it is requeued, DeadLetterSkip lets them go on. Events
	// with an ordering key are always delivered one at a time per key and
	// group, in commit order, whatever MaxInFlight is.
	DeadLetterPolicy DeadLetterPolicy
	// HoldClaims (PostgreSQL and MySQL/MariaDB) claims each batch as a held claim
	// (Store.ClaimHeld) instead of under leases: the batch's rows stay
	// locked, unchanged, in a transaction of the subscription's own until
	// every message of the batch is acked or nacked; then one statement
	// marks the acked events delivered (each row is written once, where a
	// leased claim writes it at the claim and again at the
	// acknowledgement), and the nacked ones are retried or dead-lettered
	// as usual. A batch still open after Lease/3 (a slow handler) is
	// settled early: its acked events are marked delivered and the rest
	// become ordinary leased claims. A subscription holds at most three
	// batches, each on a pooled connection, and a Store at most a quarter
	// of its pool's connections (at least one; 8 when a MySQL pool has no
	// limit; the limit is read when the Store is made, so a later
	// sql.DB.SetMaxOpenConns does not change it): a batch that finds no room
	// within 200 ms is claimed under a lease, as without the option.
	//
	// What it gives up: the acks of a batch commit together, so a crash
	// delivers again the handled events of the open batches (at most three
	// batches), though they are due again at once rather than after their
	// lease; a held claim counts no attempt until it settles (a crash
	// while holding counts none), which is why a subscription leases its
	// claims for a while after it starts (HoldClaimsAfter); and held
	// messages carry no receipt (AcknowledgeMessageInTx refuses them with
	// ErrNoReceipt). SQLite refuses the option with an error wrapping
	// errors.ErrUnsupported.
	HoldClaims bool
	// HoldClaimsAfter is how long a subscription with HoldClaims claims
	// under leases after it starts before it holds its claims (default:
	// twice Lease; negative: hold from the first claim). A held claim
	// counts no attempt, so a process that an event's handling crashes
	// would otherwise take that event again, held, after every restart
	// and never dead-letter it, its batch stalled for good. Claimed under
	// a lease after the restart, the event counts an attempt per crash (a
	// crash while it was held, past the window, counts none: at worst
	// every other crash counts) and is dead-lettered after MaxAttempts
	// counted crashes, with the other events of its batch that the
	// crashes left unacknowledged, as with leases; the stream goes on.
	// Ignored without HoldClaims.
	HoldClaimsAfter time.Duration
}

// DefaultBackoff is the retry delay after a Nack of the given attempt (1
// for the first): 1 s doubling per attempt, capped at 5 minutes, each delay
// randomised by ±20% (cenkalti/backoff's exponential backoff with jitter),
// so events that failed together are not all retried at the same instant.
func DefaultBackoff(attempt int) time.Duration {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     time.Second,
		RandomizationFactor: 0.2,
		Multiplier:          2,
		MaxInterval:         5 * time.Minute,
	}
	var d time.Duration
	for range min(max(attempt, 1), 16) { // the cap is reached by attempt 10
		d = b.NextBackOff()
	}
	return min(d, 5*time.Minute)
}

func (c *SubscriberConfig) setDefaults(listening bool) {
	if c.Worker == "" {
		c.Worker = defaultWorkerID()
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 1
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	if c.PollInterval == 0 {
		c.PollInterval = 50 * time.Millisecond
		if listening {
			c.PollInterval = time.Second
		}
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	if c.HoldClaimsAfter == 0 {
		c.HoldClaimsAfter = 2 * c.Lease
	}
}

func (c *SubscriberConfig) validate() error {
	probe := ClaimRequest{Stream: "probe", Group: c.ConsumerGroup, Worker: c.Worker, Limit: c.BatchSize, Lease: c.Lease, MaxAttempts: c.MaxAttempts, DeadLetterPolicy: c.DeadLetterPolicy}
	if err := probe.Validate(); err != nil {
		return err
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > MaxBatch {
		return fmt.Errorf("max in flight %d is outside 1-%d: %w", c.MaxInFlight, MaxBatch, ErrInvalidBatch)
	}
	if c.PollInterval < time.Millisecond {
		return fmt.Errorf("poll interval %s is below 1ms: %w", c.PollInterval, ErrInvalidDuration)
	}
	if c.CloseTimeout < 0 {
		return fmt.Errorf("close timeout %s is negative: %w", c.CloseTimeout, ErrInvalidDuration)
	}
	return nil
}

func defaultWorkerID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:-", r)) {
			return r
		}
		return '-'
	}, host)
	if len(host) > 64 {
		host = host[:64]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	if host == "" {
		host = "worker"
	}
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// Subscriber is a Watermill message.Subscriber over the outbox. Each
// Subscribe claims due events of the topic in batches under a lease, hands
// them out as messages, extends the lease while a message is unsettled, and
// maps Ack to Acknowledge (batched) and Nack to Fail with Backoff (dead
// letter at MaxAttempts). Delivery is at least once: a handler must be
// idempotent, since an event whose lease expires is delivered again.
//
// Events with an ordering key are acknowledged with
// Store.AcknowledgeAndClaimNext: the write that acknowledges a key's head
// also claims the key's next event for the subscription, which hands it
// out without a claim of its own. A subscription that stops releases those
// it has not handed out.
type Subscriber struct {
	store  *Store
	config SubscriberConfig

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	subs    sync.WaitGroup
	// active holds the running subscriptions, for FailingSince. It has
	// its own lock: Subscribe holds mu while it waits for the database,
	// and a readiness probe must not wait for that.
	activeMu sync.Mutex
	active   map[*subscription]struct{}
}

// NewSubscriber returns a Subscriber over the store.
func NewSubscriber(store *Store, config SubscriberConfig) (*Subscriber, error) {
	if store == nil {
		return nil, errors.New("outbox: new subscriber: nil store")
	}
	config.setDefaults(store.wake.listening)
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("outbox: new subscriber: %w", err)
	}
	if config.HoldClaims && store.Dialect() == string(sqlcore.SQLite) {
		return nil, fmt.Errorf("outbox: new subscriber: HoldClaims needs PostgreSQL or MySQL, not %s: %w", store.Dialect(), errors.ErrUnsupported)
	}
	return &Subscriber{store: store, config: config, closing: make(chan struct{}), active: map[*subscription]struct{}{}}, nil
}

// SubscribeInitialize registers the consumer group for the topic, so events
// published from now on are kept for it even before it subscribes.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	if err := ValidateKey(topicField, topic); err != nil {
		return fmt.Errorf("outbox: subscribe initialize: %w", err)
	}
	if s.config.SkipRegistration {
		return nil
	}
	return s.store.RegisterGroup(context.Background(), topic, s.config.ConsumerGroup, s.config.Kinds...)
}

// Subscribe checks the database's schema (Store.CheckSchema, once per
// store), registers the consumer group for the topic and returns the
// channel of its messages. The channel closes when ctx ends or Close is
// called, after messages already handed out are settled (see CloseTimeout).
// A Close called while Subscribe still waits for the database ends that
// wait: Subscribe then fails with ErrClosed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	// The topic is the stream: checked here, not only by the registration
	// a subscriber with SkipRegistration skips, whose claims would
	// otherwise fail and retry forever.
	if err := ValidateKey(topicField, topic); err != nil {
		return nil, fmt.Errorf("outbox: subscribe: %w", err)
	}
	// The database is read without the Subscriber's lock, and Close ends
	// the reads: a database that does not answer must not hold up Close
	// (a Router's Close, say) behind a Subscribe waiting for it.
	opCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-opCtx.Done():
		}
	}()
	if err := s.store.CheckSchema(opCtx); err != nil {
		return nil, s.subscribeErr(err)
	}
	if !s.config.SkipRegistration {
		if err := s.store.RegisterGroup(opCtx, topic, s.config.ConsumerGroup, s.config.Kinds...); err != nil {
			return nil, s.subscribeErr(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	sub := newSubscription(ctx, s, topic)
	s.activeMu.Lock()
	s.active[sub] = struct{}{}
	s.activeMu.Unlock()
	s.subs.Add(1)
	go func() {
		defer s.subs.Done()
		sub.run()
		s.activeMu.Lock()
		delete(s.active, sub)
		s.activeMu.Unlock()
	}()
	return sub.out, nil
}

// subscribeErr is Subscribe's error for err, ErrClosed when Close ended
// the read that failed.
func (s *Subscriber) subscribeErr(err error) error {
	select {
	case <-s.closing:
		return fmt.Errorf("outbox: subscribe: %w (%w)", ErrClosed, err)
	default:
		return fmt.Errorf("outbox: subscribe: %w", err)
	}
}

// Close stops every subscription: no more claims; events claimed but not
// handed out are released at once; messages handed out may still be acked or
// nacked for CloseTimeout; then pending acks are written and the channels
// close. Close is safe to call more than once.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.closing)
	}
	s.mu.Unlock()
	s.subs.Wait()
	return nil
}

// FailingSince reports whether the subscriber's claims are failing: when
// the latest claim of one of its running subscriptions failed, it returns
// the time that subscription's streak of failed claims began (the earliest
// of them) and true. A claim that succeeds, empty or not, ends its
// subscription's streak. A subscription claims at least every
// PollInterval, and after a failure retries with a backoff of up to 5 s,
// so a streak that lasts means the subscriber delivers nothing: for
// example its tables were dropped or its database user lost a privilege
// while the database still answers a ping. (A failed acknowledgement
// write is logged and its events delivered again; it is not counted
// here.) bus.Health uses it for readiness.
func (s *Subscriber) FailingSince() (time.Time, bool) {
	s.activeMu.Lock()
	defer s.activeMu.Unlock()
	var since int64
	for sub := range s.active {
		if t := sub.claimFailing.Load(); t != 0 && (since == 0 || t < since) {
			since = t
		}
	}
	if since == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, since), true
}

// noteOutcome records the outcome of a claim in streak: the start of the
// current streak of failures, 0 when the latest claim succeeded.
func noteOutcome(streak *atomic.Int64, err error) {
	if err == nil {
		streak.Store(0)
		return
	}
	streak.CompareAndSwap(0, time.Now().UnixNano())
}

// subscription is one Subscribe call: a claimer, MaxInFlight dispatchers,
// an acknowledger and a lease extender.
type subscription struct {
	s     *Subscriber
	cfg   *SubscriberConfig
	store *Store
	topic string
	// bound is the lower bound of claimLoop's claims over a backlog (see
	// claimLoop): dropped, or told a retry's due time, by what makes rows
	// due below it (a Nack recorded, ordered acks written or acknowledged
	// in a handler's transaction, a held batch aborted, lost, or settled
	// with failed, leased or ordered events).
	bound claimbound.Bound
	ctx   context.Context // the Subscribe context: values and cancellation
	// detached is ctx without its cancellation (context.WithoutCancel),
	// made once: the base of every message's context and database call.
	detached context.Context
	stop     chan struct{} // closed when the subscription must stop claiming
	out      chan *message.Message
	// started is when Subscribe made the subscription: its claims are
	// leased until HoldClaimsAfter has passed since.
	started time.Time
	queue   chan queued   // claimed, not yet handed out
	taken   chan struct{} // a dispatcher took from queue or handed
	acks    chan Receipt
	logger  watermill.LoggerAdapter

	mu      sync.Mutex
	held    map[int64]Receipt    // every claimed, unsettled event (for lease extension)
	settled map[int64]settlement // held events acknowledged, not yet forgotten
	kinds   map[int64]string     // the kind of each held event, for metrics
	ordered map[int64]bool       // held events with an ordering key

	// handed holds the events that acknowledgements claimed for this
	// subscription (the next events of the keys they settled, see
	// Store.AcknowledgeAndClaimNext), not yet handed out; handedReady
	// (capacity 1) tells the dispatchers there are some.
	handedMu    sync.Mutex
	handed      []Claimed
	handedReady chan struct{}

	// orderedAcks counts the acks of events with an ordering key that are
	// queued or being written: each will hand its key's next event over
	// to this subscription (or make it claimable) when it commits.
	orderedAcks atomic.Int64
	// ackMu guards the acknowledger's count of writes under way; ackCond
	// is signalled when a write ends, or when enough ordered acks queue up
	// for a second write.
	ackMu   sync.Mutex
	ackCond *sync.Cond

	// With HoldClaims: slots has room for maxHeldBatches open held
	// claims and settling counts the batches being settled.
	slots    chan struct{}
	settling sync.WaitGroup

	tel *subTelemetry

	// claimFailing is the start (Unix nanoseconds) of the current streak
	// of failed claims, 0 when the latest claim succeeded (see
	// Subscriber.FailingSince).
	claimFailing atomic.Int64
}

// settlement is how a held event was acknowledged.
type settlement uint8

const (
	// ackQueued: the handler acked and the acknowledger writes the ack.
	ackQueued settlement = iota + 1
	// ackedInTx: the handler acknowledged it inside its own transaction
	// (AcknowledgeInTx or AcknowledgeMessageInTx); the subscription writes
	// no ack of its own and stops extending the lease, since the row is
	// locked by that transaction until it ends.
	ackedInTx
)

// handedOut maps the receipt of every message a subscription has handed
// out and not yet settled to that subscription, so that an acknowledgement
// inside the handler's transaction (which only names receipts) reaches the
// subscription that delivered the event, whichever Store it was made with.
// Claim keys are 128 random bits: receipts do not collide.
var handedOut sync.Map // Receipt -> *subscription

// noteAckedInTx tells the subscriptions of this process that the receipts
// were acknowledged inside a handler's transaction.
func noteAckedInTx(rs []Receipt) {
	for _, r := range rs {
		if sub, ok := handedOut.Load(r); ok {
			sub.(*subscription).markAckedInTx(r)
		}
	}
}

func (sub *subscription) markAckedInTx(r Receipt) {
	sub.mu.Lock()
	if held, ok := sub.held[r.ID]; ok && held.ClaimKey == r.ClaimKey {
		sub.settled[r.ID] = ackedInTx
	}
	sub.mu.Unlock()
}

// settledAs returns how the held claim r was acknowledged, if it was.
func (sub *subscription) settledAs(r Receipt) settlement {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if held, ok := sub.held[r.ID]; ok && held.ClaimKey == r.ClaimKey {
		return sub.settled[r.ID]
	}
	return 0
}

func newSubscription(ctx context.Context, s *Subscriber, topic string) *subscription {
	s.store.noteGroup(topic, s.config.ConsumerGroup)
	sub := &subscription{
		s: s, cfg: &s.config, store: s.store, topic: topic, ctx: ctx, detached: context.WithoutCancel(ctx),
		started: time.Now(),
		stop:    make(chan struct{}),
		out:     make(chan *message.Message),
		queue:   make(chan queued, s.config.BatchSize),
		taken:   make(chan struct{}, 1),
		acks:    make(chan Receipt, ackBacklog(&s.config)),
		logger:  s.config.Logger.With(watermill.LogFields{"topic": topic, "consumer_group": s.config.ConsumerGroup}),
		held:    map[int64]Receipt{},
		settled: map[int64]settlement{},
		kinds:   map[int64]string{},
		tel:     s.store.tel.forSubscription(topic, s.config.ConsumerGroup),
		ordered: map[int64]bool{},

		handedReady: make(chan struct{}, 1),
	}
	sub.ackCond = sync.NewCond(&sub.ackMu)
	if s.config.HoldClaims {
		sub.slots = make(chan struct{}, maxHeldBatches)
	}
	return sub
}

func (sub *subscription) run() {
	go func() {
		select {
		case <-sub.ctx.Done():
		case <-sub.s.closing:
		}
		close(sub.stop)
	}()

	var claimerDone, dispatchers, background sync.WaitGroup
	claimerDone.Add(1)
	go func() { defer claimerDone.Done(); sub.claimLoop() }()
	for range sub.cfg.MaxInFlight {
		dispatchers.Add(1)
		go func() { defer dispatchers.Done(); sub.dispatchLoop() }()
	}
	ackDone := make(chan struct{})
	go func() { defer close(ackDone); sub.ackLoop() }()
	extendStop := make(chan struct{})
	background.Add(1)
	go func() { defer background.Done(); sub.extendLoop(extendStop) }()

	claimerDone.Wait()
	// The claimer has stopped: nothing more enters the queue. Hand back at
	// once what no handler has started, while running handlers finish.
	sub.releaseQueued()
	dispatchers.Wait()
	sub.releaseQueued()
	// Every held event has its outcome now: the last batches settle.
	sub.settling.Wait()
	close(sub.acks)
	<-ackDone
	// The last acks may have handed events over: release them too.
	sub.releaseQueued()
	close(extendStop)
	background.Wait()
	close(sub.out)
}

// claimLoop claims as many events as the queue has room for. A wake-up
// for events that are claimable now (a NOTIFY, an ordered ack committed)
// claims at once. After an enqueue of this process (whose transaction has
// not committed yet) or a claim that found events it polls again quickly
// (1 ms, doubling while claims come back empty, up to PollInterval), so
// events of transactions that commit just after are found soon.
func (sub *subscription) claimLoop() {
	wake, soon, unsubscribe := sub.store.wake.subscribeGroup(sub.topic, sub.cfg.ConsumerGroup)
	defer unsubscribe()
	idle := time.NewTimer(0)
	defer idle.Stop()
	var wait time.Duration
	// The most the next claim takes (besides the room in the queue): it
	// starts small and doubles after each full claim, so that the first
	// messages of a backlog go out while the rest is being claimed rather
	// than after one claim of a whole batch; an empty claim resets it.
	ramp := firstClaim(sub.cfg)
	// After a failed claim: the first retry comes quickly (after a database
	// restart every pooled connection fails once), later ones back off, with
	// jitter so that the subscriptions of a process do not retry in step.
	failed := &backoff.ExponentialBackOff{
		InitialInterval:     50 * time.Millisecond,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         5 * time.Second,
	}
	// The rows a subscription has claimed and not yet settled stay in the
	// claim index: a holding subscription's rows stay due while their
	// batch is held, and a leased one's are not due but are still read,
	// each one, by every claim on its way to the due ones (and on MySQL a
	// holding subscription's claim tries to lock each one). Over a backlog
	// (claims that come back full) claims therefore start after the
	// largest id of the last one (ClaimRequest.After; sub.bound). Rows
	// below can become due meanwhile (a retry, an expired lease, a key's
	// next event, a late commit, another process's aborted batch): the
	// bound is dropped when a claim comes back short or fails, when a
	// retry this subscription recorded comes due, when it writes ordered
	// acks (or sees one acknowledged in the handler's transaction) or
	// ends a held batch that leaves rows due or pending, and at the
	// latest claimbound.DefaultMaxAge after it was set from the oldest, so
	// such a row waits at most that long, and only during a backlog.
	for {
		// Events handed over by acknowledgements take room too: the
		// subscription holds at most a queue's worth of undispatched
		// events.
		room := cap(sub.queue) - len(sub.queue) - sub.handedLen()
		if room < max(1, cap(sub.queue)/4) {
			select {
			case <-sub.stop:
				return
			case <-sub.taken:
				continue
			}
		}
		// This claim sees what every wake-up received so far announced
		// (except events of transactions not committed yet, which the
		// quick polls below find): drop them, so that only a wake-up
		// arriving from now on calls for another claim.
		select {
		case <-wake:
		default:
		}
		select {
		case <-soon:
		default:
		}
		limit := min(room, ramp)
		req := ClaimRequest{
			Stream: sub.topic, Group: sub.cfg.ConsumerGroup, Worker: sub.cfg.Worker,
			Limit: limit, Lease: sub.cfg.Lease, MaxAttempts: sub.cfg.MaxAttempts,
			DeadLetterPolicy: sub.cfg.DeadLetterPolicy,
		}
		began := time.Now()
		after, gen := sub.bound.Next(began)
		req.After = after
		var claimed []Claimed
		var batch *heldBatch
		var err error
		if sub.holding() && time.Since(sub.started) >= sub.cfg.HoldClaimsAfter {
			var going bool
			if batch, claimed, going, err = sub.claimHeld(req); !going {
				return
			}
		} else {
			ctx, cancel := sub.opCtx()
			claimed, err = sub.store.Claim(ctx, req)
			cancel()
		}
		noteOutcome(&sub.claimFailing, err)
		if err == nil {
			var largest int64
			for _, c := range claimed {
				largest = max(largest, c.ID)
			}
			sub.bound.Claimed(began, after, gen, len(claimed), limit, largest)
		} else {
			sub.bound.Drop()
		}
		if err != nil {
			// A wake-up cuts the wait short.
			delay := failed.NextBackOff()
			sub.logger.Error("Claim failed; retrying", err, watermill.LogFields{"retry_in": delay.String()})
			idle.Reset(delay)
			select {
			case <-sub.stop:
				return
			case <-wake:
			case <-idle.C:
			}
			continue
		}
		failed.Reset()
		switch len(claimed) {
		case limit:
			ramp = min(2*ramp, cap(sub.queue))
		case 0:
			// Caught up: the next backlog starts small again. (A short
			// claim keeps the ramp: with ordering keys, claims often take
			// fewer events than they may.)
			ramp = firstClaim(sub.cfg)
		}
		if batch == nil {
			sub.track(claimed)
		} else {
			sub.tel.claimed(sub.ctx, claimed) // a held batch has no lease to extend
		}
		for _, c := range claimed {
			sub.queue <- queued{c: c, batch: batch} // never blocks: only this goroutine adds, and room was free
		}
		// The quickest poll is 1 ms per subscription of this stream in the
		// process, so many subscribers do not multiply the load.
		quick := min(time.Duration(max(sub.store.wake.count(sub.topic), 1))*time.Millisecond, sub.cfg.PollInterval)
		switch {
		case len(claimed) == limit:
			wait = 0 // more may be due right now
		case req.After > 0:
			// A claim bounded over a backlog came back short: the bound
			// is dropped, and rows below it may be due now.
			wait = 0
		case sub.orderedAcks.Load() > 0:
			// Acks of ordered events are being written: each hands the
			// next event of its key over to this subscription (or, when
			// the write fails, the writer wakes this loop; as does an
			// enqueue or a NOTIFY). Polling meanwhile would mostly find
			// nothing and slow those very writes down.
			wait = sub.cfg.PollInterval
		case len(claimed) > 0:
			wait = quick
		default:
			wait = min(max(2*wait, quick), sub.cfg.PollInterval)
		}
		if wait == 0 {
			select {
			case <-sub.stop:
				return
			default:
				continue
			}
		}
		idle.Reset(wait)
	waiting:
		for {
			select {
			case <-sub.stop:
				return
			case <-wake:
				// Claimable now: claim at once.
				wait = 0
				break waiting
			case <-soon:
				// Poll at once, unless a quick poll is due anyway.
				if wait > quick {
					wait = 0
					break waiting
				}
			case <-idle.C:
				break waiting
			}
		}
	}
}

// track counts events claimed for this subscription (by a claim or handed
// over by an acknowledgement) and records each one's receipt, kind and
// whether it is ordered, until it is settled or released.
func (sub *subscription) track(cs []Claimed) {
	sub.tel.claimed(sub.ctx, cs)
	sub.mu.Lock()
	for _, c := range cs {
		sub.held[c.ID] = c.Receipt()
		sub.kinds[c.ID] = c.Kind
		if c.OrderingKey != "" {
			sub.ordered[c.ID] = true
		}
	}
	sub.mu.Unlock()
}

// firstClaim is the most the first claim of a backlog takes: enough to
// keep every dispatcher busy for a while.
func firstClaim(c *SubscriberConfig) int {
	return min(max(4*c.MaxInFlight, 32), c.BatchSize)
}

// dispatchLoop hands queued events out one at a time and settles each.
func (sub *subscription) dispatchLoop() {
	for {
		select {
		case <-sub.stop:
			return
		default:
		}
		// Events handed over by acknowledgements first: they are the
		// heads of keys this subscription has just worked on.
		var q queued
		var ok bool
		q.c, ok = sub.popHanded()
		if !ok {
			select {
			case <-sub.stop:
				return
			case q = <-sub.queue:
			case <-sub.handedReady:
				if q.c, ok = sub.popHanded(); !ok {
					continue
				}
			}
		}
		select {
		case sub.taken <- struct{}{}:
		default:
		}
		if !sub.deliver(q) {
			return
		}
	}
}

// deliver sends one message and waits for its Ack or Nack. It returns false
// when the subscription is stopping.
func (sub *subscription) deliver(q queued) bool {
	c := q.c
	if q.batch != nil && q.batch.lost.Load() {
		// Its batch could not be settled: the event is due again, and may
		// be claimed anew (by this subscription too).
		sub.heldDone(q, heldLeft, nil)
		return true
	}
	msg := message.NewMessage(c.Key, c.Payload)
	for k, v := range c.Metadata {
		msg.Metadata.Set(k, v)
	}
	// Keys a handler sets to talk to this subscriber must not arrive already
	// set (a handler may republish the message it got).
	for _, k := range []string{MetadataHandlerError, MetadataDeadLetterNow, MetadataDeadLetterSkip, metadataAckedInTx} {
		delete(msg.Metadata, k)
	}
	msg.Metadata.Set(MetadataKind, c.Kind)
	if msg.Metadata.Get(MetadataCQRSName) == "" {
		msg.Metadata.Set(MetadataCQRSName, c.Kind)
	}
	msg.Metadata.Set(MetadataAttempt, strconv.Itoa(c.Attempts))
	if c.OrderingKey != "" {
		msg.Metadata.Set(MetadataOrderingKey, c.OrderingKey)
		msg.Metadata.Set(MetadataOrderingSeq, strconv.FormatInt(c.OrderingSeq, 10))
	} else {
		delete(msg.Metadata, MetadataOrderingKey)
		delete(msg.Metadata, MetadataOrderingSeq)
	}
	eventID := strconv.FormatInt(c.ID, 10)
	msg.Metadata.Set(MetadataEventID, eventID)
	// The message context keeps the Subscribe context's values but not its
	// cancellation: a router cancels that context as soon as it starts
	// closing, and a handler already running should be allowed to finish.
	// It is cancelled once the message is settled or the close timeout ends.
	ctx, cancel := context.WithCancel(sub.detached)
	defer cancel()
	// The consumer span of this handling (see telemetry.go) is the
	// message context's span; unsettled means released or timed out.
	var handling handling
	ctx = sub.tel.startProcess(ctx, c, eventID, &handling)
	unsettled := "released"
	defer func() { handling.end(unsettled) }()
	if q.batch != nil {
		msg.SetContext(sub.heldContext(ctx))
	} else {
		msg.SetContext(context.WithValue(ctx, receiptKey{}, delivery{receipt: c.Receipt(), store: sub.store}))
		handedOut.Store(c.Receipt(), sub)
		defer handedOut.Delete(c.Receipt())
	}

	// Stopping wins over a ready reader: what was not handed out is
	// released, not delivered after Close began.
	select {
	case <-sub.stop:
		sub.unhanded(q)
		return false
	default:
	}
	select {
	case sub.out <- msg:
		handling.handedOut(ctx, c.CreatedAt)
	case <-sub.stop:
		sub.unhanded(q)
		return false
	}
	unsettled = "timeout"

	var grace <-chan time.Time
	stopping := sub.stop
	for {
		select {
		case <-msg.Acked():
			unsettled = ""
			handling.settled(ctx, true)
			if q.batch != nil {
				sub.heldDone(q, heldDelivered, nil)
				return true
			}
			if sub.settledAs(c.Receipt()) == ackedInTx || msg.Metadata.Get(metadataAckedInTx) != "" {
				// The handler acknowledged in its own transaction, which
				// it committed before acking; if it rolled back instead,
				// the lease expires and the event is retried.
				sub.tel.acknowledged(ctx, c.Kind, 1)
				sub.forget(c.Receipt())
				if c.OrderingKey != "" {
					// That commit made the key's next event claimable,
					// below the claim bound (see claimLoop).
					sub.bound.Drop()
					sub.store.wake.notifyGroup(sub.topic, sub.cfg.ConsumerGroup)
				}
				return true
			}
			sub.queueAck(c)
			return true
		case <-msg.Nacked():
			unsettled = ""
			handling.settled(ctx, false)
			if q.batch != nil {
				sub.heldDone(q, heldFailed, msg)
				return true
			}
			sub.fail(c, msg)
			return true
		case <-stopping:
			// Let the handler finish: Ack and Nack still count until the
			// close timeout.
			stopping = nil
			timer := time.NewTimer(sub.cfg.CloseTimeout)
			defer timer.Stop()
			grace = timer.C
		case <-grace:
			sub.logger.Info("Message not settled before the close timeout; it will be delivered again (its lease expires, or its held batch leaves it due)", watermill.LogFields{"event_id": c.ID})
			if q.batch != nil {
				sub.heldDone(q, heldLeft, nil) // due again once its batch settles
			}
			sub.forget(c.Receipt())
			return false
		}
	}
}

// queueAck hands the ack of a leased claim to the acknowledger.
func (sub *subscription) queueAck(c Claimed) {
	sub.mu.Lock()
	sub.settled[c.ID] = ackQueued
	sub.mu.Unlock()
	if c.OrderingKey != "" {
		sub.orderedAcks.Add(1)
	}
	sub.acks <- c.Receipt()
	if c.OrderingKey != "" && len(sub.acks) >= secondWriteMin {
		// A second write may start. Taking the lock orders this signal
		// after the acknowledger's check or while it waits.
		sub.ackMu.Lock()
		sub.ackMu.Unlock() //nolint:staticcheck // an empty critical section on purpose
		sub.ackCond.Broadcast()
	}
}

// opCtx bounds one database call of the subscription: it outlives the
// Subscribe context (a closing router cancels that at once, and the
// subscription still has acks to write and claims to release), but not a
// hung connection.
func (sub *subscription) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(sub.detached, max(sub.cfg.Lease/2, 5*time.Second))
}

// forget stops tracking the given claims. An entry the subscription has
// since claimed again (a new key for the same id) is left alone.
func (sub *subscription) forget(rs ...Receipt) {
	sub.mu.Lock()
	for _, r := range rs {
		if held, ok := sub.held[r.ID]; ok && held.ClaimKey == r.ClaimKey {
			delete(sub.held, r.ID)
			delete(sub.settled, r.ID)
			delete(sub.kinds, r.ID)
			delete(sub.ordered, r.ID)
		}
	}
	sub.mu.Unlock()
}

// fail records a Nack: retry after Backoff or dead-letter at the limit.
func (sub *subscription) fail(c Claimed, msg *message.Message) {
	defer sub.forget(c.Receipt())
	inTx := sub.settledAs(c.Receipt()) == ackedInTx
	reason := msg.Metadata.Get(MetadataHandlerError)
	if reason == "" {
		reason = "message nacked by handler"
	}
	delay := min(max(sub.cfg.Backoff(c.Attempts), 0), MaxDelay)
	f := Failure{Reason: SanitizeErrorText(reason), MaxAttempts: sub.cfg.MaxAttempts, RetryDelay: delay, DeadLetterPolicy: sub.cfg.DeadLetterPolicy}
	if msg.Metadata.Get(MetadataDeadLetterNow) != "" {
		f.MaxAttempts = min(max(c.Attempts, 1), MaxAttempts) // retrying cannot help
		if msg.Metadata.Get(MetadataDeadLetterSkip) != "" {
			f.DeadLetterPolicy = DeadLetterSkip
		}
	}
	err := retry(sub.stop, sub.cfg.Lease/2, func() error {
		ctx, cancel := sub.opCtx()
		defer cancel()
		out, err := sub.store.Fail(ctx, c.Receipt(), f)
		if err == nil && out.DeadLettered {
			sub.logger.Info("Event dead-lettered at the attempt limit", watermill.LogFields{"event_id": c.ID, "attempts": c.Attempts})
		}
		if err == nil {
			sub.tel.failed(ctx, c.Kind, out.DeadLettered)
			switch {
			case out.DeadLettered && c.OrderingKey != "":
				// Under DeadLetterSkip the key's next event became
				// claimable, below the claim bound (see claimLoop).
				sub.bound.Drop()
				sub.store.wake.notifyGroup(sub.topic, sub.cfg.ConsumerGroup)
			case !out.DeadLettered:
				// The event is due again after its backoff, below the
				// claim bound.
				sub.bound.RetryAt(time.Now().Add(delay))
			}
		}
		return err
	})
	switch {
	case errors.Is(err, ErrStaleClaim) && inTx:
		// Either the handler's transaction committed the acknowledgement
		// (it stands: nothing was lost), or it rolled back after outliving
		// the lease, which stopped being extended when the acknowledgement
		// ran: then the event is due again already, and this Nack (its
		// backoff, its reason) is not recorded. Which one, this process
		// cannot tell without reading the row; both lose nothing.
		sub.logger.Info("Nack of an event acknowledged in the handler's transaction not recorded: the acknowledgement committed, or the transaction outlived the lease and the event is due again now", watermill.LogFields{"event_id": c.ID})
	case errors.Is(err, ErrStaleClaim):
		sub.logger.Info("Nack of an event whose lease was lost; it is retried elsewhere", watermill.LogFields{"event_id": c.ID})
	case err != nil:
		sub.logger.Error("Could not record Nack; the lease will expire and the event will be retried", err, watermill.LogFields{"event_id": c.ID})
	}
}

// retry runs op until it succeeds, fails with a stale claim, or budget has
// passed, backing off exponentially from 50 ms to 1 s with jitter
// (cenkalti/backoff): long enough to ride out a database restart without
// giving up on acks (which would mean redeliveries). Once stop is closed it
// keeps trying for at most another second.
func retry(stop <-chan struct{}, budget time.Duration, op func() error) error {
	deadline := time.Now().Add(budget)
	b := &backoff.ExponentialBackOff{
		InitialInterval:     50 * time.Millisecond,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         time.Second,
	}
	for {
		err := op()
		wait := b.NextBackOff()
		if err == nil || errors.Is(err, ErrStaleClaim) || time.Now().Add(wait).After(deadline) {
			return err
		}
		timer := time.NewTimer(wait)
		select {
		case <-stop:
			stop = nil // stopping: keep trying, but not for long
			if soon := time.Now().Add(time.Second); soon.Before(deadline) {
				deadline = soon
			}
			<-timer.C
		case <-timer.C:
		}
	}
}

// unhanded gives back an event the subscription stopped before handing
// out: a leased one is released, a held one left to its batch's settle.
func (sub *subscription) unhanded(q queued) {
	if q.batch != nil {
		sub.heldDone(q, heldLeft, nil)
		return
	}
	sub.release(q.c.Receipt())
}

func (sub *subscription) release(rs ...Receipt) {
	if len(rs) == 0 {
		return
	}
	defer sub.forget(rs...)
	for start := 0; start < len(rs); start += MaxBatch {
		chunk := rs[start:min(start+MaxBatch, len(rs))]
		ctx, cancel := sub.opCtx()
		_, err := sub.store.Release(ctx, chunk...)
		cancel()
		if err != nil {
			sub.logger.Error("Could not release claimed events; their leases will expire", err, watermill.LogFields{"events": len(chunk)})
		}
	}
}

// adopt records claims the subscription got other than from its claimer
// (handed over by an acknowledgement) and queues them for the
// dispatchers, or releases them when the subscription is stopping.
func (sub *subscription) adopt(cs []Claimed) {
	if len(cs) == 0 {
		return
	}
	sub.track(cs)
	select {
	case <-sub.stop:
		rs := make([]Receipt, len(cs))
		for i, c := range cs {
			rs[i] = c.Receipt()
		}
		sub.release(rs...)
		return
	default:
	}
	sub.handedMu.Lock()
	sub.handed = append(sub.handed, cs...)
	sub.handedMu.Unlock()
	select {
	case sub.handedReady <- struct{}{}:
	default:
	}
}

// popHanded takes the oldest event handed over, if any; when more remain
// it passes the signal on to another dispatcher.
func (sub *subscription) popHanded() (Claimed, bool) {
	sub.handedMu.Lock()
	if len(sub.handed) == 0 {
		sub.handedMu.Unlock()
		return Claimed{}, false
	}
	c := sub.handed[0]
	sub.handed[0] = Claimed{}
	sub.handed = sub.handed[1:]
	more := len(sub.handed) > 0
	if !more {
		sub.handed = nil
	}
	sub.handedMu.Unlock()
	if more {
		select {
		case sub.handedReady <- struct{}{}:
		default:
		}
	}
	return c, true
}

func (sub *subscription) handedLen() int {
	sub.handedMu.Lock()
	defer sub.handedMu.Unlock()
	return len(sub.handed)
}

// releaseQueued hands back everything claimed but never handed out.
func (sub *subscription) releaseQueued() {
	sub.handedMu.Lock()
	rs := make([]Receipt, 0, len(sub.handed))
	for _, c := range sub.handed {
		rs = append(rs, c.Receipt())
	}
	sub.handed = nil
	sub.handedMu.Unlock()
	for {
		select {
		case q := <-sub.queue:
			if q.batch != nil {
				sub.heldDone(q, heldLeft, nil)
				continue
			}
			rs = append(rs, q.c.Receipt())
		default:
			sub.release(rs...)
			return
		}
	}
}

// ackBacklog is the capacity of a subscription's ack queue: one claim batch
// plus the messages in flight. A handler's Ack waits while the queue is full,
// and the writes under way together hold at most as many acks, so at most
// two backlogs of acks (one queued, one being written) plus MaxInFlight are
// unwritten at any time: that bounds what a crash delivers again (see
// docs/architecture.md).
func ackBacklog(c *SubscriberConfig) int {
	return min(c.BatchSize+c.MaxInFlight, MaxBatch)
}

// orderedAckBatch is the most acks one write takes while acks of ordered
// events are waiting. Smaller writes commit sooner, and each commit makes
// the next events of its keys claimable, so the handlers get work while
// the next write runs. (On PostgreSQL the statement that settles ordered
// events now costs about the same per event whatever its batch.)
const orderedAckBatch = 128

// secondWriteMin is how many acks must be queued, ordered ones among them,
// for a second ack write to start while one runs.
const secondWriteMin = 32

// maxAckWrites is the most ack writes a subscription has under way at once:
// a second write runs alongside the first only while acks of ordered events
// are queued or being written (see ackLoop), and never on SQLite, which
// runs one write at a time anyway.
func (sub *subscription) maxAckWrites() int {
	if sub.store.Dialect() == string(sqlcore.SQLite) {
		return 1
	}
	return 2
}

// ackLoop writes acks in batches: it waits for one, takes every other ack
// already waiting, and writes them in one statement; there is no timer, so
// an ack waits at most for the write before it to end, then for its own.
// The writes under way hold at most the queue's capacity of acks together.
//
// Acks of ordered events may be written by two statements at once, in
// batches of at most orderedAckBatch: the next event of a key becomes
// claimable only when the ack of its head commits, and one long write of a
// big batch would leave the handlers idle until it ends. Concurrent writes
// never wait for each other: their receipts are distinct, and so are their
// ordering keys (a subscription holds at most one event per key and group).
// Unordered acks gain nothing from a second write (they are cheap to write
// and nothing waits for them), so a stream without ordering keys keeps one
// write at a time and its big batches.
func (sub *subscription) ackLoop() {
	writes := sub.maxAckWrites()
	var (
		mu      = &sub.ackMu
		writing int // writes under way
		held    int // acks in them
		writers sync.WaitGroup
	)
	for {
		// Wait for a write to be allowed before taking an ack from the
		// queue, so that the queue and the writes under way never hold
		// more than two queues' worth of acks together. A second write
		// runs only for ordered acks, and only when enough of them wait:
		// with few keys, splitting a handful of acks over two statements
		// would only add commits and claims.
		mu.Lock()
		for writing > 0 && (writing >= writes || held >= cap(sub.acks) || sub.orderedAcks.Load() == 0 || len(sub.acks) < secondWriteMin) {
			sub.ackCond.Wait()
		}
		mu.Unlock()
		r, ok := <-sub.acks
		if !ok {
			break
		}
		mu.Lock()
		limit := cap(sub.acks) - held
		if sub.orderedAcks.Load() > 0 {
			limit = min(limit, orderedAckBatch)
		}
		batch := make([]Receipt, 1, limit)
		batch[0] = r
	more:
		for len(batch) < limit {
			select {
			case r, ok := <-sub.acks:
				if !ok {
					break more
				}
				batch = append(batch, r)
			default:
				break more
			}
		}
		writing++
		held += len(batch)
		mu.Unlock()
		writers.Go(func() {
			sub.flushAcks(batch)
			mu.Lock()
			writing--
			held -= len(batch)
			mu.Unlock()
			sub.ackCond.Broadcast()
		})
	}
	writers.Wait()
}

func (sub *subscription) flushAcks(batch []Receipt) {
	defer sub.forget(batch...)
	sub.mu.Lock()
	ordered := 0
	for _, r := range batch {
		if sub.ordered[r.ID] {
			ordered++
		}
	}
	sub.mu.Unlock()
	// The acknowledgement claims the next event of each key it settles
	// for this subscription (see Store.AcknowledgeAndClaimNext), unless
	// the subscription is stopping (those would only be released).
	handOver := ordered > 0
	select {
	case <-sub.stop:
		handOver = false
	default:
	}
	if ordered > 0 {
		// The claimer waits for these acks rather than polling (see
		// claimLoop): wake it when they are written, whether or not the
		// write succeeds, unless the write handed the keys' next events
		// over (a claim would find nothing more; handOver is false after
		// a failed write).
		defer func() {
			// Keys' next events not handed over became pending, below
			// the claim bound (see claimLoop).
			sub.bound.Drop()
			sub.orderedAcks.Add(-int64(ordered))
			if !handOver {
				sub.store.wake.notifyGroup(sub.topic, sub.cfg.ConsumerGroup)
			}
		}()
	}
	var stale []Receipt
	err := retry(nil, sub.cfg.Lease/2, func() error {
		var err error
		ctx, cancel := sub.opCtx()
		defer cancel()
		if !handOver {
			stale, err = sub.store.AcknowledgeBatch(ctx, batch)
			return err
		}
		var next []Claimed
		next, stale, err = sub.store.AcknowledgeAndClaimNext(ctx, batch, ClaimRequest{
			Stream: sub.topic, Group: sub.cfg.ConsumerGroup, Worker: sub.cfg.Worker,
			Limit: len(batch), Lease: sub.cfg.Lease, MaxAttempts: sub.cfg.MaxAttempts,
			DeadLetterPolicy: sub.cfg.DeadLetterPolicy,
		})
		sub.adopt(next)
		return err
	})
	if err != nil {
		handOver = false
		sub.logger.Error("Could not record acks; the events will be delivered again after their leases expire", err, watermill.LogFields{"events": len(batch)})
		return
	}
	if len(stale) > 0 {
		sub.logger.Info("Acked events had lost their leases and may be delivered again", watermill.LogFields{"events": len(stale)})
	}
	sub.countAcks(batch, stale)
}

// countAcks counts the written acks of a batch (not the stale ones) per
// kind.
func (sub *subscription) countAcks(batch, stale []Receipt) {
	lost := make(map[int64]bool, len(stale))
	for _, r := range stale {
		lost[r.ID] = true
	}
	perKind := map[string]int{}
	sub.mu.Lock()
	for _, r := range batch {
		if !lost[r.ID] {
			perKind[sub.kinds[r.ID]]++
		}
	}
	sub.mu.Unlock()
	for kind, n := range perKind {
		sub.tel.acknowledged(sub.ctx, kind, n)
	}
}

// extendLoop renews the lease of every held event every Lease/3. Once stop
// is closed (the subscription has ended: every message is settled, every
// ack written or given up) a renewal under way is cancelled and no further
// chunk is sent: on a database that does not answer, each chunk would
// otherwise keep Close waiting for a statement's bound.
func (sub *subscription) extendLoop(stop <-chan struct{}) {
	ended, end := context.WithCancel(context.Background())
	defer end()
	go func() {
		select {
		case <-stop:
			end()
		case <-ended.Done():
		}
	}()
	ticker := time.NewTicker(sub.cfg.Lease / 3)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		sub.mu.Lock()
		rs := make([]Receipt, 0, len(sub.held))
		for _, r := range sub.held {
			if sub.settled[r.ID] != ackedInTx {
				rs = append(rs, r)
			}
		}
		sub.mu.Unlock()
		slices.SortFunc(rs, func(a, b Receipt) int { return cmp.Compare(a.ID, b.ID) })
		for start := 0; start < len(rs); start += extendChunk {
			if ended.Err() != nil {
				return
			}
			chunk := rs[start:min(start+extendChunk, len(rs))]
			ctx, cancel := sub.opCtx()
			unstop := context.AfterFunc(ended, cancel)
			_, stale, err := sub.store.ExtendBatch(ctx, chunk, sub.cfg.Lease)
			unstop()
			cancel()
			if err != nil {
				if ended.Err() != nil {
					return // cancelled by the end, not a failure
				}
				sub.logger.Error("Could not extend leases", err, watermill.LogFields{"events": len(chunk)})
				continue
			}
			// An event acked meanwhile (by the acknowledger or in the
			// handler's transaction) is stale to Extend but not lost.
			sub.mu.Lock()
			lost := 0
			for _, r := range stale {
				if held, ok := sub.held[r.ID]; ok && held.ClaimKey == r.ClaimKey && sub.settled[r.ID] == 0 {
					lost++
				}
			}
			sub.mu.Unlock()
			if lost > 0 {
				sub.logger.Info("Some held events lost their leases and may be delivered elsewhere", watermill.LogFields{"events": lost})
			}
		}
	}
}

// extendChunk is the most leases one extension statement renews. Shorter
// statements hold their row locks for less time, so the acknowledger (which
// locks some of the same rows) waits less for them and they for it.
const extendChunk = 250
