package natstest

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NewPlain starts a NATS server without JetStream for t on a free port:
// what a binary meets when JetStream is not there yet (a cluster still
// electing its meta leader answers the JetStream API no better). It returns
// the server and its port; Shutdown it to make room for a JetStream server
// on the same port (bus.RunServer with that Port).
func NewPlain(t testing.TB) (*server.Server, int) {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("natstest: plain server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s, s.Addr().(*net.TCPAddr).Port
}
