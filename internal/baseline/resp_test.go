package baseline

import (
	"context"
	"errors"
	"sync"
	"testing"
)

func TestRedisCommands(t *testing.T) {
	r := newRedis(t)
	ctx := context.Background()
	key := NewGate(r, "").Key(1)
	t.Cleanup(func() { r.Del(context.Background(), key) }) //nolint:errcheck // best effort
	if err := r.Set(ctx, key, 3, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Decr(ctx, key); err != nil || n != 2 {
		t.Fatalf("DECR = %d, %v; want 2", n, err)
	}
	if n, err := r.Incr(ctx, key); err != nil || n != 3 {
		t.Fatalf("INCR = %d, %v; want 3", n, err)
	}
	if err := r.Set(ctx, key, -5, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Decr(ctx, key); err != nil || n != -6 {
		t.Fatalf("DECR of -5 = %d, %v; want -6", n, err)
	}
	if n, err := r.Del(ctx, key); err != nil || n != 1 {
		t.Fatalf("DEL = %d, %v; want 1", n, err)
	}
	if n, err := r.Decr(ctx, key); err != nil || n != -1 {
		t.Fatalf("DECR of a missing key = %d, %v; want -1", n, err)
	}
	// An error reply leaves the connection usable.
	if err := r.c.Set(ctx, key, "not-a-number", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var re RedisError
	if _, err := r.Decr(ctx, key); !errors.As(err, &re) {
		t.Fatalf("DECR of a string: err = %v, want a RedisError", err)
	}
	if err := r.Ping(ctx); err != nil {
		t.Fatalf("PING after an error reply: %v", err)
	}
}

func TestRedisConcurrentDecr(t *testing.T) {
	// 50 goroutines share a pool of 4: they wait for a connection.
	r, err := DialRedis(context.Background(), redisAddr(t), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() }) // after the DEL below: cleanups run last-in first-out
	ctx := context.Background()
	key := NewGate(r, "").Key(2)
	t.Cleanup(func() { r.Del(context.Background(), key) }) //nolint:errcheck // best effort
	if err := r.Set(ctx, key, 1000, 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	seen := make([]bool, 1000)
	var mu sync.Mutex
	for range 50 {
		wg.Go(func() {
			for range 20 {
				n, err := r.Decr(ctx, key)
				if err != nil || n < 0 || n >= 1000 {
					t.Errorf("DECR = %d, %v", n, err)
					return
				}
				mu.Lock()
				if seen[n] {
					t.Errorf("value %d seen twice: replies crossed connections", n)
				}
				seen[n] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if open := r.c.PoolStats().TotalConns; open > 4 {
		t.Errorf("%d connections open, want at most the pool size 4", open)
	}
}
