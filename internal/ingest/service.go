// Package ingest owns allot's HTTP API: it validates requests, publishes
// them to JetStream and answers 202 only after the PubAck; it serves result
// polls (optionally waiting for the allocator's result notification),
// activity and signup reads from MySQL, idempotency keys in a JetStream KV
// bucket, health, readiness and metrics. It never writes to MySQL.
package ingest

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/ingest/ui"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// Defaults of Options; the first two are api/openapi.yaml's numbers.
const (
	DefaultMaxWait         = 30 * time.Second
	DefaultMaxInFlight     = 2048 // below nats.go's default async-publish bound of 4000
	DefaultBodyLimit       = 64 << 10
	DefaultPublishTimeout  = 5 * time.Second
	DefaultRecheckInterval = time.Second
	DefaultQueryTimeout    = 5 * time.Second
	DefaultEarlyResults    = 100_000
	DefaultActivityCache   = 100_000
	DefaultMaxWaiters      = 10_000
	DefaultOpenRate        = 50
)

// Options are the HTTP-independent settings of a Service. A zero field takes
// its default.
type Options struct {
	// MaxWait caps ?wait=; longer waits count as MaxWait. Default 30s.
	MaxWait time.Duration
	// BodyLimit is the largest accepted request body; larger is a 413.
	// Default 64 KiB.
	BodyLimit int64
	// PublishTimeout bounds one publish to JetStream, PubAck included, and
	// one idempotency-key read or write. Default 5s.
	PublishTimeout time.Duration
	// RecheckInterval is how often a waiting handler reads MySQL again in
	// case a result notification was dropped (core NATS is at most once); it
	// also reads once at its deadline. Default 1s.
	RecheckInterval time.Duration
	// QueryTimeout bounds one MySQL read. Default 5s.
	QueryTimeout time.Duration
	// IDSecret keys the request-id checksum; empty means DefaultIDSecret.
	// Every ingest instance must use the same value.
	IDSecret string
	// RateLimit, when positive, caps accepted writes per second of this
	// instance; excess writes answer 429 with Retry-After. Default off.
	RateLimit float64
	// RateBurst is the burst of RateLimit; default max(1, RateLimit/10).
	RateBurst int
	// UserRate, when positive, caps each user's writes per second
	// (ALLOT_INGEST_USER_RATE); excess writes answer 429 with Retry-After.
	UserRate float64
	// UserBurst is the burst of UserRate; default max(1, 2*UserRate).
	UserBurst int
	// Partitions is ALLOT_PARTITIONS: the request stream must have as
	// many (checked at Start); 0 takes what it has.
	Partitions int
	// DisableShed turns off answering claims for a full activity early
	// (ALLOT_SHED=false): every claim then waits for the allocator.
	DisableShed bool
	// EarlyWait bounds how long a claim for a full activity waits for the
	// request-stream tail to pass it before it is left to the allocator.
	// Default DefaultEarlyWait.
	EarlyWait time.Duration
	// TailReplay is how many of the request stream's latest messages the
	// tail reads at start. Default DefaultTailReplay.
	TailReplay uint64
	// CommitMinBatch is the smallest queue of requests that is published
	// as one atomic batch (group commit); smaller queues are published
	// message by message. Negative: never batch. Default
	// DefaultCommitMinBatch.
	CommitMinBatch int
	// EarlyResults bounds the early answers kept for polls of their ids
	// until the allocator has recorded them. Default DefaultEarlyResults.
	EarlyResults int
	// MaxInFlight bounds the publishes awaiting their PubAck; a write beyond
	// it answers 503 at once rather than queueing without bound. Default 2048.
	MaxInFlight int
	// ActivityCache bounds the activities whose view and last change
	// ingest keeps for early answers (LRU). Default DefaultActivityCache.
	ActivityCache int
	// MaxWaiters bounds the handlers waiting for a result (?wait=); a
	// write or poll with ?wait= beyond it is served as if it had no
	// ?wait=: the poll answers 200 with what is known, the write is
	// published and answered 202. Default DefaultMaxWaiters.
	MaxWaiters int
	// OpenRate caps opens and resizes per second of this instance (burst
	// twice that); beyond, 429. Negative: no cap. Default DefaultOpenRate.
	OpenRate float64
	// Auth verifies bearer tokens; nil serves without authentication
	// (ALLOT_AUTH=none, or a loopback listener without a key: Run decides).
	Auth *auth.Verifier
	// BadAuthRate is how many requests per second (burst
	// DefaultBadAuthBurst) one client address may send that fail
	// authentication; beyond, those answer 429 (a valid token never does).
	// Negative: no limit. Default DefaultBadAuthRate.
	BadAuthRate float64
	// SettleMax bounds the request ids whose PubAck was lost that this
	// instance republishes or voids at once (settle.go). Default
	// DefaultSettleMax.
	SettleMax int
	// ReadRate, when positive, caps each caller's activity and signup
	// reads per second (ALLOT_INGEST_READ_RATE): the token's subject, or
	// without authentication the path's user of a signup read (activity
	// reads are then not limited); allot:admin tokens are not limited.
	// Excess reads answer 429 with Retry-After.
	ReadRate float64
	// ReadBurst is the burst of ReadRate; default max(1, 2*ReadRate).
	ReadBurst int
	// TrustedProxies are the proxies (ALLOT_TRUSTED_PROXIES) whose
	// X-Forwarded-For names the client address that the bad-token limiter
	// counts; empty: the peer address counts and the header is ignored.
	TrustedProxies []netip.Prefix
	// Gatherer is what /metrics serves. When nil, the Registerer given to New
	// is served if it is also a Gatherer (a *prometheus.Registry is), else a
	// private registry holding ingest's metrics.
	Gatherer prometheus.Gatherer
}

