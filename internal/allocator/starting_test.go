package allocator

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
)

// TestRunWaitsForJetStream: started while NATS has no JetStream (as a
// cluster that has just formed answers), Run does not exit: /readyz
// answers 503 while it retries, and 200 once JetStream answers on the same
// URL and the partitions run.
func TestRunWaitsForJetStream(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	late := natstest.NewLate(t)
	nc := late.Connect(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The metrics listener is open before Run starts, so that no parallel
	// test can take its port first.
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mln.Close() })
	addr := mln.Addr().String()
	cfg := conf(func(k *Config) { k.MetricsAddr = addr })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- Run(ctx, cfg, Deps{DB: db.DB, NATS: nc, Log: log, MetricsListener: mln}) }()
	readyz := func() int {
		r, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0
		}
		r.Body.Close()
		return r.StatusCode
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(25 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s", what)
			}
			select {
			case err := <-ran:
				t.Fatalf("%s: Run returned %v; want it to wait", what, err)
			default:
			}
		}
	}
	waitFor("/readyz 503 while JetStream is missing", func() bool { return readyz() == http.StatusServiceUnavailable })
	time.Sleep(2 * time.Second) // several attempts fail meanwhile
	waitFor("/readyz still 503", func() bool { return readyz() == http.StatusServiceUnavailable })

	late.StartJetStream()
	waitFor("/readyz 200 once JetStream answers", func() bool { return readyz() == http.StatusOK })
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run returned %v after cancel, want nil", err)
	}
}
