package allocator

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/internal/allocator/members"
	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/lifecycle"
	"github.com/allot-dev/allot/internal/store"
)

// Run migrates the schema and runs an allocator for every partition until
// ctx ends, then lets each finish the batch in hand and returns. Every
// allocator process competes for every partition; the server pins each
// partition to one of them and hands it to a survivor when that one stops.
// It is what cmd/allocator runs, and what `make run` runs in-process. cfg
// is checked with Validate.
//
// Its parts run on one lifecycle: the partitions (with the membership,
// which leaves once they have stopped) and the metrics server, which stops
// last. The first to fail stops the others, and its error is the one
// returned (nil after a clean shutdown).
func Run(ctx context.Context, cfg Config, deps Deps) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("allocator: %w", err)
	}
	if err := store.Migrate(ctx, deps.DB); err != nil {
		return err
	}
	if cfg.stallWatched() {
		// The pool drops an idle connection before the server ends it
		// (Config.SessionDSN's wait_timeout), rather than find it dead.
		deps.DB.SetConnMaxIdleTime(cfg.StallTimeout / 2)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
	deps.Registerer = reg
	// Serve /readyz (503) and /metrics at once, and wait for JetStream
	// rather than exit: a cluster that has just formed may take a while to
	// create R3 streams.
	h := &health{db: deps.DB, nc: deps.NATS}
	metrics, err := serveMetrics(cfg.MetricsAddr, deps.MetricsListener, reg, h)
	if err != nil {
		return err
	}
	ran := make(chan struct{}) // the partitions have stopped
	// No name: the allocator's errors are returned as they always were.
	parts := []lifecycle.Part{{Run: func(ctx context.Context) error {
		defer close(ran)
		return runPartitions(ctx, cfg, deps, h)
	}}}
	if metrics != nil {
		parts = append(parts, lifecycle.StopAfter(ran, *metrics))
	}
	return lifecycle.Run(ctx, parts...)
}

// runPartitions waits for the streams, joins the membership, and runs the
// partitions and the membership until ctx ends or one of them fails. It
// returns nil when ctx ended.
func runPartitions(ctx context.Context, cfg Config, deps Deps, h *health) error {
	if js, err := jetstream.New(deps.NATS); err == nil {
		err := bus.Retry(ctx, deps.Log, "allocator: check streams", bus.StartAttempt, func(ctx context.Context) error {
			_, err := checkStreams(ctx, js, cfg.Partitions)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil // asked to stop while waiting
			}
			return err
		}
	}
	m, err := joinMembers(ctx, deps)
	if err != nil {
		return err
	}
	// A partition given up for want of commits goes to a peer: the
	// membership tells them, /readyz tells the operator.
	deps.OnStall = func(p int, stalled bool) {
		h.stalls.set(p, stalled)
		if m != nil {
			m.GiveUp(p, stalled)
		}
	}
	if m == nil {
		return runAll(ctx, cfg, deps, h)
	}
	deps.Prefers = m.Prefers
	ran := make(chan struct{})
	return lifecycle.Run(ctx,
		// No name: the allocator's errors are returned as they always were.
		lifecycle.Part{Run: func(ctx context.Context) error {
			defer close(ran)
			return runAll(ctx, cfg, deps, h)
		}},
		// The membership leaves once the partitions have stopped, so that
		// the others take them over at once.
		lifecycle.StopAfter(ran, lifecycle.Part{Name: "allocator membership", Run: m.Run}))
}

// joinMembers joins the membership: partitions spread over the live
// allocator processes. Without the membership bucket (nil, no error)
// every process pulls on every partition, which is safe, only less even.
func joinMembers(ctx context.Context, deps Deps) (*members.Members, error) {
	js, err := jetstream.New(deps.NATS)
	if err != nil {
		return nil, nil
	}
	m, err := members.Join(ctx, js, deps.Log, time.Second, bus.MembersTTL)
	if bus.IsSetupError(err) {
		return nil, err
	}
	if err != nil {
		deps.Log.WarnContext(ctx, "allocator membership unavailable; pulling on every partition", slog.Any("err", err))
		return nil, nil
	}
	return m, nil
}

