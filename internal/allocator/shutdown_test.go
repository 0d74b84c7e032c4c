package allocator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// TestRelayHoldsNoLockWhileAwaitingAcks: the relay used to publish inside
// the transaction that locked its cursor row, so a slow broker held a row
// lock and a pooled connection for up to 10s per pass, and shutdown waited
// on it. While its publishes await their PubAcks the cursor row must be
// free and the relay's pool idle.
func TestRelayHoldsNoLockWhileAwaitingAcks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	pool, err := store.Open(ctx, e.db.DSN, 4) // the allocator's own pool, to count its connections
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	a, err := New(pool, e.nc, e.log, nil, Config{IdleCheck: time.Minute}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	checked := make(chan error, 1)
	var once sync.Once
	a.relay.awaitingAcks = func() {
		once.Do(func() { checked <- relayHoldsNothing(ctx, e.db.DB, pool) })
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	e.publish(open(1, 1), "")
	e.publish(req(wire.OpJoin, 1, 1), "")
	select {
	case err := <-checked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the relay published nothing within 20s")
	}
}

// relayHoldsNothing checks that another transaction can lock the relay's
// cursor row at once and that pool has no connection in use (within a
// second: the apply loop and the gauges use it briefly).
func relayHoldsNothing(ctx context.Context, other, pool *sql.DB) error {
	tx, err := other.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	var last uint64
	if err := tx.QueryRowContext(ctx, "SELECT last_seq FROM event_relay WHERE partition_id = 0 FOR UPDATE NOWAIT").Scan(&last); err != nil {
		return fmt.Errorf("the relay cursor is locked while publishes await their PubAcks: %w", err)
	}
	deadline := time.Now().Add(time.Second)
	for n := pool.Stats().InUse; n > 0; n = pool.Stats().InUse {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d connections of the allocator's pool in use while publishes await their PubAcks", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// TestPartitionsStopInParallel: Run stopped its allocators one after
// another, so a process with several partitions needed a multiple of one
// allocator's shutdown grace and was killed half way. With a slow stop,
// every partition's stop must be under way at once.
func TestPartitionsStopInParallel(t *testing.T) {
	t.Parallel()
	e := &env{t: t, db: dbtest.New(t), ns: natstest.New(t), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	e.nc, e.js = e.ns.Connect(t)
	const partitions = 3
	e.ns.Setup(t, natstest.Config(partitions))
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
	cfg := RunConfig{Config: Config{Partitions: partitions}, hooks: Hooks{Stopping: slowStop}}
	go func() { done <- Run(ctx, cfg, e.db.DB, e.nc, e.log) }()
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
