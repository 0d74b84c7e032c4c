package allocator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/waitlist"
	"github.com/allot-dev/allot/internal/wire"
)

// TestReadsMatchAFullCount: after random mixes of joins, cancels (of
// waiters from anywhere in the line, and of seats, which promote), claims,
// resizes up (promoting hundreds at once) and down, confirms and expiries
// of holds, applied in batches, every activity's waiting counter equals a
// COUNT(*) of its WAITING rows and every waiter's position read from the
// waitlist buckets equals the full count of the line ahead; the invariants
// (buckets included) hold. The line grows past several buckets.
func TestReadsMatchAFullCount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(conf(func(k *Config) { k.BatchSize = 300 }), TestHooks{BucketSize: 16})
	ctx := context.Background()
	const users = 1500
	acts := map[int64]time.Duration{1: 0, 2: time.Hour} // activity → hold
	var last uint64
	for a, hold := range acts {
		last = max(last, e.publish(openHold(a, 20, hold), ""))
	}
	capacity := map[int64]int64{1: 20, 2: 20}
	r := rand.New(rand.NewPCG(19, 5))
	pos := waitlist.NewPositions(e.db.DB) // warm across rounds, as ingest's
	for round := range 4 {
		for range 1500 {
			a := int64(1 + r.IntN(2))
			u := int64(1 + r.IntN(users))
			var q wire.Request
			switch k := r.IntN(100); {
			case k < 55:
				q = req(wire.OpJoin, a, u)
			case k < 80:
				q = req(wire.OpCancel, a, u)
			case k < 88:
				q = req(wire.OpClaim, a, u)
			case k < 97:
				q = req(wire.OpConfirm, a, u)
			case k < 98:
				capacity[a] += int64(r.IntN(40))
				q = openHold(a, capacity[a], acts[a])
			default:
				q = openHold(a, max(1, capacity[a]-int64(r.IntN(5))), acts[a]) // below the seats taken: rejected
			}
			last = max(last, e.publish(q, ""))
		}
		e.waitFence(last)
		// Expire some holds, as their schedules would.
		rows, err := e.db.QueryContext(ctx, "SELECT user_id, hold_seq, held_until FROM activity_signup WHERE activity_id = 2 AND status = 'HELD' LIMIT 40")
		if err != nil {
			t.Fatal(err)
		}
		var expires []wire.Request
		for rows.Next() {
			var (
				u     int64
				seq   uint64
				until time.Time
			)
			if err := rows.Scan(&u, &seq, &until); err != nil {
				t.Fatal(err)
			}
			expires = append(expires, wire.ExpireRequest(2, u, seq, until))
		}
		rows.Close()
		for _, x := range expires {
			last = max(last, e.publish(x, ""))
		}
		e.waitFence(last)
		compareReads(t, e, pos, round, []int64{1, 2})
		t.Logf("round %d: %d and %d waiting, %d buckets", round,
			e.db.Count(t, "SELECT waiting_count FROM activity WHERE id = 1"), e.db.Count(t, "SELECT waiting_count FROM activity WHERE id = 2"),
			e.db.Count(t, "SELECT COUNT(*) FROM waitlist_bucket"))
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM waitlist_bucket WHERE activity_id = 1"); n < 4 {
		t.Fatalf("activity 1's line spans %d bucket(s); the test wants several", n)
	}
	e.db.CheckInvariants(t)
}

