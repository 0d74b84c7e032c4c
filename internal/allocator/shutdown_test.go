package allocator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
)

// TestPartitionsStopInParallel: Run stopped its allocators one after
// another, so a process with several partitions needed a multiple of one
// allocator's shutdown grace and was killed half way. With a slow stop,
// every partition's stop must be under way at once.
func TestPartitionsStopInParallel(t *testing.T) {
	t.Parallel()
	e := &env{t: t, db: dbtest.New(t), ns: natstest.New(t), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	e.nc, e.js = e.ns.Connect(t)
	const partitions = 3
	e.ns.Setup(t, bus.StreamConfig{Partitions: partitions})
	var (
		mu            sync.Mutex
		active, most  int
		stopsBegun    int
		allStopsBegun = make(chan struct{})
	)
	slowStop := func() {
		mu.Lock()
		active++
		most = max(most, active)
		if stopsBegun++; stopsBegun == partitions {
			close(allStopsBegun)
		}
		mu.Unlock()
		select { // the others' stops begin meanwhile, if they run in parallel
		case <-allStopsBegun:
		case <-time.After(2 * time.Second):
		}
		mu.Lock()
		active--
		mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := conf(func(k *Config) { k.Partitions = partitions; k.MetricsAddr = "" })
	deps := Deps{DB: e.db.DB, NATS: e.nc, Log: e.log, Test: TestHooks{Stopping: slowStop}}
	go func() { done <- Run(ctx, cfg, deps) }()
	// Running: every partition's fence row exists.
	deadline := time.Now().Add(20 * time.Second)
	for e.db.Count(t, "SELECT COUNT(*) FROM event_relay") < partitions {
		if time.Now().After(deadline) {
			t.Fatal("the allocators did not start within 20s")
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned before its stop: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of its stop")
	}
	if most != partitions {
		t.Fatalf("at most %d of %d partitions were stopping at once, want all of them", most, partitions)
	}
}

// TestMetricsServerCutsStalledClients: the metrics server had only a
// header timeout, so an idle keep-alive connection or a client that sent a
// body slowly held a connection open for ever (and Shutdown waited on it).
func TestMetricsServerCutsStalledClients(t *testing.T) {
	t.Parallel()
	for name, d := range map[string]time.Duration{"read header": metricsTimeouts.readHeader, "read": metricsTimeouts.read,
		"write": metricsTimeouts.write, "idle": metricsTimeouts.idle} {
		if d <= 0 {
			t.Errorf("metrics server %s timeout is %s, want one", name, d)
		}
	}
	short := 200 * time.Millisecond
	srv := newMetricsServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		w.Write([]byte("ok"))       //nolint:errcheck
	}), serverTimeouts{readHeader: short, read: short, write: short, idle: short})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck
	defer srv.Close()

	tests := []struct {
		name, send string
	}{
		{"idle keep-alive connection", "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"body that never comes", "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"},
	}
	for _, tt := range tests {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(tt.send)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		_, err = io.Copy(io.Discard, c)                    // until the server closes it
		c.Close()
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			t.Errorf("%s: still open after 5s, want it closed after about %s", tt.name, short)
		}
	}
}
