package natstest

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
)

// Freezer is a TCP proxy in front of a NATS server that passes the NATS
// protocol through, except that it silently drops every message a client
// publishes to a subject containing Freeze (while frozen). To the client
// behind it, a bucket whose subjects it drops is a frozen one: its puts
// are sent and never acknowledged, its reads never answered, exactly as
// with a bucket whose stream has lost its leader.
type Freezer struct {
	ln     net.Listener
	to     string
	freeze []byte
	mu     sync.Mutex
	frozen bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

// NewFreezer listens on a free loopback port and forwards to addr
// (host:port), dropping publishes on subjects containing freeze once
// SetFrozen(true) is called.
func NewFreezer(addr, freeze string) (*Freezer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &Freezer{ln: ln, to: addr, freeze: []byte(freeze)}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

// URL is the proxy's client URL.
func (f *Freezer) URL() string { return "nats://" + f.ln.Addr().String() }

// SetFrozen starts or stops dropping.
func (f *Freezer) SetFrozen(on bool) {
	f.mu.Lock()
	f.frozen = on
	f.mu.Unlock()
}

func (f *Freezer) isFrozen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frozen
}

// Close stops the proxy and every connection through it.
func (f *Freezer) Close() {
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *Freezer) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", f.to)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, s)
		f.mu.Unlock()
		f.wg.Add(2)
		go func() {
			defer f.wg.Done()
			io.Copy(c, s) //nolint:errcheck
			c.Close()
			s.Close()
		}()
		go func() {
			defer f.wg.Done()
			f.filter(s, c)
			c.Close()
			s.Close()
		}()
	}
}

// filter copies the client's protocol to the server line by line; PUB and
// HPUB carry a payload of a size the line gives, dropped with its line
// when the subject matches.
func (f *Freezer) filter(dst io.Writer, src io.Reader) {
	r := bufio.NewReaderSize(src, 64<<10)
	w := bufio.NewWriterSize(dst, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return
		}
		fields := bytes.Fields(line)
		payload := -1
		if len(fields) >= 3 {
			switch string(bytes.ToUpper(fields[0])) {
			case "PUB", "HPUB":
				payload, _ = strconv.Atoi(string(fields[len(fields)-1]))
			}
		}
		drop := payload >= 0 && bytes.Contains(fields[1], f.freeze) && f.isFrozen()
		if !drop {
			w.Write(line) //nolint:errcheck
		}
		if payload >= 0 {
			// The payload and its CRLF.
			if drop {
				if _, err := r.Discard(payload + 2); err != nil {
					return
				}
			} else if _, err := io.CopyN(w, r, int64(payload+2)); err != nil {
				return
			}
		}
		if r.Buffered() == 0 {
			if w.Flush() != nil {
				return
			}
		}
	}
}
