// Package stallwatch watches an allocator's batch in hand for a stall.
//
// Liveness is progress, not a heartbeat: an allocator that holds its
// partition but cannot commit (its route to MySQL is gone, MySQL answers
// "too many connections", every transaction hangs) keeps the partition's
// requests pending while healthy peers stand by. So an allocator that has
// not committed for StallTimeout while requests of its partition wait (a
// batch in hand, or messages pending on the consumer) gives the partition
// up: it aborts the attempt in flight, stops pulling, unpins the partition
// and tells the membership, so that the partition's preferred owner becomes
// another process. While given up it tries a transaction every probeEvery;
// the first that commits ends the stall, and the allocator takes part again
// as any member does.
//
// Exactly-once does not rest on any of this: every transaction locks the
// partition's fence row first and applies only what lies past it, so an
// old owner whose transaction still reaches MySQL later either held the
// fence lock all along (the peer waited for it) or finds the fence moved
// and applies nothing. A session cut off while it holds the fence lock is
// ended by MySQL itself (allocator.Config.SessionDSN's wait_timeout). The whole story
// is in docs/allocator-liveness.md.
package stallwatch

import (
	"context"
	"database/sql"
	"time"
)

// Probe tries one transaction on db within timeout: nil once one commits.
func Probe(ctx context.Context, db *sql.DB, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	var one int
	if err := tx.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		tx.Rollback() //nolint:errcheck // the connection is gone or the probe failed
		return err
	}
	return tx.Commit()
}

// Watched is what a watch looks at, and whom it tells.
type Watched struct {
	// Timeout is how long without a commit makes a stall.
	Timeout time.Duration
	// LastCommit is when a transaction last committed (UnixNano).
	LastCommit func() int64
	// Waiting reports whether requests of the partition wait.
	Waiting func(ctx context.Context) bool
	// Idle is told each time the timeout passed with nothing waiting.
	Idle func()
	// Stalled is told once, with how long nothing committed; the watch
	// ends then.
	Stalled func(since time.Duration)
}

// Watch watches from now on, in a goroutine of its own, until ctx ends,
// w.Stalled is told, or the returned stop is called; stop joins it.
func Watch(ctx context.Context, w Watched) (stop func()) {
	start := time.Now().UnixNano()
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(w.Timeout)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			since := time.Unix(0, max(start, w.LastCommit()))
			if left := w.Timeout - time.Since(since); left > 0 {
				t.Reset(left)
				continue
			}
			if w.Waiting(ctx) {
				w.Stalled(time.Since(since))
				return
			}
			w.Idle()
			t.Reset(min(w.Timeout, time.Second))
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}
