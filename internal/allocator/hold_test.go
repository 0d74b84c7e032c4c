package allocator

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

func openHold(activity, cap int64, hold time.Duration) wire.Request {
	r := open(activity, cap)
	r.Hold = wire.Duration(hold)
	return r
}

// waitResult polls MySQL for id's result.
func (e *env) waitResult(id string, within time.Duration) wire.Result {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		r, ok, err := store.GetResult(context.Background(), e.db, id)
		if err != nil {
			e.t.Fatal(err)
		}
		if ok {
			return r
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no result for %s within %s", id, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHoldsExpireThroughTheStream: a hold nobody confirms lapses by an
// expire request that the broker's message scheduler stores when it is due
// and ALLOT_REQUESTS sources onto the activity's subject, on one partition
// and on several. The freed seat goes to the next waiter, held anew from
// the expire's received_at, whose hold lapses in turn; each expire is
// applied once, after the hold's end, in stream order.
func TestHoldsExpireThroughTheStream(t *testing.T) {
	t.Parallel()
	for _, partitions := range []int{1, 3} {
		t.Run(map[int]string{1: "one partition", 3: "three partitions"}[partitions], func(t *testing.T) {
			t.Parallel()
			e := &env{t: t, db: dbtest.New(t), ns: natstest.New(t), log: discardLog()}
			e.nc, e.js = e.ns.Connect(t)
			ctx := context.Background()
			if err := bus.EnsureStreams(ctx, e.js, natstest.Config(partitions)); err != nil {
				t.Fatal(err)
			}
			e.startProcess(partitions, conf(func(k *Config) { k.BatchSize = 50 }), Deps{})

			const act = 42
			const hold = time.Second
			e.publish(openHold(act, 1, hold), "")
			var joins []wire.Request
			var seqs []uint64
			for u := int64(1); u <= 3; u++ {
				r := req(wire.OpJoin, act, u)
				joins = append(joins, r)
				seqs = append(seqs, e.publish(r, ""))
			}
			first := e.waitResult(joins[0].RequestID, 20*time.Second)
			if first.Outcome != wire.OutcomeHeld || first.HeldUntil == nil {
				t.Fatalf("first join: %+v", first)
			}
			if want := joins[0].ReceivedAt.Add(hold).Truncate(time.Microsecond); !first.HeldUntil.Equal(want) {
				t.Fatalf("held_until %v, want received_at + hold = %v", first.HeldUntil, want)
			}

			// User 1's hold lapses, user 2 is held; then 2's, user 3 held;
			// then 3's, nobody left.
			holdAt := wire.Place(seqs[0], 0) // the place of the request that gave the hold
			heldUntil := *first.HeldUntil
			var lastSeq uint64
			for u := int64(1); u <= 3; u++ {
				id := wire.ExpireRequestID(act, u, holdAt)
				r := e.waitResult(id, 20*time.Second)
				if r.Op != wire.OpExpire || r.Outcome != wire.OutcomeExpired || r.UserID != u {
					t.Fatalf("expire of user %d: %+v", u, r)
				}
				if r.Seq <= lastSeq || r.PlaceOf() <= holdAt {
					t.Fatalf("expire of user %d at seq %d, after %d and hold %s", u, r.Seq, lastSeq, wire.FormatPlace(holdAt))
				}
				if r.AppliedAt.Before(heldUntil) {
					t.Fatalf("expire of user %d applied at %v, before its hold's end %v", u, r.AppliedAt, heldUntil)
				}
				lastSeq = r.Seq
				if u < 3 {
					if r.PromotedUserID == nil || *r.PromotedUserID != u+1 || r.HeldUntil == nil {
						t.Fatalf("expire of user %d promoted %v until %v, want user %d held", u, deref(r.PromotedUserID), r.HeldUntil, u+1)
					}
					want := wire.HoldDue(heldUntil).Add(hold).Truncate(time.Microsecond)
					if !r.HeldUntil.Equal(want) {
						t.Fatalf("user %d held until %v, want the expire's received_at + hold = %v", u+1, r.HeldUntil, want)
					}
					heldUntil = *r.HeldUntil
				} else if r.PromotedUserID != nil {
					t.Fatalf("last expire promoted %d", *r.PromotedUserID)
				}
				holdAt = r.PlaceOf()
			}
			s, ok, err := store.GetActivity(ctx, e.db, act)
			if err != nil || !ok || s.Confirmed != 0 || s.Held != 0 || s.Waiting != 0 || s.Remaining != 1 {
				t.Fatalf("activity after every hold lapsed: %+v %v %v", s, ok, err)
			}
			// Each expire is stored once: three expires, no more.
			if n := natstest.StreamMsgs(t, e.js, wire.RequestStream); n != 7 {
				t.Fatalf("request stream holds %d messages, want 7 (open, 3 joins, 3 expires)", n)
			}
			e.db.CheckInvariants(t)
		})
	}
}
