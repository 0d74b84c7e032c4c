package natstest

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/bus"
)

// Late is a NATS server that answers without JetStream at first and gets
// JetStream later at the same URL: what a binary meets when it starts
// before JetStream is there (a cluster still electing its meta leader
// answers the JetStream API no better).
//
// The URL is that of a forwarder the test holds until it ends, not a
// server's own port: the JetStream server comes up on a port of its own
// and the forwarder turns to it, so that no parallel test can take the
// URL's port between the two servers.
type Late struct {
	t     testing.TB
	plain *server.Server
	fwd   *forwarder
}

// NewLate starts a server without JetStream for t, stopped when t ends.
func NewLate(t testing.TB) *Late {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("natstest: plain server not ready")
	}
	return &Late{t: t, plain: s, fwd: newForwarder(t, s.Addr().String())}
}

// URL is the client URL, the same before and after StartJetStream.
func (l *Late) URL() string { return "nats://" + l.fwd.ln.Addr().String() }

// Connect returns a connection to URL made as the binaries make theirs
// (bus.Connect: it reconnects for ever), closed at cleanup.
func (l *Late) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := bus.Connect(l.URL(), t.Name(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// StartJetStream brings JetStream to URL: it starts a JetStream server
// (stopped when the test ends), runs the setup step on it with c (the
// streams and buckets, as `allotctl setup` would have; the defaults when
// none is given), turns the
// forwarder to it, and shuts the plain server down, which drops every
// connection to it: clients reconnect to URL and find JetStream set up.
func (l *Late) StartJetStream(c ...bus.Config) {
	l.t.Helper()
	js, err := bus.RunServer(bus.ServerConfig{Port: -1, StoreDir: l.t.TempDir(), SyncInterval: time.Second})
	if err != nil {
		l.t.Fatalf("natstest: %v", err)
	}
	l.t.Cleanup(func() { js.Shutdown(); js.WaitForShutdown() })
	sc := Config(0)
	if len(c) > 0 {
		sc = c[0]
	}
	SetupAt(l.t, js.ClientURL(), sc)
	l.fwd.turnTo(js.Addr().String())
	l.plain.Shutdown()
	l.plain.WaitForShutdown()
}

// forwarder accepts TCP connections on a loopback port of its own and
// relays each to the address it is turned to when it accepts it.
type forwarder struct {
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	to     string
	conns  map[net.Conn]struct{}
	closed bool
}

// newForwarder forwards to to until t ends.
func newForwarder(t testing.TB, to string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: forwarder: %v", err)
	}
	f := &forwarder{ln: ln, to: to, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(f.close)
	return f
}

func (f *forwarder) turnTo(to string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.to = to
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go f.relay(c)
	}
}

// track records c so that close closes it; once closed, it closes c and
// reports false.
func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(f.conns, c)
	}
}

// relay copies both ways between c and a connection to the current
// address until either side ends, then closes both.
func (f *forwarder) relay(c net.Conn) {
	defer f.wg.Done()
	if !f.track(c) {
		return
	}
	f.mu.Lock()
	to := f.to
	f.mu.Unlock()
	up, err := net.DialTimeout("tcp", to, 5*time.Second)
	if err != nil {
		f.untrack(c)
		return
	}
	if !f.track(up) {
		f.untrack(c)
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(up, c) //nolint:errcheck // either side closing ends the pipe; untrack closes both
		f.untrack(c, up)
	}()
	io.Copy(c, up) //nolint:errcheck // as above
	f.untrack(c, up)
	<-done
}

// close stops accepting, closes every relayed connection and waits for
// the relays to end.
func (f *forwarder) close() {
	f.mu.Lock()
	f.closed = true
	f.ln.Close()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
