// Package notifier is allot's reference consumer of events: a durable pull
// consumer on ALLOT_EVENTS (by default alloc.evt.*.promoted) that POSTs each
// event to a webhook with Idempotency-Key = event_id, or logs it when no
// webhook is configured. It never touches the database.
//
// Delivery is at least once. A message is acknowledged only after the
// webhook answered 2xx (or, when every attempt failed, after the event is
// stored on the dead-letter stream), so a crash at any point makes JetStream
// redeliver it; a receiver that dedupes by event_id sees each event exactly
// once.
//
// Workers (Config.Workers) each pull one message at a time, so nothing sits
// in a client-side buffer while its ack timer runs, and deliver concurrently:
// events are not delivered in stream order unless Workers is 1. While an
// event is retried its worker keeps telling JetStream it is in progress, so
// it is not redelivered to another worker meanwhile.
package notifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/lifecycle"
	"github.com/allot-dev/allot/internal/wire"
)

// Deps is what a Notifier runs with besides its Config.
type Deps struct {
	// NC is the connection the consumer pulls on and dead letters are
	// published on.
	NC *nats.Conn
	// Log gets the notifier's lines.
	Log *slog.Logger
	// Registry gets the notifier's metrics (one Notifier per registry); nil
	// means a private registry.
	Registry prometheus.Registerer
	// Metrics, when set, is where Run serves /metrics (from Gatherer) and
	// /healthz until the notifier has stopped.
	Metrics  net.Listener
	Gatherer prometheus.Gatherer
	// Test holds the seams of the tests; the zero value is production.
	Test TestHooks
}

// TestHooks shorten the consumer's timings for tests. Zero values are the
// production ones.
type TestHooks struct {
	// AckWait is the consumer's redelivery timeout (30s). Workers extend it
	// every AckWait/3 while they hold a message, so it only matters when a
	// process dies: it is how soon another one gets the message.
	AckWait time.Duration
	// PollWait is how long an idle worker's pull request waits (1s); it
	// bounds how long Stop waits for idle workers.
	PollWait time.Duration
}

func (h TestHooks) ackWait() time.Duration {
	if h.AckWait > 0 {
		return h.AckWait
	}
	return defaultAckWait
}

func (h TestHooks) pollWait() time.Duration {
	if h.PollWait > 0 {
		return h.PollWait
	}
	return defaultPollWait
}

// Errors a Notifier returns.
var (
	// ErrStarted means Start was called twice.
	ErrStarted = errors.New("notifier already started")
)

// Notifier delivers the events its durable consumer selects.
type Notifier struct {
	cfg    Config
	hooks  TestHooks
	js     jetstream.JetStream
	log    *slog.Logger
	m      *metrics
	client *http.Client

	cons jetstream.Consumer

	// inFlight holds the stream sequences being delivered here, so that a
	// redelivery of a message this process still works on (its ack timer ran
	// out while NATS was unreachable) is not POSTed a second time in parallel.
	inFlight seqSet

	cancel context.CancelFunc
	wg     sync.WaitGroup
	// stopped is why the notifier stopped by itself, set once.
	stopped stopReason
}

// seqSet is a set of stream sequences under its own lock.
type seqSet struct {
	mu   sync.Mutex
	seqs map[uint64]struct{}
}

// stopReason is the first error that stopped a notifier.
type stopReason struct {
	mu  sync.Mutex
	err error
}

