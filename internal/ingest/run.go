package ingest

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/lifecycle"
)

// DefaultShutdownTimeout bounds a graceful shutdown: in-flight publishes
// (at most Options.PublishTimeout) finish, waits are cut short.
const DefaultShutdownTimeout = 15 * time.Second

// RunConfig is what Run needs besides its dependencies.
type RunConfig struct {
	// HTTPAddr is the listen address, e.g. ":8080". Ignored when Listener
	// is set.
	HTTPAddr string
	// Listener, when set, is served instead of listening on HTTPAddr (tests
	// and launchers that pick a free port). Run closes it.
	Listener net.Listener
	// Options configure the Service.
	Options Options
	// Registry receives ingest's metrics and is served on /metrics. When nil
	// Run creates one with the Go and process collectors. A launcher running
	// several parts in one process passes its shared registry.
	Registry *prometheus.Registry
	// ShutdownTimeout bounds the graceful shutdown; default
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// MetricsAddr, when set, serves /metrics also on a listener of its own,
	// without a token (ALLOT_INGEST_METRICS_ADDR). Ignored when
	// MetricsListener is set.
	MetricsAddr string
	// MetricsListener, when set, is that listener instead of one on
	// MetricsAddr (tests, which must not close a free port and hope to get
	// it back). Run closes it.
	MetricsListener net.Listener
	// Auth configures bearer tokens. With neither a key nor a JWKS URL,
	// Run serves without authentication only when AuthOff is set or the
	// listener is on a loopback address, and says so; else it refuses.
	Auth    auth.Config
	AuthOff bool
}

// Run serves the ingest API on cfg.HTTPAddr until ctx ends, then shuts down
// gracefully: waits in progress answer at once, the server stops accepting
// and finishes in-flight requests, and the Service stops. db and nc belong
// to the caller, which closes (drains) them after Run returns. Run returns
// nil after a clean shutdown, or the error that stopped it.
func Run(ctx context.Context, cfg RunConfig, db *sql.DB, nc *nats.Conn, log *slog.Logger) error {
	// The listeners given to Run and those it opens are Run's to close:
	// here, when it returns before the servers take them over.
	var unserved []net.Listener
	for _, l := range []net.Listener{cfg.Listener, cfg.MetricsListener} {
		if l != nil {
			unserved = append(unserved, l)
		}
	}
	defer func() {
		for _, l := range unserved {
			l.Close()
		}
	}()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("ingest: jetstream: %w", err)
	}
	opts := cfg.Options
	opts.Gatherer = reg
	ln := cfg.Listener
	addr := cfg.HTTPAddr
	if ln != nil {
		addr = ln.Addr().String()
	}
	switch {
	case opts.Auth != nil: // a verifier of the caller's (tests, launchers)
	case len(cfg.Auth.HS256Key) > 0 || cfg.Auth.JWKSURL != "":
		ac := cfg.Auth
		ac.Log = log
		v, err := auth.New(ac)
		if err != nil {
			return fmt.Errorf("ingest: %w", err)
		}
		defer v.Close()
		opts.Auth = v
		log.InfoContext(ctx, "authentication on: bearer tokens required",
			slog.Bool("hs256", len(cfg.Auth.HS256Key) > 0), slog.String("jwks_url", cfg.Auth.JWKSURL),
			slog.String("issuer", cfg.Auth.Issuer), slog.String("audience", cfg.Auth.Audience))
	case cfg.AuthOff:
		log.WarnContext(ctx, "authentication off (ALLOT_AUTH=none): anyone who reaches ingest may act for any user")
	case loopback(addr):
		log.WarnContext(ctx, "authentication off: no key is set and ingest listens on a loopback address only; set ALLOT_AUTH_HS256_KEY (at least 32 bytes) or ALLOT_AUTH_JWKS_URL to require bearer tokens",
			slog.String("addr", addr))
	default:
		return fmt.Errorf("ingest: %w", errOpenNotLoopback(addr))
	}
	svc, err := New(db, nc, js, log, reg, opts)
	if err != nil {
		return err
	}
	if ln == nil {
		ln, err = net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("ingest: listen on %s: %w", cfg.HTTPAddr, err)
		}
		unserved = append(unserved, ln)
	}
	timeout := cfg.ShutdownTimeout
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	var metrics *lifecycle.Part
	if mln := cfg.MetricsListener; mln != nil || cfg.MetricsAddr != "" {
		if mln == nil {
			var err error
			if mln, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
				return fmt.Errorf("ingest: listen on %s (ALLOT_INGEST_METRICS_ADDR): %w", cfg.MetricsAddr, err)
			}
			unserved = append(unserved, mln)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		p := lifecycle.HTTPServer("ingest metrics", msrv, mln, 5*time.Second, nil)
		metrics = &p
		log.InfoContext(ctx, "ingest metrics listening", slog.String("addr", mln.Addr().String()))
	}
	// Serve at once, not ready, while JetStream is waited for: a cluster
	// that has just formed may take a while to create R3 streams, and that
	// is a reason to retry, not to exit.
	gate := new(startGate)
	srv := newHTTPServer(gate, svc.opts, log)
	log.InfoContext(ctx, "ingest listening, starting", slog.String("addr", ln.Addr().String()))

	// The parts run on one rule: the first to fail stops the others, and
	// its error is the one returned. The shutdown keeps its order: waits
	// end, the API server shuts down, the Service stops, and only then the
	// metrics listener, which serves until the end.
	served := make(chan struct{})  // the API server has stopped
	stopped := make(chan struct{}) // and then the Service
	api := lifecycle.HTTPServer("ingest", srv, ln, timeout, func() {
		log.InfoContext(ctx, "ingest shutting down", slog.Duration("timeout", timeout))
		// Cut waits first: a handler waiting 30s for a result would
		// otherwise hold the shutdown; it answers "pending" now, which is
		// true.
		svc.endWaits()
	})
	serve := api.Run
	api.Run = func(ctx context.Context) error {
		defer close(served)
		return serve(ctx)
	}
	// No name: Start's errors say "ingest start" already.
	service := lifecycle.Part{Run: func(ctx context.Context) error {
		defer close(stopped)
		if err := bus.Retry(ctx, log, "ingest start", bus.StartAttempt, svc.Start); err != nil {
			if ctx.Err() != nil {
				return nil // asked to stop while waiting
			}
			return err
		}
		gate.open(svc.Handler())
		log.InfoContext(ctx, "ingest ready", slog.String("addr", ln.Addr().String()))
		<-ctx.Done()
		<-served
		svc.Stop()
		return nil
	}}
	parts := []lifecycle.Part{api, service}
	unserved = nil // the servers close them from here on
	if metrics != nil {
		parts = append(parts, lifecycle.StopAfter(stopped, *metrics))
	}
	if err := lifecycle.Run(ctx, parts...); err != nil {
		return err
	}
	log.InfoContext(ctx, "ingest stopped")
	return nil
}

// newHTTPServer wraps h in an http.Server with timeouts fit for the API:
// headers must arrive quickly, bodies are small, and a response may take up
// to MaxWait plus a publish and a read, so WriteTimeout exceeds their sum.
// opts has its defaults applied.
func newHTTPServer(h http.Handler, opts Options, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      opts.MaxWait + opts.PublishTimeout + opts.QueryTimeout + 10*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    32 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
