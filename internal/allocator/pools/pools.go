// Package pools prepares the allocator's MySQL pools, one per shard: the
// session settings of their DSNs, and the migrations and idle limit each
// gets before any partition is applied.
package pools

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store/schema"
)

// SessionDSN is dsn with the server's wait_timeout set to idle (rounded up
// to a second), unless dsn sets one; idle ≤ 0 leaves dsn as it is.
func SessionDSN(dsn string, idle time.Duration) (string, error) {
	if idle <= 0 {
		return dsn, nil
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("parse mysql dsn: %w", err)
	}
	if _, set := cfg.Params["wait_timeout"]; set {
		return dsn, nil
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["wait_timeout"] = strconv.Itoa(int(math.Ceil(idle.Seconds())))
	return cfg.FormatDSN(), nil
}

// Prepare migrates every shard of ps, in name order, and, when idle > 0,
// has each pool drop a connection idle for idle before the server ends it
// (SessionDSN's wait_timeout is twice that), rather than find it dead. An
// error names the shard.
func Prepare(ctx context.Context, ps shards.Pools, idle time.Duration) error {
	for _, name := range ps.Names() {
		if err := schema.Migrate(ctx, ps[name]); err != nil {
			return fmt.Errorf("shard %s: %w", name, err)
		}
		if idle > 0 {
			ps[name].SetConnMaxIdleTime(idle)
		}
	}
	return nil
}
