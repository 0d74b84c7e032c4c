package stacktest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/devdb"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
)

// ShardStack is one test's running system over several shards: n
// private MariaDB servers (shards s0..s<n-1>, partition p on s<p mod n>
// as setup seeds the map), the allocator's Run over all of them, and
// ingest reading each activity on its shard.
type ShardStack struct {
	// Procs are the shards' servers, which a test may Kill and Restart.
	Procs []*devdb.DB
	// DBs are the shards' databases, for the test's own reads.
	DBs []*dbtest.DB
	NS  *natstest.Server
	JS  jetstream.JetStream
	// URL is ingest's base URL, AllocatorURL the allocator's metrics
	// server (/readyz, /metrics).
	URL, AllocatorURL string
}

// StartShards runs the allocator (allocator.Run, with acfg) and ingest
// (icfg, ideps as Start takes them) over n shards until t ends.
func StartShards(t testing.TB, n int, acfg allocator.Config, icfg ingest.Config, ideps ingest.Deps) *ShardStack {
	t.Helper()
	s := &ShardStack{NS: natstest.New(t), Procs: dbtest.ServerProcs(t, n)}
	ctx := context.Background()
	apools, ipools := shards.Pools{}, shards.Pools{}
	var names []string
	for i, p := range s.Procs {
		db := dbtest.NewOn(t, p.DSN)
		s.DBs = append(s.DBs, db)
		name := fmt.Sprintf("s%d", i)
		names = append(names, name)
		// Each part its own pool, as the binaries open them.
		for _, pools := range []shards.Pools{apools, ipools} {
			pool, err := store.Open(ctx, db.DSN, 8)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pool.Close() })
			pools[name] = pool
		}
	}
	icfg.Partitions = max(acfg.Partitions, icfg.Partitions)
	acfg.Partitions = icfg.Partitions
	s.NS.Setup(t, natstest.Config(icfg.Partitions), names...)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	anc, _ := s.NS.Connect(t)
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.AllocatorURL = "http://" + mln.Addr().String()
	actx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() {
		ran <- allocator.Run(actx, acfg, allocator.Deps{DB: apools[names[0]], Shards: apools, NATS: anc, Log: log,
			MetricsListener: mln, Test: allocator.TestHooks{AckWait: 2 * time.Second, IdleCheck: 100 * time.Millisecond}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("allocator Run: %v", err)
		}
	})

	ideps.Shards = ipools
	s.JS, s.URL = startIngest(t, s.NS, icfg, ideps, log)
	return s
}