func (o Options) withDefaults() (Options, error) {
	def := func(d *time.Duration, v time.Duration, name string) error {
		if *d < 0 {
			return fmt.Errorf("ingest: %s must not be negative, got %s", name, *d)
		}
		if *d == 0 {
			*d = v
		}
		return nil
	}
	for _, e := range []error{
		def(&o.MaxWait, DefaultMaxWait, "MaxWait"),
		def(&o.PublishTimeout, DefaultPublishTimeout, "PublishTimeout"),
		def(&o.RecheckInterval, DefaultRecheckInterval, "RecheckInterval"),
		def(&o.QueryTimeout, DefaultQueryTimeout, "QueryTimeout"),
		def(&o.EarlyWait, DefaultEarlyWait, "EarlyWait"),
	} {
		if e != nil {
			return o, e
		}
	}
	if o.BodyLimit < 0 {
		return o, fmt.Errorf("ingest: BodyLimit must not be negative, got %d", o.BodyLimit)
	}
	if o.BodyLimit == 0 {
		o.BodyLimit = DefaultBodyLimit
	}
	if o.ReadRate < 0 || o.ReadBurst < 0 {
		return o, errors.New("ingest: ReadRate and ReadBurst must not be negative")
	}
	if o.RateLimit < 0 || o.RateBurst < 0 {
		return o, errors.New("ingest: RateLimit and RateBurst must not be negative")
	}
	if o.RateLimit > 0 && o.RateBurst == 0 {
		o.RateBurst = max(1, int(o.RateLimit/10))
	}
	if o.MaxInFlight < 0 {
		return o, fmt.Errorf("ingest: MaxInFlight must not be negative, got %d", o.MaxInFlight)
	}
	if o.CommitMinBatch == 0 {
		o.CommitMinBatch = DefaultCommitMinBatch
	}
	if o.ActivityCache < 0 || o.MaxWaiters < 0 {
		return o, errors.New("ingest: ActivityCache and MaxWaiters must not be negative")
	}
	o.ActivityCache = cmp.Or(o.ActivityCache, DefaultActivityCache)
	o.MaxWaiters = cmp.Or(o.MaxWaiters, DefaultMaxWaiters)
	o.OpenRate = cmp.Or(o.OpenRate, DefaultOpenRate)
	o.BadAuthRate = cmp.Or(o.BadAuthRate, DefaultBadAuthRate)
	if o.TailReplay == 0 {
		o.TailReplay = DefaultTailReplay
	}
	if o.EarlyResults < 0 {
		return o, fmt.Errorf("ingest: EarlyResults must not be negative, got %d", o.EarlyResults)
	}
	if o.EarlyResults == 0 {
		o.EarlyResults = DefaultEarlyResults
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.SettleMax < 0 {
		return o, fmt.Errorf("ingest: SettleMax must not be negative, got %d", o.SettleMax)
	}
	o.SettleMax = cmp.Or(o.SettleMax, DefaultSettleMax)
	return o, nil
}

// Service is the ingest HTTP API. Create it with New, call Start before
// serving Handler, and Stop when the HTTP server has shut down.
type Service struct {
	db   *sql.DB
	nc   *nats.Conn
	js   jetstream.JetStream
	log  *slog.Logger
	opts Options

	ids    *idIssuer
	views  views
	tail   *tail
	commit *committer // nil when CommitMinBatch < 0
	reader *resultReader
	posns  *store.Positions // signup reads
	settle *settler
	dbUp   *dbProbe
	opens  *rate.Limiter // nil when OpenRate < 0
	// early holds the early answers given by this instance, for polls that
	// come before the allocator has recorded them.
	early   *lru.Cache[string, wire.Result]
	flight  chan struct{} // one token per publish in flight
	waiters *waiters
	limiter *rate.Limiter // nil when RateLimit is off
	users   *userLimiter  // nil when UserRate is off
	badAuth *badAuth      // nil without authentication or with BadAuthRate < 0
	readers *userLimiter  // nil when ReadRate is off
	metrics *metrics
	handler http.Handler
	ui      *ui.Server // the live operator page and its feed

	mu       sync.Mutex
	kv       jetstream.KeyValue // set by Start
	sub      *nats.Subscription
	quit     chan struct{} // closed by endWaits: waiting handlers answer now
	quitOnce sync.Once
	stopped  bool
	// stopViews ends the view watcher and the tail, stopCommit the group
	// commit.
	stopViews, stopCommit context.CancelFunc
}

// New builds a Service over db (read only: results, activities, signups),
// nc and js (publishing, idempotency keys, result notifications), logging to
// log and registering its metrics with reg (nil: a private registry). It
// does no I/O; Start does.
func New(db *sql.DB, nc *nats.Conn, js jetstream.JetStream, log *slog.Logger, reg prometheus.Registerer, opts Options) (*Service, error) {
	if db == nil || nc == nil || js == nil {
		return nil, errors.New("ingest: New needs a database, a NATS connection and a JetStream handle")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	gatherer := opts.Gatherer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if gatherer == nil {
		if g, ok := reg.(prometheus.Gatherer); ok {
			gatherer = g
		} else {
			return nil, errors.New("ingest: the Registerer is not a Gatherer; set Options.Gatherer for /metrics")
		}
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Service{
		db:      db,
		nc:      nc,
		js:      js,
		log:     log,
		opts:    opts,
		ids:     newIDIssuer(opts.IDSecret),
		tail:    newTail(opts.ActivityCache),
		reader:  newResultReader(db, opts.QueryTimeout, m.resultQueries.Inc),
		posns:   store.NewPositions(db),
		dbUp:    &dbProbe{db: db, timeout: min(opts.QueryTimeout, 2*time.Second)},
		flight:  make(chan struct{}, opts.MaxInFlight),
		waiters: newWaiters(m.waiters),
		metrics: m,
		quit:    make(chan struct{}),
	}
	s.settle = newSettler(s, opts.SettleMax)
	if opts.CommitMinBatch > 0 {
		s.commit = &committer{nc: nc, js: js, log: log, in: make(chan *pubRequest, opts.MaxInFlight),
			minBatch: opts.CommitMinBatch, maxBatch: DefaultCommitMaxBatch, timeout: opts.PublishTimeout / 2,
			batches: func(n int) { m.commitBatch.Observe(float64(n)) }}
	}
	if s.views.m, err = lru.New[int64, viewEntry](opts.ActivityCache); err != nil {
		return nil, err
	}
	if opts.OpenRate > 0 {
		s.opens = rate.NewLimiter(rate.Limit(opts.OpenRate), max(1, int(2*opts.OpenRate)))
	}
	if s.early, err = lru.New[string, wire.Result](opts.EarlyResults); err != nil {
		return nil, err
	}
	if opts.RateLimit > 0 {
		s.limiter = rate.NewLimiter(rate.Limit(opts.RateLimit), opts.RateBurst)
	}
	if opts.Auth != nil && opts.BadAuthRate > 0 {
		s.badAuth = newBadAuth(opts.BadAuthRate)
	}
	if opts.ReadRate > 0 {
		s.readers = newUserLimiter(opts.ReadRate, cmp.Or(opts.ReadBurst, max(1, int(2*opts.ReadRate))))
	}
	if opts.UserRate > 0 {
		s.users = newUserLimiter(opts.UserRate, cmp.Or(opts.UserBurst, max(1, int(2*opts.UserRate))))
	}
	// Live streams end when waits do (endWaits), so that an open operator
	// page never holds a graceful shutdown.
	if s.ui, err = ui.New(ui.Config{DB: db, JS: js, Log: log, Done: s.quit, QueryTimeout: opts.QueryTimeout}); err != nil {
		return nil, err
	}
	s.handler = traced(s.routes(gatherer))
	return s, nil
}

// Start checks the streams and buckets ingest needs (`allotctl setup`
// makes them) and subscribes to the result notifications. It fails with bus.ErrUnavailable when NATS or
// JetStream does not answer.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sub != nil || s.stopped {
		return errors.New("ingest: Start called twice or after Stop")
	}
	// Only `allotctl setup` creates or changes streams and buckets: ingest
	// checks that what it needs is there as allot sets it up.
	st, partitions, err := bus.CheckRequestStream(ctx, s.js, s.opts.Partitions)
	if err != nil {
		return fmt.Errorf("ingest start: %w", err)
	}
	// Ids name their partition, and lost PubAcks are settled within the
	// duplicate window: both come from the stream as it is.
	s.settle.configure(st.CachedInfo().Config.Duplicates, partitions)
	if err := bus.CheckEventStream(ctx, s.js); err != nil {
		return fmt.Errorf("ingest start: %w", err)
	}
	kv, err := bus.CheckBucket(ctx, s.js, bus.IdempotencyBucketConfig(1))
	if err != nil {
		return fmt.Errorf("ingest start: %w", err)
	}
	if !s.opts.DisableShed {
		vkv, err := bus.CheckBucket(ctx, s.js, bus.ViewBucketConfig(1))
		if err != nil {
			return fmt.Errorf("ingest start: %w", err)
		}
		cancel, err := s.watchViews(vkv)
		if err != nil {
			return fmt.Errorf("ingest start: %w: watch %s: %w", bus.ErrUnavailable, wire.ViewBucket, err)
		}
		s.stopViews = cancel
		if err := s.tail.start(ctx, s.js, s.opts.TailReplay, s.log); err != nil {
			cancel()
			return fmt.Errorf("ingest start: %w", err)
		}
		// Start is retried while JetStream is not ready (Run): a failed
		// attempt must not leave its watcher behind.
		defer func() {
			if s.sub == nil { // this attempt failed after all
				cancel()
				s.tail.stop()
				s.stopViews = nil
			}
		}()
	}
	sub, err := s.nc.Subscribe(wire.ResultSubject, s.onResults)
	if err != nil {
		return fmt.Errorf("ingest start: %w: subscribe %s: %w", bus.ErrUnavailable, wire.ResultSubject, err)
	}
	// A slow handler must not make the server cut the connection: beyond
	// these limits notifications are dropped, and waiters read MySQL.
	if err := sub.SetPendingLimits(1<<16, 256<<20); err != nil {
		sub.Unsubscribe() //nolint:errcheck
		return fmt.Errorf("ingest start: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, s.opts.PublishTimeout) // Flush needs a deadline
	defer cancel()
	if err := s.nc.FlushWithContext(fctx); err != nil {
		sub.Unsubscribe() //nolint:errcheck
		return fmt.Errorf("ingest start: %w: flush subscription: %w", bus.ErrUnavailable, err)
	}
	cctx, stopCommit := context.WithCancel(context.Background())
	s.stopCommit = stopCommit
	if s.commit != nil {
		s.commit.run(cctx)
	}
	s.reader.run(cctx)
	s.kv, s.sub = kv, sub
	s.log.InfoContext(ctx, "ingest started",
		slog.String("bucket", bus.IdempotencyBucket),
		slog.String("result_subject", wire.ResultSubject))
	return nil
}

// endWaits makes every waiting handler answer now with what it knows; the
// first step of a graceful shutdown, so that in-flight requests finish.
func (s *Service) endWaits() {
	s.quitOnce.Do(func() { close(s.quit) })
}

// Stop ends the waits in progress and unsubscribes from the result
// notifications. Call it after the HTTP server has stopped; it does not
// close the NATS connection or the database, which the caller owns. A
// stopped Service cannot be started again.
func (s *Service) Stop() {
	s.endWaits()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.stopViews != nil {
		s.stopViews()
		s.tail.stop()
	}
	if s.stopCommit != nil {
		s.stopCommit()
	}
	s.settle.stop()
	if s.sub != nil {
		if err := s.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			s.log.Warn("unsubscribe results", slog.Any("err", err))
		}
		s.sub = nil
	}
}

// Handler is the HTTP API: every route of api/openapi.yaml, /healthz, /readyz
// and /metrics, with JSON errors, panic recovery and request metrics.
func (s *Service) Handler() http.Handler { return s.handler }

func (s *Service) bucket() jetstream.KeyValue {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kv
}
