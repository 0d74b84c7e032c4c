package ingest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
)

// TestRunWaitsForJetStream: started while NATS has no JetStream (as a
// cluster that has just formed answers), Run does not exit: it serves
// /healthz 200, /readyz and the API 503 (with Retry-After), retries, and
// becomes ready once JetStream answers on the same URL.
func TestRunWaitsForJetStream(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	late := natstest.NewLate(t)
	nc := late.Connect(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() {
		cfg := testConfig()
		cfg.ShutdownTimeout = 5 * time.Second
		ran <- Run(ctx, cfg, Deps{DB: db.DB, NATS: nc, Listener: ln, Registry: prometheus.NewRegistry(), Log: log})
	}()
	base := "http://" + ln.Addr().String()
	code := func(method, path string) (int, string) {
		c, h := statusOf(method, base+path, "")
		return c, h.Get("Retry-After")
	}
	eventually(t, 10*time.Second, "Run serves /healthz while waiting", func() bool {
		c, _ := code(http.MethodGet, "/healthz")
		return c == http.StatusOK
	})
	// Several attempts fail meanwhile (the first one within 5s).
	time.Sleep(2 * time.Second)
	select {
	case err := <-ran:
		t.Fatalf("Run returned %v while JetStream was missing; want it to wait", err)
	default:
	}
	if c, _ := code(http.MethodGet, "/readyz"); c != http.StatusServiceUnavailable {
		t.Errorf("/readyz while waiting: %d, want 503", c)
	}
	if c, after := code(http.MethodPost, "/v1/activities/1/signups/1"); c != http.StatusServiceUnavailable || after == "" {
		t.Errorf("a write while waiting: %d (Retry-After %q), want 503 with Retry-After", c, after)
	}

	// JetStream comes up on the same URL: ingest gets ready by itself.
	late.StartJetStream()
	eventually(t, 30*time.Second, "ready once JetStream answers", func() bool {
		c, _ := code(http.MethodGet, "/readyz")
		return c == http.StatusOK
	})
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run returned %v after cancel, want nil", err)
	}
}
