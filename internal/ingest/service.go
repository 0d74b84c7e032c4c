// Package ingest owns allot's HTTP API: it validates requests, publishes
// them to JetStream and answers 202 only after the PubAck; it serves result
// polls (optionally waiting for the allocator's result notification),
// activity and signup reads from MySQL, idempotency keys in a JetStream KV
// bucket, health, readiness and metrics. It never writes to MySQL.
//
// Service composes the components, each a package of its own:
//
//   - access: authentication, route policies, rate limits, client
//     addresses, request ids;
//   - idempotency: Idempotency-Key bindings;
//   - shed: shedding, answering a claim for a full activity before the
//     allocator applies it (views and the tail of the request stream);
//   - publish: the group commit, the PubAck wait, and the settling of a
//     request that may be stored;
//   - reads: which shard each read goes to, and whether each answers;
//   - results: waiting for a result and the coalesced MySQL reads;
//   - ui: the live operator page;
//   - reply: the HTTP answers they all write.
//
// write.go is the write pipeline that strings them together.
package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/ingest/idempotency"
	"github.com/allot-dev/allot/internal/ingest/publish"
	"github.com/allot-dev/allot/internal/ingest/reads"
	"github.com/allot-dev/allot/internal/ingest/results"
	"github.com/allot-dev/allot/internal/ingest/shed"
	"github.com/allot-dev/allot/internal/ingest/ui"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/wire"
)

// Bounds that are not configuration: api/openapi.yaml's numbers and
// ingest's own. Only tests change some of them (TestHooks).
const (
	MaxWait                = 30 * time.Second
	BodyLimit              = 64 << 10
	DefaultRecheckInterval = time.Second
	DefaultQueryTimeout    = 5 * time.Second
)

// Service is the ingest HTTP API. Create it with New, call Start before
// serving Handler, and Stop when the HTTP server has shut down.
type Service struct {
	cfg     Config
	deps    Deps // DB, NATS, JS and Log are set
	callers callers
	keys    *idempotency.Keys
	shed    *shed.Answerer // started only when cfg.Shed
	pub     *publish.Publisher
	results *results.Results
	ui      *ui.Server   // the live operator page and its feed
	rd      *reads.Reads // the shards reads go to, with their signup reads and pings
	metrics *metrics
	handler http.Handler
	state   runState
}

// callers is what the service knows of its callers: who may call what, at
// what rate (access), and the request ids issued to whom (ids).
type callers struct {
	access *access.Access
	ids    *access.IDIssuer
}

// runState is what Start and Stop change.
type runState struct {
	mu      sync.Mutex
	sub     *nats.Subscription
	stopped bool
}