// runAll starts an allocator for every partition, waits until ctx ends or
// one of them stops, then stops them all at once.
func runAll(ctx context.Context, cfg Config, deps Deps, h *health) error {
	var all []*Allocator
	stopAll := func() {
		stops := make([]func(), len(all))
		for i, a := range all {
			stops[i] = a.Stop
		}
		stopParallel(stops)
	}
	for p := range cfg.Partitions {
		d := deps
		d.Partition = p
		a, err := New(cfg, d)
		if err != nil {
			stopAll()
			return err
		}
		if err := bus.Retry(ctx, deps.Log, "allocator start", bus.StartAttempt, a.Start); err != nil {
			stopAll()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		all = append(all, a)
	}
	deps.Log.InfoContext(ctx, "allocator running", slog.Int("partitions", len(all)),
		slog.Int("batch_size", cfg.BatchSize), slog.Duration("batch_wait", cfg.BatchWait))
	h.ready.Store(true)
	done := make(chan error, len(all))
	var waits sync.WaitGroup
	for _, a := range all {
		waits.Go(func() { done <- a.Wait() })
	}
	var err error
	select {
	case <-ctx.Done():
		deps.Log.Info("allocator stopping: finishing the batches in hand")
	case err = <-done:
	}
	stopAll()
	waits.Wait() // each returns once its allocator has stopped
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// stopParallel runs every stop at once and returns when all have returned.
// Each allocator's Stop may take its shutdown grace (the batch in hand, the
// relay's last pass); one after another, a process with several partitions
// would need a multiple of it and be killed half way.
func stopParallel(stops []func()) {
	var wg sync.WaitGroup
	for _, stop := range stops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stop()
		}()
	}
	wg.Wait()
}

// serverTimeouts bound how long a client of the metrics server may hold a
// connection: a scraper that stalls must not keep it (and shutdown) busy.
type serverTimeouts struct {
	readHeader, read, write, idle time.Duration
}

var metricsTimeouts = serverTimeouts{readHeader: 5 * time.Second, read: 10 * time.Second, write: 30 * time.Second, idle: 60 * time.Second}

func newMetricsServer(h http.Handler, t serverTimeouts) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: t.readHeader, ReadTimeout: t.read, WriteTimeout: t.write, IdleTimeout: t.idle}
}

// health is what /readyz answers from.
type health struct {
	db    *sql.DB
	nc    *nats.Conn
	ready atomic.Bool // set once every partition has started
	// stalls holds the partitions given up because they could not commit.
	stalls stallSet
}

// serveMetrics returns the part that serves /metrics, /healthz and
// /readyz on ln, or on a listener it opens on addr (nothing when both are
// unset). /readyz answers 503 until h.ready is set, while NATS or MySQL is
// unreachable, and while a partition is given up because it could not
// commit.
func serveMetrics(addr string, ln net.Listener, reg *prometheus.Registry, h *health) (*lifecycle.Part, error) {
	if addr == "" && ln == nil {
		return nil, nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"status":"ok"}`)) //nolint:errcheck // the client is gone; nothing to do
	})
	mux.HandleFunc("GET /readyz", h.readyz)
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
	}
	p := lifecycle.HTTPServer("allocator metrics", newMetricsServer(mux, metricsTimeouts), ln, 5*time.Second, nil)
	return &p, nil
}

func (h *health) readyz(w http.ResponseWriter, r *http.Request) {
	if !h.ready.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"the allocator is starting: waiting for NATS JetStream."}`)) //nolint:errcheck // the client is gone; nothing to do
		return
	}
	// A hung route to MySQL must not hang the probe.
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if !h.nc.IsConnected() || h.db.PingContext(ctx) != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"nats or mysql is unreachable."}`)) //nolint:errcheck // the client is gone; nothing to do
		return
	}
	if parts := h.stalls.list(); len(parts) > 0 {
		body, _ := json.Marshal(map[string]string{"error": fmt.Sprintf(
			"partitions given up to peers, no commit to mysql while their requests waited: %s.", joinInts(parts))})
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write(body) //nolint:errcheck // the client is gone; nothing to do
		return
	}
	w.Write([]byte(`{"status":"ready"}`)) //nolint:errcheck // the client is gone; nothing to do
}

// joinInts is "1, 2, 3".
func joinInts(xs []int) string {
	var b []byte
	for i, x := range xs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return string(b)
}
