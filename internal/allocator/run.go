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

	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/lifecycle"
	"github.com/allot-dev/allot/internal/store/schema"
)

// RunConfig is what Run needs beyond its dependencies.
type RunConfig struct {
	// Config is the template of every partition's allocator; its Partition
	// is ignored.
	Config
	// MetricsAddr, when set, serves /metrics, /healthz and /readyz there.
	MetricsAddr string
	// hooks are every allocator's (tests only).
	hooks Hooks
	// listen opens the metrics listener; net.Listen when nil (tests only).
	listen func(network, address string) (net.Listener, error)
}

// Run migrates the schema and runs an allocator for every partition until
// ctx ends, then lets each finish the batch in hand and returns. Every
// allocator process competes for every partition; the server pins each
// partition to one of them and hands it to a survivor when that one stops.
// It is what cmd/allocator runs, and what `make run` runs in-process.
//
// The partitions and the metrics server run on one rule: the first to fail
// stops the others, and its error is the one returned (nil after a clean
// shutdown). The metrics server stops last, once the partitions have.
func Run(ctx context.Context, cfg RunConfig, db *sql.DB, nc *nats.Conn, log *slog.Logger) error {
	if err := schema.Migrate(ctx, db); err != nil {
		return err
	}
	if stall := cfg.withDefaults().StallTimeout; stall > 0 {
		// The pool drops an idle connection before the server ends it
		// (Env.SessionDSN's wait_timeout), rather than find it dead.
		db.SetConnMaxIdleTime(stall / 2)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
	// Serve /readyz (503) and /metrics at once, and wait for JetStream
	// rather than exit: a cluster that has just formed may take a while to
	// create R3 streams.
	var ready atomic.Bool
	stalls := &stallSet{}
	metrics, err := serveMetrics(cfg.MetricsAddr, cfg.listen, reg, db, nc, &ready, stalls)
	if err != nil {
		return err
	}
	ran := make(chan struct{}) // the partitions have stopped
	// No name: the allocator's errors are returned as they always were.
	parts := []lifecycle.Part{{Run: func(ctx context.Context) error {
		defer close(ran)
		return runPartitions(ctx, cfg, db, nc, log, reg, &ready, stalls)
	}}}
	if metrics != nil {
		parts = append(parts, lifecycle.StopAfter(ran, *metrics))
	}
	return lifecycle.Run(ctx, parts...)
}

// runPartitions waits for the streams, joins the membership, and runs an
// allocator for every partition until ctx ends or one of them fails; then
// stops them all at once. It returns nil when ctx ended.
func runPartitions(ctx context.Context, cfg RunConfig, db *sql.DB, nc *nats.Conn, log *slog.Logger, reg *prometheus.Registry, ready *atomic.Bool, stalls *stallSet) error {
	if js, err := jetstream.New(nc); err == nil {
		err := bus.Retry(ctx, log, "allocator: check streams", bus.StartAttempt, func(ctx context.Context) error {
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
	// Partitions spread over the live allocator processes; without the
	// membership bucket every process pulls on every partition, which is
	// safe, only less even.
	var members *Members
	if js, err := jetstream.New(nc); err == nil {
		members, err = JoinMembers(ctx, js, log, time.Second, bus.MembersTTL)
		if bus.IsSetupError(err) {
			return err
		}
		if err != nil {
			log.WarnContext(ctx, "allocator membership unavailable; pulling on every partition", slog.Any("err", err))
			members = nil
		}
	}
	if members != nil {
		cfg.Prefers = members.Prefers
	}
	// A partition given up for want of commits goes to a peer: the
	// membership tells them, /readyz tells the operator.
	joined := members
	cfg.OnStall = func(p int, stalled bool) {
		stalls.set(p, stalled)
		if joined != nil {
			joined.GiveUp(p, stalled)
		}
	}
	var all []*Allocator
	stopAll := func() {
		stops := make([]func(), len(all))
		for i, a := range all {
			stops[i] = a.Stop
		}
		stopParallel(stops)
		if members != nil {
			members.Leave()
			members = nil
		}
	}
	for p := range max(cfg.Partitions, 1) {
		c := cfg.Config
		c.Partition = p
		a, err := New(db, nc, log, reg, c, cfg.hooks)
		if err != nil {
			stopAll()
			return err
		}
		if err := bus.Retry(ctx, log, "allocator start", bus.StartAttempt, a.Start); err != nil {
			stopAll()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		all = append(all, a)
	}
	log.InfoContext(ctx, "allocator running", slog.Int("partitions", len(all)),
		slog.Int("batch_size", all[0].cfg.BatchSize), slog.Duration("batch_wait", all[0].cfg.BatchWait))
	ready.Store(true)
	done := make(chan error, len(all))
	for _, a := range all {
		go func() { done <- a.Wait() }()
	}
	var err error
	select {
	case <-ctx.Done():
		log.Info("allocator stopping: finishing the batches in hand")
	case err = <-done:
	}
	stopAll()
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

// serveMetrics listens on addr and returns the part that serves /metrics,
// /healthz and /readyz there (nothing when addr is empty). /readyz answers
// 503 until ready is set, while NATS or MySQL is unreachable, and while a
// partition is given up because it could not commit (stalls).
func serveMetrics(addr string, listen func(network, address string) (net.Listener, error), reg *prometheus.Registry, db *sql.DB, nc *nats.Conn, ready *atomic.Bool, stalls *stallSet) (*lifecycle.Part, error) {
	if addr == "" {
		return nil, nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"status":"ok"}`)) //nolint:errcheck // the client is gone; nothing to do
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"the allocator is starting: waiting for NATS JetStream."}`)) //nolint:errcheck // the client is gone; nothing to do
			return
		}
		// A hung route to MySQL must not hang the probe.
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if !nc.IsConnected() || db.PingContext(ctx) != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"nats or mysql is unreachable."}`)) //nolint:errcheck // the client is gone; nothing to do
			return
		}
		if parts := stalls.list(); len(parts) > 0 {
			body, _ := json.Marshal(map[string]string{"error": fmt.Sprintf(
				"partitions given up to peers, no commit to mysql while their requests waited: %s.", joinInts(parts))})
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write(body) //nolint:errcheck // the client is gone; nothing to do
			return
		}
		w.Write([]byte(`{"status":"ready"}`)) //nolint:errcheck // the client is gone; nothing to do
	})
	if listen == nil {
		listen = net.Listen
	}
	ln, err := listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	p := lifecycle.HTTPServer("allocator metrics", newMetricsServer(mux, metricsTimeouts), ln, 5*time.Second, nil)
	return &p, nil
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