// New builds a Service of cfg over deps.Shards, or deps.DB as the one
// shard (read only: results, activities, signups), and deps.NATS
// (publishing, idempotency keys, result notifications). cfg is used as it
// is: validate it first (Config.Validate). It does no I/O; Start does.
func New(cfg Config, deps Deps) (*Service, error) {
	if deps.Shards == nil && deps.DB != nil {
		deps.Shards = shards.Pools{shards.DefaultName: deps.DB}
	}
	if len(deps.Shards) == 0 || deps.NATS == nil {
		return nil, errors.New("ingest: New needs a database and a NATS connection")
	}
	if deps.JS == nil {
		js, err := jetstream.New(deps.NATS)
		if err != nil {
			return nil, fmt.Errorf("ingest: jetstream: %w", err)
		}
		deps.JS = js
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	gatherer := deps.Gatherer
	if gatherer == nil {
		g, ok := deps.Registry.(prometheus.Gatherer)
		if !ok {
			return nil, errors.New("ingest: the Registry is not a Gatherer; set Deps.Gatherer for /metrics")
		}
		gatherer = g
	}
	m, err := newMetrics(deps.Registry)
	if err != nil {
		return nil, err
	}
	t := deps.Test
	query := t.queryTimeout()
	rd, err := reads.New(deps.Shards, min(query, 2*time.Second), m.reads)
	if err != nil {
		return nil, err
	}
	m.shardUp.probe = func(ctx context.Context) { rd.Probe(ctx) }
	s := &Service{
		cfg:  cfg,
		deps: deps,
		callers: callers{
			access: access.New(cfg.accessConfig(t), deps.Verifier, deps.Log, m.access),
			ids:    access.NewIDIssuer(cfg.IDSecret),
		},
		keys:    idempotency.New(cfg.PublishTimeout),
		pub:     publish.New(cfg.publishConfig(t), deps.NATS, deps.JS, deps.Log, m.publish),
		rd:      rd,
		metrics: m,
	}
	if s.shed, err = shed.New(shed.Config{ActivityCache: cfg.ActivityCache, Wait: cmp.Or(t.ShedWait, shed.DefaultWait),
		TailReplay: shed.DefaultTailReplay, Results: shed.DefaultResults}, deps.Log, m.shed); err != nil {
		return nil, err
	}
	var onView func(wire.View)
	if cfg.Shed {
		onView = s.shed.PutView
	}
	s.results = results.New(results.Config{MaxWaiters: cfg.MaxWaiters, QueryTimeout: query, Recheck: t.recheck()},
		rd, s.locate, deps.Log, m.results, onView)
	// Live streams end when waits do (endWaits), so that an open operator
	// page never holds a graceful shutdown.
	// With several shards the page reads each activity on its shard and
	// shows every shard; with one, as before shards.
	uc := ui.Config{JS: deps.JS, Log: deps.Log, Done: s.results.Done(), QueryTimeout: query}
	if rd.Single() {
		uc.DB = rd.Shards()[0].DB
	} else {
		uc.Route, uc.Shards = s.uiRoute, s.uiShards
	}
	if s.ui, err = ui.New(uc); err != nil {
		return nil, err
	}
	s.handler = traced(s.routes(gatherer))
	return s, nil
}

// Start checks the streams and buckets ingest needs (`allotctl setup`
// makes them) and subscribes to the result notifications. It fails with bus.ErrUnavailable when NATS or
// JetStream does not answer.
func (s *Service) Start(ctx context.Context) error {
	s.state.mu.Lock()
	defer s.state.mu.Unlock()
	if s.state.sub != nil || s.state.stopped {
		return errors.New("ingest: Start called twice or after Stop")
	}
	// Only `allotctl setup` creates or changes streams and buckets: ingest
	// checks that what it needs is there as allot sets it up.
	st, partitions, err := bus.CheckRequestStream(ctx, s.deps.JS, s.cfg.Partitions)
	if err != nil {
		return fmt.Errorf("ingest start: %w", err)
	}
	// Ids name their partition, and lost PubAcks are settled within the
	// duplicate window: both come from the stream as it is.
	s.pub.Configure(st.CachedInfo().Config.Duplicates, partitions)
	// Reads go to each partition's shard: with several, the map is
	// watched from here on.
	if err := s.rd.Start(ctx, s.deps.JS, partitions, s.deps.Log); err != nil {
		return fmt.Errorf("ingest start: %w", err)
	}
	if err := bus.CheckEventStream(ctx, s.deps.JS); err != nil {
		return fmt.Errorf("ingest start: %w", err)
	}
	kv, err := bus.CheckBucket(ctx, s.deps.JS, bus.IdempotencyBucketConfig(1))
	if err != nil {
		return fmt.Errorf("ingest start: %w", err)
	}
	if s.cfg.Shed {
		if err := s.shed.Start(ctx, s.deps.JS); err != nil {
			return fmt.Errorf("ingest start: %w", err)
		}
		// Start is retried while JetStream is not ready (Run): a failed
		// attempt must not leave its watcher behind.
		defer func() {
			if s.state.sub == nil { // this attempt failed after all
				s.shed.Stop()
			}
		}()
	}
	sub, err := s.deps.NATS.Subscribe(wire.ResultSubject, s.results.OnBatch)
	if err != nil {
		return fmt.Errorf("ingest start: %w: subscribe %s: %w", bus.ErrUnavailable, wire.ResultSubject, err)
	}
	// A slow handler must not make the server cut the connection: beyond
	// these limits notifications are dropped, and waiters read MySQL.
	if err := sub.SetPendingLimits(1<<16, 256<<20); err != nil {
		sub.Unsubscribe() //nolint:errcheck
		return fmt.Errorf("ingest start: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout) // Flush needs a deadline
	defer cancel()
	if err := s.deps.NATS.FlushWithContext(fctx); err != nil {
		sub.Unsubscribe() //nolint:errcheck
		return fmt.Errorf("ingest start: %w: flush subscription: %w", bus.ErrUnavailable, err)
	}
	s.pub.Start()
	s.results.Start()
	s.keys.Bind(kv)
	s.state.sub = sub
	s.deps.Log.InfoContext(ctx, "ingest started",
		slog.String("bucket", bus.IdempotencyBucket),
		slog.String("result_subject", wire.ResultSubject))
	return nil
}

// endWaits makes every waiting handler answer now with what it knows; the
// first step of a graceful shutdown, so that in-flight requests finish.
func (s *Service) endWaits() { s.results.EndWaits() }

// Stop ends the waits in progress and unsubscribes from the result
// notifications. Call it after the HTTP server has stopped; it does not
// close the NATS connection or the database, which the caller owns. A
// stopped Service cannot be started again.
func (s *Service) Stop() {
	s.endWaits()
	s.state.mu.Lock()
	defer s.state.mu.Unlock()
	s.state.stopped = true
	s.shed.Stop()
	s.pub.Stop()
	s.results.Stop()
	s.rd.Stop()
	if s.state.sub != nil {
		if err := s.state.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			s.deps.Log.Warn("unsubscribe results", slog.Any("err", err))
		}
		s.state.sub = nil
	}
}

// Handler is the HTTP API: every route of api/openapi.yaml, /healthz, /readyz
// and /metrics, with JSON errors, panic recovery and request metrics.
func (s *Service) Handler() http.Handler { return s.handler }
