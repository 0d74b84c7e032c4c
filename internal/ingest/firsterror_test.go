package ingest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/testenv"
)

// TestRunFirstErrorWins: ready, with a metrics listener of its own, Run
// returns the first error promptly when the API listener fails, without
// its context ending, and stops what it started: the metrics listener,
// the Service's subscriptions (goleak checks the goroutines).
func TestRunFirstErrorWins(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ns := natstest.New(t)
	ns.Setup(t, config.Defaults[bus.Config]())
	nc, _ := ns.Connect(t)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &testenv.BrokenListener{Listener: inner}
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := mln.Addr().String()
	ran := make(chan error, 1)
	go func() {
		cfg := testConfig()
		cfg.ShutdownTimeout = 5 * time.Second
		ran <- Run(context.Background(), cfg, Deps{DB: db.DB, NATS: nc, Listener: ln, MetricsListener: mln, Registry: prometheus.NewRegistry()})
	}()
	get := func(url string) int {
		c, _ := statusOf(http.MethodGet, url, "")
		return c
	}
	eventually(t, 20*time.Second, "Run gets ready", func() bool { return get("http://"+inner.Addr().String()+"/readyz") == http.StatusOK })
	if c := get("http://" + metricsAddr + "/metrics"); c != http.StatusOK {
		t.Fatalf("metrics listener: %d, want 200", c)
	}
	// Besides the connection's shared reply inbox, the Service subscribes
	// to results and watches views.
	if n := nc.NumSubscriptions(); n < 2 {
		t.Fatalf("%d subscriptions while ready, want the Service's and the reply inbox", n)
	}

	ln.Break()
	select {
	case err := <-ran:
		if !errors.Is(err, testenv.ErrListenerBroke) {
			t.Fatalf("Run = %v, want the listener's error", err)
		}
		if got, want := err.Error(), "ingest: serve: "+testenv.ErrListenerBroke.Error(); got != want {
			t.Errorf("Run = %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its listener failing")
	}
	if c, err := net.DialTimeout("tcp", metricsAddr, time.Second); err == nil {
		c.Close()
		t.Error("the metrics listener still accepts after Run returned")
	}
	if n := nc.NumSubscriptions(); n > 1 {
		t.Errorf("%d subscriptions left after Run returned, want only the reply inbox: the Service did not stop", n)
	}
	http.DefaultClient.CloseIdleConnections()
}
