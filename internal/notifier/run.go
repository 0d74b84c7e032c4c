package notifier

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/allot-dev/allot/internal/lifecycle"
)

// StartError is Run's error when the notifier could not start: the streams
// or the consumer could not be checked or made (bus.IsSetupError tells a
// missing or wrong stream from an unreachable broker). cmd/notifier exits
// 2 on it, 1 on any other error.
type StartError struct{ Err error }

func (e *StartError) Error() string { return e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// Run runs a notifier with cfg (accepted by Config.Validate) until ctx
// ends, and with deps.Metrics set, serves /metrics and /healthz on it
// meanwhile. Every goroutine it starts has ended when it returns: nil after
// ctx ended, a *StartError when the notifier could not start, else the
// error that stopped it.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	n, err := New(cfg, deps)
	if err != nil {
		return &StartError{Err: err}
	}
	if err := n.setup(ctx); err != nil {
		return &StartError{Err: err}
	}
	// The workers stop when ctx ends (or when one of them fails), let the
	// attempts in flight finish and hand back the events waiting for a
	// retry, as Stop does.
	parts := append(n.workers("notifier"), lifecycle.Part{Name: "notifier", Run: func(ctx context.Context) error {
		<-ctx.Done()
		deps.Log.Info("notifier stopping: finishing the attempts in flight")
		return nil
	}})
	if deps.Metrics != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(deps.Gatherer, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			w.Write([]byte(`{"status":"ok"}`)) //nolint:errcheck // the client is gone; nothing to do
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		parts = append(parts, lifecycle.HTTPServer("metrics", srv, deps.Metrics, 5*time.Second, nil))
	}
	return lifecycle.Run(ctx, parts...)
}