// compareReads checks the counters and every waiter's position, read
// uncached and through pos, against full counts.
func compareReads(t *testing.T, e *env, pos *waitlist.Positions, round int, acts []int64) {
	t.Helper()
	ctx := context.Background()
	for _, a := range acts {
		st, ok, err := store.GetActivity(ctx, e.db, a)
		if err != nil || !ok {
			t.Fatalf("round %d: activity %d: found %v, err %v", round, a, ok, err)
		}
		if want := e.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND status = 'WAITING'", a); st.Waiting != want {
			t.Fatalf("round %d: activity %d reads waiting %d, COUNT(*) says %d", round, a, st.Waiting, want)
		}
		if want := e.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND status = 'HELD'", a); st.Held != want {
			t.Fatalf("round %d: activity %d reads held %d, COUNT(*) says %d", round, a, st.Held, want)
		}
		rows, err := e.db.QueryContext(ctx, "SELECT user_id FROM activity_signup WHERE activity_id = ? ORDER BY queue_seq", a)
		if err != nil {
			t.Fatal(err)
		}
		var us []int64
		for rows.Next() {
			var u int64
			if err := rows.Scan(&u); err != nil {
				t.Fatal(err)
			}
			us = append(us, u)
		}
		rows.Close()
		waiting := int64(0)
		for _, u := range us {
			got, ok, err := store.GetSignup(ctx, e.db, a, u)
			if err != nil || !ok {
				t.Fatalf("round %d: signup %d/%d: found %v, err %v", round, a, u, ok, err)
			}
			cached, ok, err := pos.Get(ctx, a, u)
			if err != nil || !ok {
				t.Fatalf("round %d: cached signup %d/%d: found %v, err %v", round, a, u, ok, err)
			}
			want, _, err := store.GetSignupByCount(ctx, e.db, a, u)
			if err != nil {
				t.Fatal(err)
			}
			for _, got := range []store.SignupState{got, cached} {
				if got.Status != want.Status || (got.Position == nil) != (want.Position == nil) || got.Position != nil && *got.Position != *want.Position {
					t.Fatalf("round %d: signup %d/%d reads %s at %v, the full count says %s at %v", round, a, u,
						got.Status, deref(got.Position), want.Status, deref(want.Position))
				}
			}
			if got.Status == wire.StatusWaiting {
				waiting++
				if *got.Position != waiting {
					t.Fatalf("round %d: signup %d/%d at position %d, but %d waiters are ahead in queue_seq order", round, a, u, *got.Position, waiting-1)
				}
			}
		}
	}
}

// TestWaitlistBucketsRepairedOnLoad: buckets that do not describe the
// signups (a tampered row) are reported by the invariants and rebuilt by an
// allocator that loads the activity, in the transaction of its next batch.
func TestWaitlistBucketsRepairedOnLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.start(conf(nil), TestHooks{BucketSize: 4})
	e.line(1, 30)
	a.Stop()
	if _, err := e.db.ExecContext(context.Background(), "UPDATE waitlist_bucket SET waiting = waiting + 1 WHERE activity_id = 1 ORDER BY first_seq LIMIT 1"); err != nil {
		t.Fatal(err)
	}
	if n := e.db.Count(t, "SELECT SUM(waiting) - (SELECT COUNT(*) FROM activity_signup WHERE activity_id = 1 AND status = 'WAITING') FROM waitlist_bucket WHERE activity_id = 1"); n != 1 {
		t.Fatalf("the tampered bucket is not off: %d", n)
	}
	e.start(conf(nil), TestHooks{BucketSize: 4})
	e.waitFence(e.publish(req(wire.OpCancel, 1, 5), ""))
	e.db.CheckInvariants(t)
	compareReads(t, e, waitlist.NewPositions(e.db.DB), 0, []int64{1})
}

