package allocator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/internal/store"
)

// RunConfig is what Run needs beyond its dependencies.
type RunConfig struct {
	Config
	// MetricsAddr, when set, serves /metrics, /healthz and /readyz there.
	MetricsAddr string
}

// Run migrates the schema, applies requests until ctx ends, then finishes
// the batch in hand and returns. It is what cmd/allocator runs, and what
// `make run` runs in-process.
func Run(ctx context.Context, cfg RunConfig, db *sql.DB, nc *nats.Conn, log *slog.Logger) error {
	if err := store.Migrate(ctx, db); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a, err := New(db, nc, log, reg, cfg.Config, Hooks{})
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		return err
	}
	log.InfoContext(ctx, "allocator running", slog.Int("batch_size", a.cfg.BatchSize),
		slog.Duration("batch_wait", a.cfg.BatchWait))
	var srv *http.Server
	if cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(`{"status":"ok"}`)) })
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
			if !nc.IsConnected() || db.PingContext(r.Context()) != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(`{"error":"nats or mysql is unreachable."}`))
				return
			}
			w.Write([]byte(`{"status":"ready"}`))
		})
		ln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			a.Stop()
			return fmt.Errorf("listen %s: %w", cfg.MetricsAddr, err)
		}
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln) //nolint:errcheck // closed on shutdown
	}
	done := make(chan error, 1)
	go func() { done <- a.Wait() }()
	select {
	case <-ctx.Done():
		log.Info("allocator stopping: finishing the batch in hand")
		a.Stop()
		err = nil
	case err = <-done:
	}
	if srv != nil {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdownCtx) //nolint:errcheck
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
