package baseline

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"
)

// Redis is a minimal RESP2 client for the gate: DECR, INCR, SET, DEL and
// PING, nothing else. A call borrows one pooled TCP connection for its
// whole round trip, so each goroutine talks over its own connection and
// replies never interleave. Connections are dialled on demand, at most
// poolSize of them; a goroutine that finds them all busy waits for one, as
// with go-redis's PoolSize. The bound matters in a burst: thousands of
// simultaneous dials overflow Redis's listen backlog (511) and the
// overflow pays a one-second SYN retransmit, which would be measured as the
// gate's latency.
type Redis struct {
	addr    string
	timeout time.Duration
	idle    chan *respConn
	slots   chan struct{} // one token per open connection
	closed  atomic.Bool
}

// ErrRedisClosed is returned by calls on a closed client.
var ErrRedisClosed = errors.New("redis client is closed")

// RedisError is an error reply ("-ERR …") from the server. The connection
// stays usable after one.
type RedisError string

func (e RedisError) Error() string { return "redis: " + string(e) }

// DefaultRedisTimeout bounds a round trip when the context has no deadline.
const DefaultRedisTimeout = 5 * time.Second

// DefaultRedisPool is the pool size Handler uses.
const DefaultRedisPool = 256

// DialRedis returns a client for addr with at most poolSize connections,
// after checking with PING that the server answers.
func DialRedis(ctx context.Context, addr string, poolSize int) (*Redis, error) {
	poolSize = max(poolSize, 1)
	r := &Redis{
		addr: addr, timeout: DefaultRedisTimeout,
		idle: make(chan *respConn, poolSize), slots: make(chan struct{}, poolSize),
	}
	if err := r.Ping(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Close closes the idle connections; connections in use are closed when
// they are given back.
func (r *Redis) Close() error {
	r.closed.Store(true)
	for {
		select {
		case c := <-r.idle:
			r.discard(c)
		default:
			return nil
		}
	}
}

// Ping sends PING and expects PONG.
func (r *Redis) Ping(ctx context.Context) error {
	_, err := r.do(ctx, "PING", "", "", "", "")
	return err
}

// Decr is DECR key: the value after the decrement.
func (r *Redis) Decr(ctx context.Context, key string) (int64, error) {
	return r.do(ctx, "DECR", key, "", "", "")
}

// Incr is INCR key: the value after the increment.
func (r *Redis) Incr(ctx context.Context, key string) (int64, error) {
	return r.do(ctx, "INCR", key, "", "", "")
}

// Set is SET key value, with EX ttl when ttl is at least a second.
func (r *Redis) Set(ctx context.Context, key string, value int64, ttl time.Duration) error {
	v := strconv.FormatInt(value, 10)
	if ttl >= time.Second {
		_, err := r.do(ctx, "SET", key, v, "EX", strconv.FormatInt(int64(ttl/time.Second), 10))
		return err
	}
	_, err := r.do(ctx, "SET", key, v, "", "")
	return err
}

// Del is DEL key: the number of keys removed.
func (r *Redis) Del(ctx context.Context, key string) (int64, error) {
	return r.do(ctx, "DEL", key, "", "", "")
}

// respConn is one TCP connection with its buffers, reused for every call.
type respConn struct {
	nc  net.Conn
	br  *bufio.Reader
	bw  *bufio.Writer
	num [20]byte
}

// get returns an idle connection, or dials one when fewer than poolSize
// are open, or waits for one to be given back.
func (r *Redis) get(ctx context.Context) (*respConn, error) {
	if r.closed.Load() {
		return nil, ErrRedisClosed
	}
	select {
	case c := <-r.idle:
		return c, nil
	default:
	}
	select {
	case c := <-r.idle:
		return c, nil
	case r.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	d := net.Dialer{Timeout: r.timeout}
	nc, err := d.DialContext(ctx, "tcp", r.addr)
	if err != nil {
		<-r.slots
		return nil, fmt.Errorf("redis at %s: %w", r.addr, err)
	}
	return &respConn{nc: nc, br: bufio.NewReaderSize(nc, 512), bw: bufio.NewWriterSize(nc, 512)}, nil
}

// put gives a healthy connection back; idle has room for every open one.
func (r *Redis) put(c *respConn) {
	if r.closed.Load() {
		r.discard(c)
		return
	}
	r.idle <- c
}

// discard closes a connection and frees its slot.
func (r *Redis) discard(c *respConn) {
	c.nc.Close()
	<-r.slots
}

// do sends one command of up to four arguments (empty ones are left out;
// none of the gate's keys or values is empty) and reads an integer or
// status reply. Status replies (+OK, +PONG) read as 0.
func (r *Redis) do(ctx context.Context, cmd, a1, a2, a3, a4 string) (int64, error) {
	c, err := r.get(ctx)
	if err != nil {
		return 0, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(r.timeout)
	}
	c.nc.SetDeadline(deadline) //nolint:errcheck // a failed deadline shows as a failed write or read
	n, err := c.roundTrip(cmd, a1, a2, a3, a4)
	var re RedisError
	if err != nil && !errors.As(err, &re) {
		// The stream may be out of step with the replies: never reuse it.
		r.discard(c)
		return 0, fmt.Errorf("redis %s: %w", cmd, err)
	}
	r.put(c)
	return n, err
}

func (c *respConn) roundTrip(cmd string, args ...string) (int64, error) {
	argc := 1
	for _, a := range args {
		if a != "" {
			argc++
		}
	}
	c.bw.WriteByte('*')
	c.bw.Write(strconv.AppendInt(c.num[:0], int64(argc), 10))
	c.bw.WriteString("\r\n")
	c.bulk(cmd)
	for _, a := range args {
		if a != "" {
			c.bulk(a)
		}
	}
	if err := c.bw.Flush(); err != nil {
		return 0, err
	}
	return c.readReply()
}

func (c *respConn) bulk(s string) {
	c.bw.WriteByte('$')
	c.bw.Write(strconv.AppendInt(c.num[:0], int64(len(s)), 10))
	c.bw.WriteString("\r\n")
	c.bw.WriteString(s)
	c.bw.WriteString("\r\n")
}

var errProtocol = errors.New("unexpected reply")

// readReply reads one reply: an integer, a status, an error or a bulk
// string that holds an integer. Arrays are never expected from the gate's
// commands.
func (c *respConn) readReply() (int64, error) {
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return 0, errProtocol
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case ':':
		return parseInt(body)
	case '+':
		return 0, nil
	case '-':
		return 0, RedisError(body)
	case '$':
		size, err := parseInt(body)
		if err != nil || size < 0 {
			return 0, errProtocol
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(c.br, buf); err != nil {
			return 0, err
		}
		return parseInt(buf[:size])
	default:
		return 0, errProtocol
	}
}

func parseInt(b []byte) (int64, error) {
	if len(b) == 0 {
		return 0, errProtocol
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
		if len(b) == 0 {
			return 0, errProtocol
		}
	}
	var n int64
	for _, ch := range b {
		if ch < '0' || ch > '9' {
			return 0, errProtocol
		}
		n = n*10 + int64(ch-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}