// TestCachedPositionsFollowTheLine: positions read through a warm
// waitlist.Positions stay exact when joins start buckets the cache has not
// seen (joins do not move waitlist_version: no position ahead changes),
// and a waiter leaving from ahead, once its result is recorded, is seen by
// the next read (the version moved with it).
func TestCachedPositionsFollowTheLine(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(conf(nil), TestHooks{BucketSize: 4})
	ctx := context.Background()
	last := e.line(1, 40)
	pos := waitlist.NewPositions(e.db.DB)
	compareReads(t, e, pos, 0, []int64{1})
	version := func() int64 { return e.db.Count(t, "SELECT waitlist_version FROM activity WHERE id = 1") }
	v0 := version()

	for u := int64(41); u <= 70; u++ {
		last = e.publish(req(wire.OpJoin, 1, u), "")
	}
	e.waitFence(last)
	if v := version(); v != v0 {
		t.Fatalf("joins moved waitlist_version from %d to %d", v0, v)
	}
	compareReads(t, e, pos, 1, []int64{1})

	read := func(u int64) store.SignupState {
		t.Helper()
		s, ok, err := pos.Get(ctx, 1, u)
		if err != nil || !ok {
			t.Fatalf("signup 1/%d: found %v, err %v", u, ok, err)
		}
		return s
	}
	before := *read(70).Position
	e.waitFence(e.publish(req(wire.OpCancel, 1, 3), "")) // a waiter ahead leaves
	if v := version(); v <= v0 {
		t.Fatalf("a waiter left and waitlist_version stayed at %d", v)
	}
	if got := *read(70).Position; got != before-1 {
		t.Fatalf("user 70 reads position %d after a waiter ahead left, was %d", got, before)
	}
	e.waitFence(e.publish(req(wire.OpCancel, 1, 1), "")) // the seat's holder: user 2 is promoted
	if s := read(2); s.Status != wire.StatusConfirmed {
		t.Fatalf("user 2 reads %s after its promotion was recorded", s.Status)
	}
	if got := *read(70).Position; got != before-2 {
		t.Fatalf("user 70 reads position %d after two left ahead, was %d", got, before)
	}
	compareReads(t, e, pos, 2, []int64{1})
	e.db.CheckInvariants(t)
}

// TestCachedPositionsNeverGoBack: readers polling through one warm
// waitlist.Positions while waiters leave from the front and others join
// behind never see a waiter's position rise (a stale prefix would), and
// after the last result every position is exact.
func TestCachedPositionsNeverGoBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(conf(nil), TestHooks{BucketSize: 8})
	ctx := context.Background()
	last := e.line(1, 200)
	pos := waitlist.NewPositions(e.db.DB)
	watched := []int64{100, 150, 199, 200}
	stop := make(chan struct{})
	errs := make(chan error, len(watched))
	for _, u := range watched {
		go func() {
			prev := int64(1 << 62)
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				s, ok, err := pos.Get(ctx, 1, u)
				if err != nil || !ok || s.Position == nil {
					errs <- fmt.Errorf("signup 1/%d: found %v, err %v, %+v", u, ok, err, s)
					return
				}
				if *s.Position > prev {
					errs <- fmt.Errorf("user %d read position %d after %d", u, *s.Position, prev)
					return
				}
				prev = *s.Position
			}
		}()
	}
	for u := int64(2); u <= 60; u++ {
		e.publish(req(wire.OpCancel, 1, u), "")
		last = e.publish(req(wire.OpJoin, 1, 1000+u), "")
		if u%10 == 0 {
			e.waitFence(last)
		}
	}
	e.waitFence(last)
	close(stop)
	for range watched {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	compareReads(t, e, pos, 0, []int64{1})
	e.db.CheckInvariants(t)
}

// TestCachedPositionsAfterAVersionWrittenLower: a waitlist_version written
// lower by hand, seen by one read, drops what was cached at the versions
// above it, so when departures bring the version back up no position
// cached then is answered again.
func TestCachedPositionsAfterAVersionWrittenLower(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(conf(nil), TestHooks{BucketSize: 4})
	ctx := context.Background()
	e.line(1, 30)
	e.waitFence(e.publish(req(wire.OpCancel, 1, 10), "")) // the version is 1 or more
	pos := waitlist.NewPositions(e.db.DB)
	compareReads(t, e, pos, 0, []int64{1})
	if _, err := e.db.ExecContext(ctx, "UPDATE activity SET waitlist_version = waitlist_version - 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := pos.Get(ctx, 1, 30); err != nil {
		t.Fatal(err)
	}
	e.waitFence(e.publish(req(wire.OpCancel, 1, 3), "")) // back to the version the cache saw
	compareReads(t, e, pos, 1, []int64{1})
}

// line opens activity with one seat, has users 1..n join it (user 1 takes
// the seat, the rest wait in order) and waits until all are applied. It
// returns the last join's sequence.
func (e *env) line(activity, n int64) uint64 {
	e.t.Helper()
	last := e.publish(open(activity, 1), "")
	for u := int64(1); u <= n; u++ {
		last = e.publish(req(wire.OpJoin, activity, u), "")
	}
	e.waitFence(last)
	return last
}
