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
	"github.com/allot-dev/allot/internal/bus"
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

// Start runs an allocator with acfg and ingest with iopts until t ends.
func Start(t testing.TB, acfg allocator.Config, iopts ingest.Options) *Stack {
	t.Helper()
	s := &Stack{DB: dbtest.New(t), NS: natstest.New(t)}
	// The setup step first, as `allotctl setup` runs before the binaries.
	s.NS.Setup(t, bus.StreamConfig{Partitions: max(acfg.Partitions, iopts.Partitions)})
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

	inc, ijs := s.NS.Connect(t)
	s.JS = ijs
	svc, err := ingest.New(s.DB.DB, inc, ijs, log, prometheus.NewRegistry(), iopts)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}
