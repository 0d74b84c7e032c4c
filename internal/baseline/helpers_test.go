package baseline

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/testenv"
)

// newDB returns a fresh test database with the seed tables, over a pool of
// conns connections.
func newDB(t testing.TB, conns int) (*dbtest.DB, *sql.DB) {
	t.Helper()
	d := dbtest.New(t)
	ctx := context.Background()
	db, err := store.Open(ctx, d.DSN, conns)
	if err != nil {
		t.Fatalf("open a pool of %d: %v", conns, err)
	}
	t.Cleanup(func() { db.Close() })
	if err := Migrate(ctx, db); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return d, db
}

// redisAddr is the Redis the gate tests use, skipping the test when it does
// not answer.
func redisAddr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv("ALLOT_TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := DialRedis(ctx, addr, 1)
	if err != nil {
		testenv.Missing(t, fmt.Sprintf("Redis does not answer at %s (start redis-server, or set ALLOT_TEST_REDIS_ADDR): %v", addr, err))
	}
	r.Close()
	return addr
}

func newRedis(t testing.TB) *Redis {
	t.Helper()
	addr := redisAddr(t)
	r, err := DialRedis(context.Background(), addr, DefaultRedisPool)
	if err != nil {
		t.Fatalf("dial redis: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
