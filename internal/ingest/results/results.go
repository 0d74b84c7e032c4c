package results

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/ingest/reads"
	"github.com/allot-dev/allot/internal/wire"
)

// Config is the results' part of ingest's configuration.
type Config struct {
	// MaxWaiters bounds the handlers waiting for a result
	// (ALLOT_INGEST_MAX_WAITERS).
	MaxWaiters int
	// QueryTimeout bounds one MySQL read.
	QueryTimeout time.Duration
	// Recheck is how often a waiting handler reads MySQL again in case a
	// notification was dropped (core NATS is at most once).
	Recheck time.Duration
}

// Metrics are the results' series; ingest registers them.
type Metrics struct {
	Waiters prometheus.Gauge
	Queries prometheus.Counter
	Refused prometheus.Counter // waits refused beyond MaxWaiters
}

// Locate names the shards that may hold a request id's result: the one
// of the partition the id names, or every shard when the id does not name
// one (minted before ids named their partition, or by another tool).
type Locate func(id string) ([]*reads.Shard, error)

// Results is where ingest's handlers wait for and read results.
type Results struct {
	log      *slog.Logger
	waiters  *waiters
	rd       *reads.Reads
	locate   Locate
	readers  map[string]*resultReader // by shard name
	max      int64
	recheck  time.Duration
	onView   func(wire.View) // nil: the batches' views are not wanted
	refused  prometheus.Counter
	quit     chan struct{} // closed by EndWaits: waiting handlers answer now
	quitOnce sync.Once
	stop     context.CancelFunc
}

// New returns Results reading the shards of rd, a request's result on
// those locate names. onView, when set, receives the views that come with
// result batches (shedding). It does no I/O.
func New(cfg Config, rd *reads.Reads, locate Locate, log *slog.Logger, m Metrics, onView func(wire.View)) *Results {
	rs := &Results{log: log, waiters: newWaiters(m.Waiters), rd: rd, locate: locate, readers: map[string]*resultReader{},
		max: int64(cfg.MaxWaiters), recheck: cfg.Recheck, onView: onView, refused: m.Refused, quit: make(chan struct{})}
	for _, sh := range rd.Shards() {
		rs.readers[sh.Name] = newResultReader(sh.DB, cfg.QueryTimeout, m.Queries.Inc)
	}
	return rs
}

// Start runs the coalesced reads until Stop.
func (rs *Results) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	rs.stop = cancel
	for _, r := range rs.readers {
		r.run(ctx)
	}
}

// Stop ends the waits and the coalesced reads.
func (rs *Results) Stop() {
	rs.EndWaits()
	if rs.stop != nil {
		rs.stop()
	}
}

// EndWaits makes every waiting handler answer now with what it knows.
func (rs *Results) EndWaits() { rs.quitOnce.Do(func() { close(rs.quit) }) }

// Done is closed once waits end.
func (rs *Results) Done() <-chan struct{} { return rs.quit }

// Admit returns wait, or 0 when MaxWaiters handlers wait already: the
// request is then served as if it had no ?wait=.
func (rs *Results) Admit(wait time.Duration) time.Duration {
	if wait > 0 && rs.waiters.count() >= rs.max {
		rs.refused.Inc()
		return 0
	}
	return wait
}

// Register registers a waiter for id before the request could have been
// applied; the caller must Unregister it.
func (rs *Results) Register(id string) *Waiter { return rs.waiters.add(id) }

// Unregister removes w.
func (rs *Results) Unregister(id string, w *Waiter) { rs.waiters.remove(id, w) }

// Count is the number of waiting handlers.
func (rs *Results) Count() int64 { return rs.waiters.count() }

// Get reads id's result, joining the next coalesced read of each shard
// that may hold it (one for an id that names its partition). A shard that
// fails is a *reads.ShardError naming it, unless another shard holds the
// result.
func (rs *Results) Get(ctx context.Context, id string) (wire.Result, bool, error) {
	where, err := rs.locate(id)
	if err != nil {
		return wire.Result{}, false, rs.rd.Unrouted(err)
	}
	if len(where) == 1 {
		sh := where[0]
		r, ok, err := rs.readers[sh.Name].get(ctx, id)
		if err != nil {
			return r, ok, rs.rd.Fail(ctx, sh, err)
		}
		return r, ok, nil
	}
	// Every shard at once: one that hangs costs its timeout, not the sum.
	type answer struct {
		r   wire.Result
		ok  bool
		err error
	}
	answers := make([]answer, len(where))
	var wg sync.WaitGroup
	for i, sh := range where {
		wg.Go(func() {
			a := &answers[i]
			a.r, a.ok, a.err = rs.readers[sh.Name].get(ctx, id)
		})
	}
	wg.Wait()
	var first error
	for i, a := range answers {
		if a.err == nil && a.ok {
			return a.r, true, nil
		}
		if a.err != nil && first == nil {
			first = rs.rd.Fail(ctx, where[i], a.err)
		}
	}
	return wire.Result{}, false, first
}
