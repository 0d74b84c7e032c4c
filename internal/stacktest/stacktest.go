// Package stacktest runs the whole system in one test's process: its own
// MariaDB database, its own JetStream server, a started allocator, and
// ingest behind an httptest server. End-to-end and browser tests drive it
// through HTTP as a client would.
package stacktest

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/natstest"
)

// Stack is one test's running system.
type Stack struct {
	DB *dbtest.DB
	NS *natstest.Server
	// JS is a JetStream handle on the test's server, for reading streams.
	JS jetstream.JetStream
	// URL is ingest's base URL.
	URL string
}

// IngestConfig is the ingest configuration stack tests start from: the
// defaults, without the per-user write and read limits (a test's client
// acts for few users, fast).
func IngestConfig() ingest.Config {
	c := config.Defaults[ingest.Config]()
	c.UserRate, c.ReadRate = 0, 0
	return c
}

// Start runs an allocator with acfg and ingest with icfg until t ends.
// ideps may set what is not configuration (a Verifier, test hooks); Start
// fills in the database, NATS, logger and registry.
func Start(t testing.TB, acfg allocator.Config, icfg ingest.Config, ideps ingest.Deps) *Stack {
	t.Helper()
	s := &Stack{DB: dbtest.New(t), NS: natstest.New(t)}
	// The setup step first, as `allotctl setup` runs before the binaries.
	icfg.Partitions = max(acfg.Partitions, icfg.Partitions)
	s.NS.Setup(t, natstest.Config(icfg.Partitions))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()

	anc, _ := s.NS.Connect(t)
	a, err := allocator.New(acfg, allocator.Deps{DB: s.DB.DB, NATS: anc, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)

	ideps.DB = s.DB.DB
	s.JS, s.URL = startIngest(t, s.NS, icfg, ideps, log)
	return s
}

// startIngest starts ingest with icfg and ideps (its databases set) on a
// connection of its own to ns, behind an httptest server, until t ends.
// It returns ingest's JetStream handle and its base URL.
func startIngest(t testing.TB, ns *natstest.Server, icfg ingest.Config, ideps ingest.Deps, log *slog.Logger) (jetstream.JetStream, string) {
	t.Helper()
	inc, ijs := ns.Connect(t)
	ideps.NATS, ideps.JS, ideps.Log, ideps.Registry = inc, ijs, log, prometheus.NewRegistry()
	svc, err := ingest.New(icfg, ideps)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return ijs, srv.URL
}
