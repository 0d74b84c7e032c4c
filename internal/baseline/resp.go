package baseline

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is the gate's Redis client: go-redis, the client a team would use,
// so that the published comparison measures the seed design as it would be
// built. Only DECR, INCR, SET, DEL and PING are used.
type Redis struct {
	c *redis.Client
}

// RedisError is an error reply ("-ERR …") from the server; match it with
// errors.As. The connection stays usable after one.
type RedisError = redis.Error

// DefaultRedisTimeout bounds a round trip when the context has no deadline.
const DefaultRedisTimeout = 5 * time.Second

// DefaultRedisPool is the pool size Handler uses.
const DefaultRedisPool = 256

// DialRedis returns a client for addr with at most poolSize connections,
// after checking with PING that the server answers. The pool is bounded
// because thousands of simultaneous dials in a burst overflow Redis's
// listen backlog (511), and the overflow pays a one-second SYN retransmit
// that would be measured as the gate's latency; a goroutine that finds
// every connection busy waits for one.
func DialRedis(ctx context.Context, addr string, poolSize int) (*Redis, error) {
	c := redis.NewClient(&redis.Options{
		Addr:         addr,
		PoolSize:     max(poolSize, 1),
		PoolTimeout:  DefaultRedisTimeout,
		DialTimeout:  DefaultRedisTimeout,
		ReadTimeout:  DefaultRedisTimeout,
		WriteTimeout: DefaultRedisTimeout,
		// The gate's commands are not idempotent (DECR): a retry after a
		// lost reply could take two units; the caller decides instead.
		MaxRetries: -1,
		// No CLIENT SETINFO at connect: Redis before 7.2 answers it with
		// an error.
		DisableIdentity: true,
	})
	r := &Redis{c: c}
	if err := r.Ping(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return r, nil
}

// ErrRedisClosed is returned by calls on a closed client.
var ErrRedisClosed = redis.ErrClosed

// Close closes the client's connections.
func (r *Redis) Close() error {
	if err := r.c.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
		return err
	}
	return nil
}

// Ping sends PING and expects PONG.
func (r *Redis) Ping(ctx context.Context) error { return r.c.Ping(ctx).Err() }

// Decr is DECR key: the value after the decrement.
func (r *Redis) Decr(ctx context.Context, key string) (int64, error) {
	return r.c.Decr(ctx, key).Result()
}

// Incr is INCR key: the value after the increment.
func (r *Redis) Incr(ctx context.Context, key string) (int64, error) {
	return r.c.Incr(ctx, key).Result()
}

// Set is SET key value, with EX ttl when ttl is at least a second.
func (r *Redis) Set(ctx context.Context, key string, value int64, ttl time.Duration) error {
	if ttl < time.Second {
		ttl = 0
	}
	return r.c.Set(ctx, key, value, ttl.Truncate(time.Second)).Err()
}

// Del is DEL key: the number of keys removed.
func (r *Redis) Del(ctx context.Context, key string) (int64, error) {
	return r.c.Del(ctx, key).Result()
}
