package allocator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/lifecycle"
	"github.com/allot-dev/allot/internal/store"
)

// RunConfig is what Run needs beyond its dependencies.
type RunConfig struct {
	// Config is the template of every partition's allocator; its Partition
	// is ignored.
	Config
	// MetricsAddr, when set, serves /metrics, /healthz and /readyz there.
	MetricsAddr string
}

// Run migrates the schema and runs an allocator for every partition until
// ctx ends, then lets each finish the batch in hand and returns. Every
// allocator process competes for every partition; the server pins each
// partition to one of them and hands it to a survivor when that one stops.
// It is what cmd/allocator runs, and what `make run` runs in-process.
func Run(ctx context.Context, cfg RunConfig, db *sql.DB, nc *nats.Conn, log *slog.Logger) error {
	if err := store.Migrate(ctx, db); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
	var all []*Allocator
	// Partitions spread over the live allocator processes; without the
	// membership bucket every process pulls on every partition, which is
	// safe, only less even.
	var members *Members
	if js, err := jetstream.New(nc); err == nil {
		members, err = JoinMembers(ctx, js, log, cfg.Replicas, time.Second, 5*time.Second)
		if err != nil {
			log.WarnContext(ctx, "allocator membership unavailable; pulling on every partition", slog.Any("err", err))
			members = nil
		}
	}
	if members != nil {
		cfg.Prefers = members.Prefers
	}
	stopAll := func() {
		for _, a := range all {
			a.Stop()
		}
		if members != nil {
			members.Leave()
			members = nil
		}
	}
	for p := range max(cfg.Partitions, 1) {
		c := cfg.Config
		c.Partition = p
		a, err := New(db, nc, log, reg, c, Hooks{})
		if err != nil {
			stopAll()
			return err
		}
		if err := a.Start(ctx); err != nil {
			stopAll()
			return err
		}
		all = append(all, a)
	}
	log.InfoContext(ctx, "allocator running", slog.Int("partitions", len(all)),
		slog.Int("batch_size", all[0].cfg.BatchSize), slog.Duration("batch_wait", all[0].cfg.BatchWait))
	stopOnce := sync.OnceFunc(stopAll)
	// The partitions run until ctx ends or the first of them fails; the
	// metrics server runs alongside (the first error wins, see lifecycle).
	parts := []lifecycle.Part{{Name: "allocator", Run: func(ctx context.Context) error {
		done := make(chan error, len(all))
		for _, a := range all {
			go func() { done <- a.Wait() }()
		}
		select {
		case <-ctx.Done():
			log.Info("allocator stopping: finishing the batches in hand")
			return nil
		case err := <-done:
			return err
		}
	}}}
	if cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			w.Write([]byte(`{"status":"ok"}`)) //nolint:errcheck // the client is gone; nothing to do
		})
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
			if !nc.IsConnected() || db.PingContext(r.Context()) != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(`{"error":"nats or mysql is unreachable."}`)) //nolint:errcheck // the client is gone; nothing to do
				return
			}
			w.Write([]byte(`{"status":"ready"}`)) //nolint:errcheck // the client is gone; nothing to do
		})
		ln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			stopAll()
			return fmt.Errorf("listen %s: %w", cfg.MetricsAddr, err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		// The partitions stop first, so /readyz and /metrics see them drain.
		parts = append(parts, lifecycle.HTTPServer("metrics", srv, ln, 5*time.Second, stopOnce))
	}
	err := lifecycle.Run(ctx, parts...)
	stopOnce()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