// New returns a notifier on deps.NC with cfg, which Config.Validate has
// accepted; Start runs it (or Run does it all). Its metrics are registered
// on deps.Registry, or on a private registry when that is nil.
func New(cfg Config, deps Deps) (*Notifier, error) {
	js, err := jetstream.New(deps.NC)
	if err != nil {
		return nil, fmt.Errorf("notifier: %w", err)
	}
	reg := deps.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = cfg.Workers
	return &Notifier{
		cfg: cfg, hooks: deps.Test, js: js, m: newMetrics(reg),
		log: deps.Log.With(slog.String("durable", cfg.Durable)),
		client: &http.Client{
			Transport: transport,
			// A POST must reach the configured URL itself: following a
			// 301/302/303 would turn it into a GET and lose the body.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		inFlight: seqSet{seqs: make(map[uint64]struct{})},
	}, nil
}

// Start checks ALLOT_EVENTS and the dead-letter stream (`allotctl setup`
// creates them), ensures the durable consumer, then runs the workers until
// Stop. ctx bounds the setup only.
func (n *Notifier) Start(ctx context.Context) error {
	if n.cancel != nil {
		return ErrStarted
	}
	if err := n.setup(ctx); err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	n.cancel = stop
	n.wg.Go(func() {
		if err := lifecycle.Run(runCtx, n.workers("")...); err != nil {
			n.setErr(err)
		}
	})
	return nil
}

// setup checks the streams and ensures the consumer.
func (n *Notifier) setup(ctx context.Context) error {
	setupCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Only `allotctl setup` creates or changes streams: the notifier
	// checks the two it uses.
	if err := bus.CheckEventStream(setupCtx, n.js); err != nil {
		return err
	}
	if err := bus.CheckDLQStream(setupCtx, n.js); err != nil {
		return err
	}
	cons, err := n.ensureConsumer(setupCtx)
	if err != nil {
		return err
	}
	n.cons = cons
	n.log.InfoContext(ctx, "notifier running", slog.String("filter", n.cfg.Filter),
		slog.Bool("webhook", n.cfg.URL != ""), slog.Int("workers", n.cfg.Workers))
	return nil
}

// workers are the notifier's workers as lifecycle parts named name: the
// first to fail stops the others, and its error is the one returned.
func (n *Notifier) workers(name string) []lifecycle.Part {
	parts := make([]lifecycle.Part, n.cfg.Workers)
	for i := range parts {
		parts[i] = lifecycle.Part{Name: name, Run: n.work}
	}
	return parts
}

// Stop stops pulling, lets webhook attempts in flight finish (each is bounded
// by Timeout) and acknowledges those that succeeded; events waiting for a
// retry are handed back to JetStream (Nak) for the next process. It returns
// once every worker has exited.
func (n *Notifier) Stop() {
	if n.cancel != nil {
		n.cancel()
	}
	n.wg.Wait()
}

// Wait blocks until the notifier stops by itself or is stopped, and says why
// it stopped by itself (nil after Stop).
func (n *Notifier) Wait() error {
	n.wg.Wait()
	n.stopped.mu.Lock()
	defer n.stopped.mu.Unlock()
	return n.stopped.err
}

func (n *Notifier) setErr(err error) {
	n.stopped.mu.Lock()
	if n.stopped.err == nil {
		n.stopped.err = err
	}
	n.stopped.mu.Unlock()
	n.cancel()
}

func (n *Notifier) ensureConsumer(ctx context.Context) (jetstream.Consumer, error) {
	// One filter stays FilterSubject, as consumers made before several
	// were possible have it.
	filter, filters := n.cfg.Filter, Filters(n.cfg.Filter)
	if len(filters) > 1 {
		filter = ""
	} else {
		filters = nil
	}
	c, err := n.js.CreateOrUpdateConsumer(ctx, wire.EventStream, jetstream.ConsumerConfig{
		Durable:        n.cfg.Durable,
		Description:    "allot notifier: delivers events to a webhook",
		FilterSubject:  filter,
		FilterSubjects: filters,
		// A new durable starts at the beginning of the stream: a notifier
		// deployed after the first events still delivers them.
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       n.hooks.ackWait(),
		// Attempts are counted by the notifier, which dead-letters; the
		// broker must never drop a message on its own.
		MaxDeliver:    -1,
		MaxAckPending: n.cfg.MaxAckPending(),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: ensure consumer %s: %w", bus.ErrUnavailable, n.cfg.Durable, err)
	}
	return c, nil
}

// Filters splits a Config.Filter into its subjects.
func Filters(filter string) []string {
	var out []string
	for f := range strings.SplitSeq(filter, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// work pulls one message at a time and delivers it, until ctx ends or the
// connection is closed for good.
func (n *Notifier) work(ctx context.Context) error {
	for ctx.Err() == nil {
		msg, err := n.cons.Next(jetstream.FetchMaxWait(n.hooks.pollWait()))
		switch {
		case err == nil:
		case errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrNoMessages):
			continue
		case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, jetstream.ErrConnectionClosed):
			return fmt.Errorf("notifier: %w", err)
		default:
			n.log.WarnContext(ctx, "pull events", slog.Any("err", err))
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) {
				if _, err := n.ensureConsumer(ctx); err != nil {
					n.log.WarnContext(ctx, "recreate consumer", slog.Any("err", err))
				}
			}
			sleep(ctx, n.hooks.pollWait())
			continue
		}
		if ctx.Err() != nil {
			// Pulled while stopping: hand it straight back.
			msg.Nak() //nolint:errcheck // redelivered after AckWait anyway
			return nil
		}
		n.handle(ctx, msg)
	}
	return nil
}

// sleep waits d or until ctx ends, and reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
