package allocator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/testenv"
)

// TestRunFirstErrorWins: with every partition running, Run returns the
// first error promptly when the metrics listener fails, without its
// context ending, after stopping every partition (goleak checks the
// goroutines).
func TestRunFirstErrorWins(t *testing.T) {
	t.Parallel()
	const partitions = 2
	db := dbtest.New(t)
	ns := natstest.New(t)
	ns.Setup(t, natstest.Config(partitions))
	nc, _ := ns.Connect(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &testenv.BrokenListener{Listener: inner}
	var stops atomic.Int32
	cfg := conf(func(k *Config) { k.Partitions = partitions; k.MetricsAddr = ln.Addr().String() })
	deps := Deps{DB: db.DB, NATS: nc, Log: log, MetricsListener: ln, Test: TestHooks{Stopping: func() { stops.Add(1) }}}
	ran := make(chan error, 1)
	go func() { ran <- Run(context.Background(), cfg, deps) }()
	readyz := func() int {
		r, err := http.Get("http://" + ln.Addr().String() + "/readyz")
		if err != nil {
			return 0
		}
		r.Body.Close()
		return r.StatusCode
	}
	testenv.WaitFor(t, 30*time.Second, "ready", func() bool { return readyz() == http.StatusOK })
	http.DefaultClient.CloseIdleConnections()

	ln.Break()
	select {
	case err := <-ran:
		if !errors.Is(err, testenv.ErrListenerBroke) {
			t.Fatalf("Run = %v, want the listener's error", err)
		}
		if got, want := err.Error(), "allocator metrics: serve: "+testenv.ErrListenerBroke.Error(); got != want {
			t.Errorf("Run = %q, want %q", got, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of its metrics listener failing")
	}
	if n := stops.Load(); n != partitions {
		t.Errorf("%d of %d partitions stopped", n, partitions)
	}
}
