package testenv

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo serves a line echo on a local port until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// roundTrip writes line and reads the answer within d; ok false on a
// timeout or an error.
func roundTrip(c net.Conn, r *bufio.Reader, line string, d time.Duration) (string, bool) {
	c.SetDeadline(time.Now().Add(d)) //nolint:errcheck // a test connection
	if _, err := c.Write([]byte(line)); err != nil {
		return "", false
	}
	got, err := r.ReadString('\n')
	return got, err == nil
}

// TestProxyHangsRefusesAndForwards: through the proxy a line comes back;
// while it hangs nothing does (and a new connection hangs too), and what
// was sent meanwhile arrives once it forwards again; while it refuses,
// connections fail at once.
func TestProxyHangsRefusesAndForwards(t *testing.T) {
	t.Parallel()
	p := NewProxy(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, ok := roundTrip(c, r, "one\n", 5*time.Second); !ok || got != "one\n" {
		t.Fatalf("forwarding: %q %v", got, ok)
	}
	p.Hang()
	if got, ok := roundTrip(c, r, "two\n", 300*time.Millisecond); ok {
		t.Fatalf("hanging: %q came back", got)
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("hanging: a new connection was not accepted: %v", err)
	}
	defer c2.Close()
	r2 := bufio.NewReader(c2)
	if got, ok := roundTrip(c2, r2, "new\n", 300*time.Millisecond); ok {
		t.Fatalf("hanging: %q came back on a new connection", got)
	}
	before := p.Late()
	p.Forward()
	c.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a test connection
	if got, err := r.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("forwarding again: the held line came back as %q, %v", got, err)
	}
	if p.Late() <= before {
		t.Error("the held line is not counted as late")
	}
	c2.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a test connection
	if got, err := r2.ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("forwarding again: the new connection's held line came back as %q, %v", got, err)
	}
	p.Refuse()
	if _, ok := roundTrip(c, r, "three\n", 5*time.Second); ok {
		t.Fatal("refusing: an open connection still answers")
	}
	c3, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer c3.Close()
		if _, ok := roundTrip(c3, bufio.NewReader(c3), "four\n", 5*time.Second); ok {
			t.Fatal("refusing: a new connection answers")
		}
	}
	p.Forward()
	c4, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c4.Close()
	if got, ok := roundTrip(c4, bufio.NewReader(c4), "five\n", 5*time.Second); !ok || got != "five\n" {
		t.Fatalf("forwarding after refusing: %q %v", got, ok)
	}
}
