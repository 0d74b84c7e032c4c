package shed

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// Defaults of what shedding keeps.
const (
	DefaultResults       = 100_000
	DefaultActivityCache = 100_000
)

// Config is shedding's part of ingest's configuration.
type Config struct {
	// ActivityCache bounds the activities whose view and last change are
	// kept (ALLOT_INGEST_ACTIVITY_CACHE).
	ActivityCache int
	// Wait bounds how long a claim waits for the tail to pass it
	// (DefaultWait in production).
	Wait time.Duration
	// TailReplay is how many of the stream's latest messages the tail
	// reads at start (DefaultTailReplay in production).
	TailReplay uint64
	// Results bounds the shed answers kept for polls (DefaultResults
	// in production).
	Results int
}

// Metrics are shedding's series; ingest registers them.
type Metrics struct {
	Claims   *prometheus.CounterVec // outcome
	Missed   *prometheus.CounterVec // reason
	TailWait prometheus.Histogram
}

// Answerer gives the shed answers of one ingest: Candidate before a
// claim is published, Answer after its PubAck, Recorded for a poll that
// comes before the allocator has recorded the answer.
type Answerer struct {
	log   *slog.Logger
	wait  time.Duration
	views views
	tail  *tail
	// answered holds the shed answers given by this instance, for polls
	// that come before the allocator has recorded them.
	answered *lru.Cache[string, wire.Result]
	replay   uint64
	m        Metrics
	stopView func()
}

// New returns an Answerer; it does no I/O (Start does).
func New(cfg Config, log *slog.Logger, m Metrics) (*Answerer, error) {
	a := &Answerer{log: log, wait: cfg.Wait, tail: newTail(cfg.ActivityCache), replay: cfg.TailReplay, m: m}
	var err error
	if a.views.m, err = lru.New[int64, viewEntry](cfg.ActivityCache); err != nil {
		return nil, err
	}
	if a.views.next, err = lru.New[int64, chan struct{}](cfg.ActivityCache); err != nil {
		return nil, err
	}
	if a.answered, err = lru.New[string, wire.Result](cfg.Results); err != nil {
		return nil, err
	}
	return a, nil
}

// Start watches the view bucket and follows the request stream. On error
// nothing is left running.
func (a *Answerer) Start(ctx context.Context, js jetstream.JetStream) error {
	vkv, err := bus.CheckBucket(ctx, js, bus.ViewBucketConfig(1))
	if err != nil {
		return err
	}
	stop, err := a.watchViews(vkv)
	if err != nil {
		return fmt.Errorf("%w: watch %s: %w", bus.ErrUnavailable, wire.ViewBucket, err)
	}
	if err := a.tail.start(ctx, js, a.replay, a.log); err != nil {
		stop()
		return err
	}
	a.stopView = stop
	return nil
}

// Stop ends the view watcher and the tail.
func (a *Answerer) Stop() {
	if a.stopView != nil {
		a.stopView()
		a.tail.stop()
		a.stopView = nil
	}
}

// Candidate is the view of activity a claim may be answered from, or nil.
func (a *Answerer) Candidate(activity int64) *View { return a.views.get(activity) }

// PutView installs a view that came with a result batch.
func (a *Answerer) PutView(v wire.View) { a.views.put(v) }

// Recorded is the shed answer given here to id, if any.
func (a *Answerer) Recorded(id string) (wire.Result, bool) { return a.answered.Get(id) }
