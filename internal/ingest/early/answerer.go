package early

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

// Defaults of what the early answers keep.
const (
	DefaultEarlyResults  = 100_000
	DefaultActivityCache = 100_000
)

// Config is the early answers' part of ingest's configuration.
type Config struct {
	// ActivityCache bounds the activities whose view and last change are
	// kept (ALLOT_INGEST_ACTIVITY_CACHE).
	ActivityCache int
	// Wait bounds how long a claim waits for the tail to pass it
	// (DefaultEarlyWait in production).
	Wait time.Duration
	// TailReplay is how many of the stream's latest messages the tail
	// reads at start (DefaultTailReplay in production).
	TailReplay uint64
	// Results bounds the early answers kept for polls (DefaultEarlyResults
	// in production).
	Results int
}

// Metrics are the early answers' series; ingest registers them.
type Metrics struct {
	Shed     *prometheus.CounterVec // outcome
	Missed   *prometheus.CounterVec // reason
	TailWait prometheus.Histogram
}

// Answerer gives the early answers of one ingest: Candidate before a
// claim is published, Answer after its PubAck, Recorded for a poll that
// comes before the allocator has recorded the answer.
type Answerer struct {
	log   *slog.Logger
	wait  time.Duration
	views views
	tail  *tail
	// answered holds the early answers given by this instance, for polls
	// that come before the allocator has recorded them.
	answered *lru.Cache[string, wire.Result]
	replay   uint64
	m        Metrics
	stopView func()
}

// New returns an Answerer; it does no I/O (Start does).
func New(cfg Config, log *slog.Logger, m Metrics) (*Answerer, error) {
	e := &Answerer{log: log, wait: cfg.Wait, tail: newTail(cfg.ActivityCache), replay: cfg.TailReplay, m: m}
	var err error
	if e.views.m, err = lru.New[int64, viewEntry](cfg.ActivityCache); err != nil {
		return nil, err
	}
	if e.answered, err = lru.New[string, wire.Result](cfg.Results); err != nil {
		return nil, err
	}
	return e, nil
}

// Start watches the view bucket and follows the request stream. On error
// nothing is left running.
func (e *Answerer) Start(ctx context.Context, js jetstream.JetStream) error {
	vkv, err := bus.CheckBucket(ctx, js, bus.ViewBucketConfig(1))
	if err != nil {
		return err
	}
	stop, err := e.watchViews(vkv)
	if err != nil {
		return fmt.Errorf("%w: watch %s: %w", bus.ErrUnavailable, wire.ViewBucket, err)
	}
	if err := e.tail.start(ctx, js, e.replay, e.log); err != nil {
		stop()
		return err
	}
	e.stopView = stop
	return nil
}

// Stop ends the view watcher and the tail.
func (e *Answerer) Stop() {
	if e.stopView != nil {
		e.stopView()
		e.tail.stop()
		e.stopView = nil
	}
}

// Candidate is the view of activity a claim may be answered from, or nil.
func (e *Answerer) Candidate(activity int64) *View { return e.views.get(activity) }

// PutView installs a view that came with a result batch.
func (e *Answerer) PutView(v wire.View) { e.views.put(v) }

// Recorded is the early answer given here to id, if any.
func (e *Answerer) Recorded(id string) (wire.Result, bool) { return e.answered.Get(id) }
