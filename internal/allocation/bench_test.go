package allocation

import (
	"testing"

	"github.com/allot-dev/allot/internal/wire"
)

// BenchmarkApplyJoinHot joins distinct users into one activity of capacity
// 100: the first hundred take seats, the rest grow the waitlist.
func BenchmarkApplyJoinHot(b *testing.B) {
	if testing.Short() {
		b.Skip("benchmark skipped in -short mode")
	}
	a, _, err := Apply(nil, reqOpen(100), 1)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	seq := uint64(1)
	for i := 0; b.Loop(); i++ {
		seq++
		if _, _, err := Apply(a, reqJoin(int64(i)+1), seq); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if a.Confirmed != min(100, a.Confirmed+a.Waiting()) {
		b.Fatalf("confirmed %d waiting %d", a.Confirmed, a.Waiting())
	}
}

// BenchmarkApplyClaimBurst replays launch nights: each burst is a fresh
// activity of 100,000 items and 300,000 claims by 200,000 users (so some
// retry), which mixes GRANTED, SOLD_OUT and ALREADY_OWNED as a launch does.
func BenchmarkApplyClaimBurst(b *testing.B) {
	if testing.Short() {
		b.Skip("benchmark skipped in -short mode")
	}
	const burst, users, capacity = 300_000, 200_000, 100_000
	var a *Activity
	var seq uint64
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%burst == 0 {
			seq = 1
			var err error
			if a, _, err = Apply(nil, reqOpen(capacity), seq); err != nil {
				b.Fatal(err)
			}
		}
		seq++
		// A multiplicative walk spreads the users instead of claiming in id
		// order.
		u := int64(uint64(i)*7919%users) + 1
		if _, _, err := Apply(a, reqClaim(u), seq); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if a.Confirmed > capacity {
		b.Fatalf("oversold: %d", a.Confirmed)
	}
}

// BenchmarkCancelPromote cancels confirmed users of an activity with 1,000
// seats and a waitlist of 100,000: each cancel promotes the head. The
// cancelled user joins again at the tail (a second Apply in the same
// iteration), which keeps the waitlist at its size; one op is the pair.
func BenchmarkCancelPromote(b *testing.B) {
	if testing.Short() {
		b.Skip("benchmark skipped in -short mode")
	}
	const seats, waiters = 1_000, 100_000
	const users = seats + waiters
	a, _, err := Apply(nil, reqOpen(seats), 1)
	if err != nil {
		b.Fatal(err)
	}
	seq := uint64(1)
	for u := int64(1); u <= users; u++ {
		seq++
		if _, _, err := Apply(a, reqJoin(u), seq); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		// Seats pass round-robin through the users in queue order, so the
		// oldest confirmed user is always (i mod users) + 1.
		u := int64(i%users) + 1
		seq++
		_, d, err := Apply(a, reqCancel(u), seq)
		if err != nil || len(d.PromotedUserIDs) != 1 {
			b.Fatalf("cancel %d: %+v %v", u, d, err)
		}
		seq++
		if _, d, err = Apply(a, reqJoin(u), seq); err != nil || d.Outcome != wire.OutcomeWaiting {
			b.Fatalf("join %d: %+v %v", u, d, err)
		}
	}
	b.StopTimer()
	if a.Waiting() != waiters {
		b.Fatalf("waiting %d", a.Waiting())
	}
}

// BenchmarkCancelWaiterMiddle takes waiters off the middle of a waitlist of
// 100,000 and asks for a position, the operations a Fenwick tree makes
// O(log n); the user joins again at the tail in the same iteration.
func BenchmarkCancelWaiterMiddle(b *testing.B) {
	if testing.Short() {
		b.Skip("benchmark skipped in -short mode")
	}
	const waiters = 100_000
	a, _, err := Apply(nil, reqOpen(0), 1)
	if err != nil {
		b.Fatal(err)
	}
	seq := uint64(1)
	for u := int64(1); u <= waiters; u++ {
		seq++
		if _, _, err := Apply(a, reqJoin(u), seq); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		u := int64(uint64(i)*7919%waiters) + 1
		seq++
		if _, _, err := Apply(a, reqCancel(u), seq); err != nil {
			b.Fatal(err)
		}
		seq++
		if _, _, err := Apply(a, reqJoin(u), seq); err != nil {
			b.Fatal(err)
		}
		if a.Position(u) != waiters {
			b.Fatalf("re-joined user %d at %d", u, a.Position(u))
		}
	}
}
