package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/lifecycle"
)

// Run serves the ingest API on cfg.HTTPAddr (or deps.Listener) until ctx
// ends, then shuts down gracefully: waits in progress answer at once, the
// server stops accepting and finishes in-flight requests, and the Service
// stops. deps.DB and deps.NATS belong to the caller, which closes (drains)
// them after Run returns. cfg is used as it is: validate it first. Run
// returns nil after a clean shutdown, or the error that stopped it.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	// The listeners given to Run and those it opens are Run's to close:
	// here, when it returns before the servers take them over.
	var unserved []net.Listener
	for _, l := range []net.Listener{deps.Listener, deps.MetricsListener} {
		if l != nil {
			unserved = append(unserved, l)
		}
	}
	defer func() {
		for _, l := range unserved {
			l.Close()
		}
	}()
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	log := deps.Log
	if deps.Registry == nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
		deps.Registry = reg
	}
	if deps.Gatherer == nil {
		g, ok := deps.Registry.(prometheus.Gatherer)
		if !ok {
			return errors.New("ingest: the Registry is not a Gatherer; set Deps.Gatherer for /metrics")
		}
		deps.Gatherer = g
	}
	ln := deps.Listener
	addr := cfg.HTTPAddr
	if ln != nil {
		addr = ln.Addr().String()
	}
	closeAuth, err := authenticate(ctx, cfg, &deps, addr)
	if err != nil {
		return err
	}
	defer closeAuth()
	svc, err := New(cfg, deps)
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
	var metrics *lifecycle.Part
	if mln := deps.MetricsListener; mln != nil || cfg.MetricsAddr != "" {
		if mln == nil {
			var err error
			if mln, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
				return fmt.Errorf("ingest: listen on %s (ALLOT_INGEST_METRICS_ADDR): %w", cfg.MetricsAddr, err)
			}
			unserved = append(unserved, mln)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(deps.Gatherer, promhttp.HandlerOpts{}))
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		p := lifecycle.HTTPServer("ingest metrics", msrv, mln, 5*time.Second, nil)
		metrics = &p
		log.InfoContext(ctx, "ingest metrics listening", slog.String("addr", mln.Addr().String()))
	}
	// Serve at once, not ready, while JetStream is waited for: a cluster
	// that has just formed may take a while to create R3 streams, and that
	// is a reason to retry, not to exit.
	gate := new(startGate)
	srv := newHTTPServer(gate, cfg, log)
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

// authenticate decides how Run authenticates: with the caller's verifier
// (deps.Verifier), with one built from cfg (set in deps; closeAuth closes
// it), or without, which it says, and only when asked to (ALLOT_AUTH=none)
// or on a loopback address addr; else it refuses.
func authenticate(ctx context.Context, cfg Config, deps *Deps, addr string) (closeAuth func(), err error) {
	closeAuth = func() {}
	switch {
	case deps.Verifier != nil: // a verifier of the caller's (tests, launchers)
	case cfg.HS256Key != "" || cfg.JWKSURL != "":
		ac := cfg.AuthConfig.Config()
		ac.Log = deps.Log
		v, err := auth.New(ac)
		if err != nil {
			return nil, fmt.Errorf("ingest: %w", err)
		}
		deps.Verifier = v
		closeAuth = v.Close
		deps.Log.InfoContext(ctx, "authentication on: bearer tokens required",
			slog.Bool("hs256", cfg.HS256Key != ""), slog.String("jwks_url", cfg.JWKSURL),
			slog.String("issuer", cfg.Issuer), slog.String("audience", cfg.Audience))
	case cfg.Off():
		deps.Log.WarnContext(ctx, "authentication off (ALLOT_AUTH=none): anyone who reaches ingest may act for any user")
	case access.Loopback(addr):
		deps.Log.WarnContext(ctx, "authentication off: no key is set and ingest listens on a loopback address only; set ALLOT_AUTH_HS256_KEY (at least 32 bytes) or ALLOT_AUTH_JWKS_URL to require bearer tokens",
			slog.String("addr", addr))
	default:
		return nil, fmt.Errorf("ingest: %w", access.ErrOpenNotLoopback(addr))
	}
	return closeAuth, nil
}

// newHTTPServer wraps h in an http.Server with timeouts fit for the API:
// headers must arrive quickly, bodies are small, and a response may take up
// to MaxWait plus a publish and a read, so WriteTimeout exceeds their sum.
func newHTTPServer(h http.Handler, cfg Config, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      cfg.WriteTimeout(),
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    32 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
