// Package natstest gives each test its own embedded JetStream server on a
// free port with its own store directory, shut down when the test ends.
package natstest

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/wire"
)

// Server is one test's JetStream server.
type Server struct {
	t   testing.TB
	cfg bus.ServerConfig
	*server.Server
}

// New starts a server for t. Streams are not created: the setup step
// does that (Setup, as `allotctl setup` in production); the runtime code
// under test only checks them.
func New(t testing.TB) *Server {
	t.Helper()
	cfg := bus.ServerConfig{Port: -1, StoreDir: t.TempDir(), SyncInterval: time.Second}
	s, err := bus.RunServer(cfg)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	// Keep the port so that Restart comes back at the same URL.
	cfg.Port = s.Addr().(*net.TCPAddr).Port
	ts := &Server{t: t, cfg: cfg, Server: s}
	t.Cleanup(func() { ts.Server.Shutdown(); ts.Server.WaitForShutdown() })
	return ts
}

// URL is the client URL of the server.
func (s *Server) URL() string { return s.Server.ClientURL() }

// Stop shuts the server down, keeping its store.
func (s *Server) Stop() {
	s.Server.Shutdown()
	s.Server.WaitForShutdown()
}

// Start starts a stopped server again on the same port and store.
func (s *Server) Start() {
	s.t.Helper()
	srv, err := bus.RunServer(s.cfg)
	if err != nil {
		s.t.Fatalf("natstest: restart: %v", err)
	}
	s.Server = srv
}

// Config is the setup step's configuration a test starts from: the
// defaults of bus.Config, with partitions partitions (the default when 0).
func Config(partitions int) bus.Config {
	c := config.Defaults[bus.Config]()
	if partitions != 0 {
		c.Partitions = partitions
	}
	return c
}

// Setup runs the setup step (bus.Setup) on the server with c, and the
// shard map seeded with shardNames (one shard when none), as `allotctl
// setup` does before the binaries start.
func (s *Server) Setup(t testing.TB, c bus.Config, shardNames ...string) {
	t.Helper()
	SetupAt(t, s.URL(), c, shardNames...)
}

// SetupAt runs the setup step on the JetStream server at url.
func SetupAt(t testing.TB, url string, c bus.Config, shardNames ...string) {
	t.Helper()
	nc, err := bus.Connect(url, "allotctl", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("natstest: setup: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: setup: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := bus.SetupWait(ctx, js, c, shardNames, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatalf("natstest: setup: %v", err)
	}
}

// Connect returns a connection and a JetStream handle, closed at cleanup.
func (s *Server) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := bus.Connect(s.URL(), t.Name(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return nc, js
}

// StreamMsgs is the number of messages stored in stream, 0 if it does not exist.
func StreamMsgs(t testing.TB, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	st, err := js.Stream(context.Background(), stream)
	if err != nil {
		return 0
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatalf("natstest: stream info %s: %v", stream, err)
	}
	return info.State.Msgs
}

// PublishRequest stores r on its subject with Nats-Msg-Id = msgID
// (r.RequestID when empty), as ingest would, and returns its stream
// sequence.
func PublishRequest(t testing.TB, js jetstream.JetStream, r wire.Request, msgID string) uint64 {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if msgID == "" {
		msgID = r.RequestID
	}
	ack, err := js.Publish(context.Background(), wire.RequestSubject(r.ActivityID), b, jetstream.WithMsgID(msgID))
	if err != nil {
		t.Fatalf("natstest: publish %s: %v", r.RequestID, err)
	}
	return ack.Sequence
}
