package testenv

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy a test puts between a client and a server (MySQL)
// to cut the route between them without touching either: Hang stops
// forwarding while every connection stays open, as a lost route does
// (the client sees a hang, not an error); Refuse drops every connection
// and every new one at once (quick errors); Forward forwards again, bytes
// held meanwhile included, as a route that comes back delivers them late.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	up      bool          // client→server chunks wait
	down    bool          // server→client chunks wait
	refuse  bool          // connections are dropped
	trigger []byte        // HangAfter's
	changed chan struct{} // closed and replaced at every change
	conns   map[net.Conn]struct{}
	closed  bool

	late atomic.Int64 // chunks that waited and were forwarded after all

	wg sync.WaitGroup
}

// NewProxy listens on a local port and forwards every connection to
// upstream (host:port) until the test ends.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, upstream: upstream, changed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Hang stops forwarding in both directions: connections stay open, new
// ones are accepted and held, nothing passes until Forward.
func (p *Proxy) Hang() { p.set(func() { p.up, p.down = true, true }) }

// HangAfter forwards until the client sends a chunk holding trigger; that
// chunk and the server's answers still pass, then the client's next
// chunks are held until Forward: the client is cut off in the middle of
// what it was doing, the server keeps its session (and its locks).
func (p *Proxy) HangAfter(trigger []byte) { p.set(func() { p.trigger = bytes.Clone(trigger) }) }

// Refuse closes every connection and, until Forward, every new one as
// soon as it is accepted.
func (p *Proxy) Refuse() {
	p.set(func() { p.refuse = true })
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

// Forward forwards again, held bytes first.
func (p *Proxy) Forward() {
	p.set(func() { p.up, p.down, p.refuse, p.trigger = false, false, false, nil })
}

// Late is how many chunks were held by a hang and released once it
// ended: bytes a cut-off client sent that reached the server after all.
func (p *Proxy) Late() int64 { return p.late.Load() }

// Close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.changed)
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) set(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	f()
	close(p.changed)
	p.changed = make(chan struct{})
}

// track registers c; false when the proxy is closed or refusing.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.refuse {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) //nolint:errcheck // a reset, as a refusing host sends
			}
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	// The dial waits too while hanging: a new connection is accepted and
	// then hangs, as one would behind a lost route.
	if _, ok := p.wait(true); !ok {
		return
	}
	server, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	if !p.track(server) {
		server.Close()
		return
	}
	defer p.untrack(server)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		p.copy(server, client, true)
		server.Close()
		client.Close()
	}()
	go func() {
		defer wg.Done()
		p.copy(client, server, false)
		server.Close()
		client.Close()
	}()
	wg.Wait()
}

// copy forwards src to dst chunk by chunk, each chunk waiting while its
// direction hangs.
func (p *Proxy) copy(dst, src net.Conn, up bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			waited, ok := p.wait(up)
			if !ok {
				return
			}
			// Counted before the write: once it is written, the server's
			// answer may reach the client before this goroutine runs again.
			if waited {
				p.late.Add(1)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if up {
				p.mu.Lock()
				if p.trigger != nil && bytes.Contains(buf[:n], p.trigger) {
					p.trigger, p.up = nil, true
					close(p.changed)
					p.changed = make(chan struct{})
				}
				p.mu.Unlock()
			}
		}
		if err != nil {
			// A close is held like any byte: behind a lost route the
			// other side never hears of it.
			p.wait(up)
			return
		}
	}
}

// wait blocks while the direction hangs, and says whether it did; ok is
// false when the connection must go (refusing, or the proxy closed).
func (p *Proxy) wait(up bool) (waited, ok bool) {
	for ; ; waited = true {
		p.mu.Lock()
		hung := p.down
		if up {
			hung = p.up
		}
		refuse, closed, ch := p.refuse, p.closed, p.changed
		p.mu.Unlock()
		if closed || refuse {
			return waited, false
		}
		if !hung {
			return waited, true
		}
		<-ch
	}
}
