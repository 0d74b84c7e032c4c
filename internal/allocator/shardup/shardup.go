// Package shardup migrates the allocator's shards, each on its own, and
// says when each may be used: a shard that does not answer at start is
// tried again in the background, with bounded backoff, and migrated once
// it answers; only then do its partitions start. The other shards' are not
// held up by it.
package shardup

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/schema"
)

// Backoff bounds the wait between two tries of a shard that does not
// answer: it starts at Backoff.Min and doubles up to Backoff.Max.
var Backoff = struct{ Min, Max time.Duration }{500 * time.Millisecond, 10 * time.Second}

// Shards are the shards' pools and which of them are migrated.
type Shards struct {
	// Tried, when set, runs after each try of a shard that did not
	// answer (for tests).
	Tried func(shard string)

	pools shards.Pools
	log   *slog.Logger
	ready map[string]chan struct{} // closed once the shard is migrated
}

// New prepares ps (none is tried before Run). idle > 0 has each pool drop
// a connection idle for idle before the server ends it (the session's
// wait_timeout is twice that: allocator.Config.SessionDSN), rather than
// find it dead.
func New(ps shards.Pools, idle time.Duration, log *slog.Logger) *Shards {
	s := &Shards{pools: ps, log: log, ready: make(map[string]chan struct{}, len(ps))}
	for name, db := range ps {
		s.ready[name] = make(chan struct{})
		if idle > 0 {
			db.SetConnMaxIdleTime(idle)
		}
	}
	return s
}

// Ready is closed once shard name is migrated; nil for a name ps does not
// hold.
func (s *Shards) Ready(name string) <-chan struct{} {
	if ch, ok := s.ready[name]; ok {
		return ch
	}
	return nil
}

// Run migrates every shard at once, each as soon as it answers, then waits
// for ctx to end (nil). A shard that does not answer is tried again with
// backoff, one log line when it is found down and one when it is migrated.
// A shard that answers but whose migration fails stops Run with that error,
// naming the shard: a schema the allocator cannot bring up to date is no
// outage to wait out.
func (s *Shards) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, len(s.pools))
	var wg sync.WaitGroup
	for name, db := range s.pools {
		wg.Go(func() {
			if err := s.bring(ctx, name, db); err != nil {
				failed <- err
			}
		})
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-failed:
	}
	cancel() // the shards still tried stop
	wg.Wait()
	return err
}

// bring migrates shard name once it answers, trying until ctx ends (nil),
// and closes its Ready channel.
func (s *Shards) bring(ctx context.Context, name string, db *sql.DB) error {
	backoff, since := Backoff.Min, time.Time{}
	for tries := 1; ; tries++ {
		down, err := Migrate(ctx, db)
		if err == nil {
			if !since.IsZero() {
				s.log.InfoContext(ctx, "MySQL shard answers again: migrated; its partitions start", slog.String("shard", name),
					slog.Int("tries", tries), slog.Duration("down_for", time.Since(since).Round(time.Millisecond)))
			}
			close(s.ready[name])
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		if !down {
			return fmt.Errorf("shard %s: %w", name, err)
		}
		if since.IsZero() {
			since = time.Now()
			s.log.WarnContext(ctx, "MySQL shard does not answer: its partitions wait for it, the others go on; trying it again in the background",
				slog.String("shard", name), slog.Any("err", err))
		}
		if s.Tried != nil {
			s.Tried(name)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, Backoff.Max)
	}
}

// Migrate checks that db's server answers (store.Check, which notes its
// max_allowed_packet) and applies the migrations. down says that the
// server did not answer, before or during the migration; any other error
// is one of a server that answers.
func Migrate(ctx context.Context, db *sql.DB) (down bool, err error) {
	err = store.Check(ctx, db)
	if err == nil {
		err = schema.Migrate(ctx, db)
	}
	if err == nil || ctx.Err() != nil {
		return false, err
	}
	return !Answers(ctx, db), err
}

// Answers reports whether db's server answers a ping within 5s; a server
// that answers with an error (access denied, no such database) answers.
func Answers(ctx context.Context, db *sql.DB) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := db.PingContext(ctx)
	_, isMySQL := errors.AsType[*mysql.MySQLError](err)
	return err == nil || isMySQL
}
