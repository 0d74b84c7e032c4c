package allocator

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

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
