package allocator

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/store"
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
		compareReads(t, e, round, []int64{1, 2})
		t.Logf("round %d: %d and %d waiting, %d buckets", round,
			e.db.Count(t, "SELECT waiting_count FROM activity WHERE id = 1"), e.db.Count(t, "SELECT waiting_count FROM activity WHERE id = 2"),
			e.db.Count(t, "SELECT COUNT(*) FROM waitlist_bucket"))
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM waitlist_bucket WHERE activity_id = 1"); n < 4 {
		t.Fatalf("activity 1's line spans %d bucket(s); the test wants several", n)
	}
	e.db.CheckInvariants(t)
}

// compareReads checks the counters and every waiter's position against
// full counts.
func compareReads(t *testing.T, e *env, round int, acts []int64) {
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
			want, _, err := store.GetSignupByCount(ctx, e.db, a, u)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != want.Status || (got.Position == nil) != (want.Position == nil) || got.Position != nil && *got.Position != *want.Position {
				t.Fatalf("round %d: signup %d/%d reads %s at %v, the full count says %s at %v", round, a, u,
					got.Status, deref(got.Position), want.Status, deref(want.Position))
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
	last := e.publish(open(1, 1), "")
	for u := int64(1); u <= 30; u++ {
		last = e.publish(req(wire.OpJoin, 1, u), "")
	}
	e.waitFence(last)
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
	compareReads(t, e, 0, []int64{1})
}
