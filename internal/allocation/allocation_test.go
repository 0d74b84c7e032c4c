package allocation

import (
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

const act = 7

func reqOpen(capacity int64) Request {
	return Request{Op: wire.OpOpen, ActivityID: act, Capacity: capacity}
}
func reqJoin(user int64) Request   { return Request{Op: wire.OpJoin, ActivityID: act, UserID: user} }
func reqCancel(user int64) Request { return Request{Op: wire.OpCancel, ActivityID: act, UserID: user} }
func reqClaim(user int64) Request  { return Request{Op: wire.OpClaim, ActivityID: act, UserID: user} }

func ev(kind wire.EventKind, user int64) Event { return Event{Kind: kind, UserID: user} }
func conf(user int64, seq uint64) Signup {
	return Signup{UserID: user, Status: wire.StatusConfirmed, QueueSeq: seq}
}
func wait(user int64, seq uint64) Signup {
	return Signup{UserID: user, Status: wire.StatusWaiting, QueueSeq: seq}
}
func canc(user int64, seq uint64) Signup {
	return Signup{UserID: user, Status: wire.StatusCancelled, QueueSeq: seq}
}

// applyAll applies reqs at seq 1, 2, ... and fails the test on any error.
func applyAll(t testing.TB, reqs []Request) *Activity {
	t.Helper()
	var a *Activity
	for i, r := range reqs {
		var err error
		a, _, err = Apply(a, r, uint64(i+1))
		if err != nil {
			t.Fatalf("setup step %d %+v: %v", i+1, r, err)
		}
	}
	return a
}

func mustCheck(t testing.TB, a *Activity) {
	t.Helper()
	if err := a.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

func TestApply(t *testing.T) {
	const (
		A, B, C, D = 1, 2, 3, 4
	)
	tests := []struct {
		name  string
		setup []Request // applied at seq 1..len(setup)
		req   Request   // applied at seq len(setup)+1
		want  Decision
		// wantLive, when non-nil, is the activity's Live() afterwards.
		wantLive []Signup
		// wantPos, when non-nil, maps users to their Position afterwards.
		wantPos map[int64]int64
	}{
		{
			name: "join on missing activity",
			req:  reqJoin(A),
			want: Decision{Outcome: wire.OutcomeNoSuchActivity},
		},
		{
			name: "cancel on missing activity",
			req:  reqCancel(A),
			want: Decision{Outcome: wire.OutcomeNoSuchActivity},
		},
		{
			name: "claim on missing activity",
			req:  reqClaim(A),
			want: Decision{Outcome: wire.OutcomeNoSuchActivity},
		},
		{
			name: "open creates",
			req:  reqOpen(3),
			want: Decision{Outcome: wire.OutcomeOpened, Events: []Event{ev(wire.EventOpened, 0)}, Changes: true},
		},
		{
			name:  "open with unchanged capacity is an idempotent resize",
			setup: []Request{reqOpen(3), reqJoin(A)},
			req:   reqOpen(3),
			want:  Decision{Outcome: wire.OutcomeResized},
		},
		{
			name:     "resize below confirmed is rejected",
			setup:    []Request{reqOpen(3), reqJoin(A), reqJoin(B)},
			req:      reqOpen(1),
			want:     Decision{Outcome: wire.OutcomeRejected},
			wantLive: []Signup{conf(A, 2), conf(B, 3)},
		},
		{
			name:  "resize down to confirmed",
			setup: []Request{reqOpen(3), reqJoin(A), reqJoin(B)},
			req:   reqOpen(2),
			want:  Decision{Outcome: wire.OutcomeResized, Events: []Event{ev(wire.EventResized, 0)}, Changes: true},
		},
		{
			name:  "resize up without waiters",
			setup: []Request{reqOpen(1), reqJoin(A)},
			req:   reqOpen(5),
			want:  Decision{Outcome: wire.OutcomeResized, Events: []Event{ev(wire.EventResized, 0)}, Changes: true},
		},
		{
			name:  "resize up promotes several in queue order then sold out",
			setup: []Request{reqOpen(1), reqJoin(A), reqJoin(B), reqJoin(C), reqJoin(D)},
			req:   reqOpen(3),
			want: Decision{
				Outcome:         wire.OutcomeResized,
				PromotedUserIDs: []int64{B, C},
				Events: []Event{
					ev(wire.EventResized, 0), ev(wire.EventPromoted, B), ev(wire.EventPromoted, C), ev(wire.EventSoldOut, 0),
				},
				Changed: []Signup{conf(B, 3), conf(C, 4)},
				Changes: true,
			},
			wantLive: []Signup{conf(A, 2), conf(B, 3), conf(C, 4), wait(D, 5)},
			wantPos:  map[int64]int64{D: 1, A: 0},
		},
		{
			name:  "resize up beyond the waitlist promotes all without sold out",
			setup: []Request{reqOpen(1), reqJoin(A), reqJoin(B), reqJoin(C)},
			req:   reqOpen(10),
			want: Decision{
				Outcome:         wire.OutcomeResized,
				PromotedUserIDs: []int64{B, C},
				Events:          []Event{ev(wire.EventResized, 0), ev(wire.EventPromoted, B), ev(wire.EventPromoted, C)},
				Changed:         []Signup{conf(B, 3), conf(C, 4)},
				Changes:         true,
			},
		},
		{
			name:  "resize up from zero capacity",
			setup: []Request{reqOpen(0), reqJoin(A)},
			req:   reqOpen(1),
			want: Decision{
				Outcome:         wire.OutcomeResized,
				PromotedUserIDs: []int64{A},
				Events:          []Event{ev(wire.EventResized, 0), ev(wire.EventPromoted, A), ev(wire.EventSoldOut, 0)},
				Changed:         []Signup{conf(A, 2)},
				Changes:         true,
			},
		},
		{
			name:  "join takes a free seat",
			setup: []Request{reqOpen(2)},
			req:   reqJoin(A),
			want: Decision{
				Outcome: wire.OutcomeConfirmed, Status: wire.StatusConfirmed,
				Events:  []Event{ev(wire.EventConfirmed, A)},
				Changed: []Signup{conf(A, 2)},
				Changes: true,
			},
		},
		{
			name:  "join takes the last seat",
			setup: []Request{reqOpen(2), reqJoin(A)},
			req:   reqJoin(B),
			want: Decision{
				Outcome: wire.OutcomeConfirmed, Status: wire.StatusConfirmed,
				Events:  []Event{ev(wire.EventConfirmed, B), ev(wire.EventSoldOut, 0)},
				Changed: []Signup{conf(B, 3)},
				Changes: true,
			},
		},
		{
			name:  "join when full waits at the tail",
			setup: []Request{reqOpen(1), reqJoin(A), reqJoin(B)},
			req:   reqJoin(C),
			want: Decision{
				Outcome: wire.OutcomeWaiting, Status: wire.StatusWaiting, Position: 2,
				Events:  []Event{ev(wire.EventWaitlisted, C)},
				Changed: []Signup{wait(C, 4)},
				Changes: true,
			},
		},
		{
			name:  "join with zero capacity waits",
			setup: []Request{reqOpen(0)},
			req:   reqJoin(A),
			want: Decision{
				Outcome: wire.OutcomeWaiting, Status: wire.StatusWaiting, Position: 1,
				Events:  []Event{ev(wire.EventWaitlisted, A)},
				Changed: []Signup{wait(A, 2)},
				Changes: true,
			},
		},
		{
			name:  "duplicate join of a confirmed user",
			setup: []Request{reqOpen(1), reqJoin(A)},
			req:   reqJoin(A),
			want:  Decision{Outcome: wire.OutcomeAlreadyConfirmed, Status: wire.StatusConfirmed},
		},
		{
			name:  "duplicate join of a waiting user reports the current position",
			setup: []Request{reqOpen(1), reqJoin(A), reqJoin(B), reqJoin(C), reqCancel(B)},
			req:   reqJoin(C),
			want:  Decision{Outcome: wire.OutcomeAlreadyWaiting, Status: wire.StatusWaiting, Position: 1},
		},
		{
			name:  "cancel of a confirmed user promotes the head",
			setup: []Request{reqOpen(1), reqJoin(A), reqJoin(B), reqJoin(C)},
			req:   reqCancel(A),
			want: Decision{
				Outcome: wire.OutcomeCancelled, Status: wire.StatusCancelled,
				PromotedUserIDs: []int64{B},
				Events:          []Event{ev(wire.EventCancelled, A), ev(wire.EventPromoted, B)},
				Changed:         []Signup{canc(A, 2), conf(B, 3)},
				Changes:         true,
			},
			wantLive: []Signup{conf(B, 3), wait(C, 4)},
			wantPos:  map[int64]int64{C: 1},
		},
		{
			name:  "cancel of a confirmed user without waiters frees the seat",
			setup: []Request{reqOpen(2), reqJoin(A), reqJoin(B)},
			req:   reqCancel(A),
			want: Decision{
				Outcome: wire.OutcomeCancelled, Status: wire.StatusCancelled,
				Events:  []Event{ev(wire.EventCancelled, A)},
				Changed: []Signup{canc(A, 2)},
				Changes: true,
			},
			wantLive: []Signup{conf(B, 3)},
		},
		{
			name:  "cancel of a waiter from the middle shifts later positions",
			setup: []Request{reqOpen(1), reqJoin(A), reqJoin(B), reqJoin(C), reqJoin(D)},
			req:   reqCancel(C),
			want: Decision{
				Outcome: wire.OutcomeCancelled, Status: wire.StatusCancelled,
				Events:  []Event{ev(wire.EventCancelled, C)},
				Changed: []Signup{canc(C, 4)},
				Changes: true,
			},
			wantLive: []Signup{conf(A, 2), wait(B, 3), wait(D, 5)},
			wantPos:  map[int64]int64{A: 0, B: 1, C: 0, D: 2},
		},
		{
			name:  "cancel without a signup",
			setup: []Request{reqOpen(1), reqJoin(A)},
			req:   reqCancel(B),
			want:  Decision{Outcome: wire.OutcomeNotSignedUp},
		},
		{
			name:  "cancel twice",
			setup: []Request{reqOpen(1), reqJoin(A), reqCancel(A)},
			req:   reqCancel(A),
			want:  Decision{Outcome: wire.OutcomeNotSignedUp},
		},
		{
			name:  "claim granted",
			setup: []Request{reqOpen(2)},
			req:   reqClaim(A),
			want: Decision{
				Outcome: wire.OutcomeGranted, Status: wire.StatusConfirmed,
				Events:  []Event{ev(wire.EventGranted, A)},
				Changed: []Signup{conf(A, 2)},
				Changes: true,
			},
		},
		{
			name:  "claim granted the last seat",
			setup: []Request{reqOpen(2), reqClaim(A)},
			req:   reqClaim(B),
			want: Decision{
				Outcome: wire.OutcomeGranted, Status: wire.StatusConfirmed,
				Events:  []Event{ev(wire.EventGranted, B), ev(wire.EventSoldOut, 0)},
				Changed: []Signup{conf(B, 3)},
				Changes: true,
			},
		},
		{
			name:     "claim sold out",
			setup:    []Request{reqOpen(1), reqClaim(A)},
			req:      reqClaim(B),
			want:     Decision{Outcome: wire.OutcomeSoldOut},
			wantLive: []Signup{conf(A, 2)},
		},
		{
			name:  "claim with zero capacity is sold out",
			setup: []Request{reqOpen(0)},
			req:   reqClaim(A),
			want:  Decision{Outcome: wire.OutcomeSoldOut},
		},
		{
			name:  "claim already owned",
			setup: []Request{reqOpen(1), reqClaim(A)},
			req:   reqClaim(A),
			want:  Decision{Outcome: wire.OutcomeAlreadyOwned, Status: wire.StatusConfirmed},
		},
		{
			name:  "claim by a joined user is already owned",
			setup: []Request{reqOpen(1), reqJoin(A)},
			req:   reqClaim(A),
			want:  Decision{Outcome: wire.OutcomeAlreadyOwned, Status: wire.StatusConfirmed},
		},
		{
			name:     "claim by a waiter keeps the place in the queue",
			setup:    []Request{reqOpen(1), reqJoin(A), reqJoin(B), reqJoin(C)},
			req:      reqClaim(C),
			want:     Decision{Outcome: wire.OutcomeAlreadyWaiting, Status: wire.StatusWaiting, Position: 2},
			wantLive: []Signup{conf(A, 2), wait(B, 3), wait(C, 4)},
			wantPos:  map[int64]int64{B: 1, C: 2},
		},
		{
			name:  "join by a claimer is already confirmed",
			setup: []Request{reqOpen(1), reqClaim(A)},
			req:   reqJoin(A),
			want:  Decision{Outcome: wire.OutcomeAlreadyConfirmed, Status: wire.StatusConfirmed},
		},
		{
			name:  "re-join after cancel goes to the tail with a new queue_seq",
			setup: []Request{reqOpen(1), reqJoin(A), reqJoin(B), reqJoin(C), reqCancel(B)},
			req:   reqJoin(B),
			want: Decision{
				Outcome: wire.OutcomeWaiting, Status: wire.StatusWaiting, Position: 2,
				Events:  []Event{ev(wire.EventWaitlisted, B)},
				Changed: []Signup{wait(B, 6)},
				Changes: true,
			},
			wantLive: []Signup{conf(A, 2), wait(C, 4), wait(B, 6)},
			wantPos:  map[int64]int64{C: 1, B: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := applyAll(t, tt.setup)
			seq := uint64(len(tt.setup) + 1)
			got, d, err := Apply(a, tt.req, seq)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if !reflect.DeepEqual(d, tt.want) {
				t.Fatalf("decision:\n got  %+v\n want %+v", d, tt.want)
			}
			if got == nil {
				if tt.want.Outcome != wire.OutcomeNoSuchActivity {
					t.Fatalf("activity is nil after %s", tt.want.Outcome)
				}
				return
			}
			if got.NextSeq != seq+1 {
				t.Errorf("NextSeq = %d, want %d", got.NextSeq, seq+1)
			}
			mustCheck(t, got)
			if tt.wantLive != nil && !reflect.DeepEqual(got.Live(), tt.wantLive) {
				t.Errorf("Live:\n got  %+v\n want %+v", got.Live(), tt.wantLive)
			}
			for u, want := range tt.wantPos {
				if p := got.Position(u); p != want {
					t.Errorf("Position(%d) = %d, want %d", u, p, want)
				}
			}
		})
	}
}

// step is one request of a story, the decision it must get and, when set,
// the live signups after it.
type step struct {
	name     string
	req      Request
	want     Decision
	wantLive []Signup
}

// apply applies st to a as stream sequence seq and fails t unless the
// decision is st.want, the state passes mustCheck and, when st.wantLive is
// set, the live signups are st.wantLive. It returns the new state.
func (st step) apply(t testing.TB, a *Activity, seq uint64) *Activity {
	t.Helper()
	a, d, err := Apply(a, st.req, seq)
	if err != nil {
		t.Fatalf("%s: Apply: %v", st.name, err)
	}
	if !reflect.DeepEqual(d, st.want) {
		t.Fatalf("%s: decision:\n got  %+v\n want %+v", st.name, d, st.want)
	}
	mustCheck(t, a)
	if st.wantLive != nil && !reflect.DeepEqual(a.Live(), st.wantLive) {
		t.Fatalf("%s: Live:\n got  %+v\n want %+v", st.name, a.Live(), st.wantLive)
	}
	return a
}

// TestSeedStory walks the seed waitlist story step by step on one activity.
func TestSeedStory(t *testing.T) {
	const A, B, C = 1, 2, 3
	steps := []step{
		{
			name: "open capacity 1", req: reqOpen(1),
			want: Decision{Outcome: wire.OutcomeOpened, Events: []Event{ev(wire.EventOpened, 0)}, Changes: true},
		},
		{
			name: "A confirmed", req: reqJoin(A),
			want: Decision{
				Outcome: wire.OutcomeConfirmed, Status: wire.StatusConfirmed,
				Events:  []Event{ev(wire.EventConfirmed, A), ev(wire.EventSoldOut, 0)},
				Changed: []Signup{conf(A, 2)}, Changes: true,
			},
		},
		{
			name: "B waiting 1", req: reqJoin(B),
			want: Decision{
				Outcome: wire.OutcomeWaiting, Status: wire.StatusWaiting, Position: 1,
				Events: []Event{ev(wire.EventWaitlisted, B)}, Changed: []Signup{wait(B, 3)}, Changes: true,
			},
		},
		{
			name: "C waiting 2", req: reqJoin(C),
			want: Decision{
				Outcome: wire.OutcomeWaiting, Status: wire.StatusWaiting, Position: 2,
				Events: []Event{ev(wire.EventWaitlisted, C)}, Changed: []Signup{wait(C, 4)}, Changes: true,
			},
			wantLive: []Signup{conf(A, 2), wait(B, 3), wait(C, 4)},
		},
		{
			name: "duplicate join A", req: reqJoin(A),
			want: Decision{Outcome: wire.OutcomeAlreadyConfirmed, Status: wire.StatusConfirmed},
		},
		{
			name: "duplicate join C", req: reqJoin(C),
			want: Decision{Outcome: wire.OutcomeAlreadyWaiting, Status: wire.StatusWaiting, Position: 2},
		},
		{
			name: "cancel A promotes B", req: reqCancel(A),
			want: Decision{
				Outcome: wire.OutcomeCancelled, Status: wire.StatusCancelled, PromotedUserIDs: []int64{B},
				Events:  []Event{ev(wire.EventCancelled, A), ev(wire.EventPromoted, B)},
				Changed: []Signup{canc(A, 2), conf(B, 3)}, Changes: true,
			},
			wantLive: []Signup{conf(B, 3), wait(C, 4)},
		},
		{
			name: "duplicate cancel A", req: reqCancel(A),
			want: Decision{Outcome: wire.OutcomeNotSignedUp},
		},
		{
			name: "cancel B promotes C", req: reqCancel(B),
			want: Decision{
				Outcome: wire.OutcomeCancelled, Status: wire.StatusCancelled, PromotedUserIDs: []int64{C},
				Events:  []Event{ev(wire.EventCancelled, B), ev(wire.EventPromoted, C)},
				Changed: []Signup{canc(B, 3), conf(C, 4)}, Changes: true,
			},
			wantLive: []Signup{conf(C, 4)},
		},
		{
			name: "A re-joins at the tail", req: reqJoin(A),
			want: Decision{
				Outcome: wire.OutcomeWaiting, Status: wire.StatusWaiting, Position: 1,
				Events: []Event{ev(wire.EventWaitlisted, A)}, Changed: []Signup{wait(A, 10)}, Changes: true,
			},
			wantLive: []Signup{conf(C, 4), wait(A, 10)},
		},
		{
			name: "duplicate join A waiting", req: reqJoin(A),
			want: Decision{Outcome: wire.OutcomeAlreadyWaiting, Status: wire.StatusWaiting, Position: 1},
		},
		{
			name: "duplicate cancel B", req: reqCancel(B),
			want: Decision{Outcome: wire.OutcomeNotSignedUp},
		},
	}
	var a *Activity
	for i, st := range steps {
		a = st.apply(t, a, uint64(i+1))
	}
	if a.Capacity != 1 || a.Confirmed != 1 || a.Waiting() != 1 || a.NextSeq != uint64(len(steps)+1) {
		t.Fatalf("final counters: capacity %d confirmed %d waiting %d next seq %d", a.Capacity, a.Confirmed, a.Waiting(), a.NextSeq)
	}
}

func TestApplyInvalid(t *testing.T) {
	tests := []struct {
		name string
		req  Request
		seq  uint64 // the activity's NextSeq is 4
	}{
		{name: "unknown op", req: Request{Op: "resize", ActivityID: act}, seq: 10},
		{name: "empty op", req: Request{ActivityID: act, UserID: 1}, seq: 10},
		{name: "activity id zero", req: Request{Op: wire.OpJoin, UserID: 1}, seq: 10},
		{name: "negative activity id", req: Request{Op: wire.OpJoin, ActivityID: -1, UserID: 1}, seq: 10},
		{name: "other activity", req: Request{Op: wire.OpJoin, ActivityID: act + 1, UserID: 1}, seq: 10},
		{name: "join without user", req: reqJoin(0), seq: 10},
		{name: "cancel with negative user", req: reqCancel(-5), seq: 10},
		{name: "claim without user", req: reqClaim(0), seq: 10},
		{name: "open with user", req: Request{Op: wire.OpOpen, ActivityID: act, UserID: 1, Capacity: 3}, seq: 10},
		{name: "open with negative capacity", req: reqOpen(-1), seq: 10},
		{name: "open above max capacity", req: reqOpen(wire.MaxCapacity + 1), seq: 10},
		{name: "seq zero", req: reqJoin(9), seq: 0},
		{name: "seq max", req: reqJoin(9), seq: math.MaxUint64},
		{name: "seq replayed", req: reqJoin(9), seq: 3},
		{name: "seq from the past", req: reqJoin(9), seq: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := applyAll(t, []Request{reqOpen(1), reqJoin(1), reqJoin(2)})
			before := a.Clone()
			got, d, err := Apply(a, tt.req, tt.seq)
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("err = %v, want ErrInvalidRequest", err)
			}
			if got != a {
				t.Errorf("returned activity %p, want the one passed %p", got, a)
			}
			if !reflect.DeepEqual(d, Decision{}) {
				t.Errorf("decision = %+v, want zero", d)
			}
			if !reflect.DeepEqual(a, before) {
				t.Errorf("state changed:\n got  %+v\n want %+v", a, before)
			}
		})
	}
	t.Run("nil activity", func(t *testing.T) {
		got, _, err := Apply(nil, reqOpen(-1), 1)
		if !errors.Is(err, ErrInvalidRequest) || got != nil {
			t.Fatalf("got %v, %v; want nil, ErrInvalidRequest", got, err)
		}
	})
	t.Run("max capacity is valid", func(t *testing.T) {
		got, d, err := Apply(nil, reqOpen(wire.MaxCapacity), 1)
		if err != nil || d.Outcome != wire.OutcomeOpened || got.Capacity != wire.MaxCapacity {
			t.Fatalf("got %+v, %+v, %v", got, d, err)
		}
	})
	t.Run("seq gaps are fine", func(t *testing.T) {
		a := applyAll(t, []Request{reqOpen(1)})
		a, _, err := Apply(a, reqJoin(1), 100)
		if err != nil || a.NextSeq != 101 {
			t.Fatalf("err %v, NextSeq %d", err, a.NextSeq)
		}
	})
}

// TestNextSeqFence checks that requests which change nothing still advance
// the fence, so a replay of them is refused too.
func TestNextSeqFence(t *testing.T) {
	a := applyAll(t, []Request{reqOpen(1), reqJoin(1)})
	for i, r := range []Request{reqJoin(1), reqCancel(5), reqClaim(6), reqOpen(1), reqOpen(0)} {
		seq := uint64(10 + i)
		var d Decision
		var err error
		a, d, err = Apply(a, r, seq)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if d.Changes || d.Events != nil || d.Changed != nil {
			t.Fatalf("%+v: decision %+v changes something", r, d)
		}
		if a.NextSeq != seq+1 {
			t.Fatalf("%+v: NextSeq %d, want %d", r, a.NextSeq, seq+1)
		}
	}
}

// randomRequests returns n requests on activity act with capacities up to
// maxCap and users 1..users, the first one an open.
func randomRequests(r *rand.Rand, n int, users, maxCap int64) []Request {
	reqs := make([]Request, 0, n)
	reqs = append(reqs, reqOpen(r.Int64N(maxCap+1)))
	for len(reqs) < n {
		u := r.Int64N(users) + 1
		switch p := r.IntN(100); {
		case p < 3:
			reqs = append(reqs, reqOpen(r.Int64N(maxCap+1)))
		case p < 50:
			reqs = append(reqs, reqJoin(u))
		case p < 85:
			reqs = append(reqs, reqCancel(u))
		default:
			reqs = append(reqs, reqClaim(u))
		}
	}
	return reqs
}

func TestRestoreRoundTrip(t *testing.T) {
	tests := []struct {
		name   string
		seed   uint64
		n      int
		users  int64
		maxCap int64
	}{
		{name: "small", seed: 1, n: 400, users: 8, maxCap: 4},
		{name: "long waitlist", seed: 2, n: 20000, users: 500, maxCap: 40},
		{name: "mostly waiting", seed: 3, n: 5000, users: 2000, maxCap: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(tt.seed, 42))
			reqs := randomRequests(r, tt.n, tt.users, tt.maxCap)
			// Restore at several cut points, each time carrying on with the
			// rest of the same sequence on both copies.
			for _, cut := range []int{1, tt.n / 3, tt.n / 2, tt.n - 1} {
				orig := applyAll(t, reqs[:cut])
				restored, err := Restore(orig.ID, orig.Capacity, orig.Confirmed, orig.NextSeq, orig.Hold, orig.Live())
				if err != nil {
					t.Fatalf("cut %d: Restore: %v", cut, err)
				}
				mustCheck(t, restored)
				for i := cut; i < tt.n; i++ {
					seq := uint64(i + 1)
					var d1, d2 Decision
					var err1, err2 error
					orig, d1, err1 = Apply(orig, reqs[i], seq)
					restored, d2, err2 = Apply(restored, reqs[i], seq)
					if err1 != nil || err2 != nil {
						t.Fatalf("cut %d step %d: errors %v, %v", cut, i, err1, err2)
					}
					if !reflect.DeepEqual(d1, d2) {
						t.Fatalf("cut %d step %d %+v: decisions differ:\n orig     %+v\n restored %+v", cut, i, reqs[i], d1, d2)
					}
				}
				mustCheck(t, orig)
				mustCheck(t, restored)
				if !reflect.DeepEqual(orig.Live(), restored.Live()) {
					t.Fatalf("cut %d: live signups differ", cut)
				}
			}
		})
	}
}

func TestRestoreCorrupt(t *testing.T) {
	tests := []struct {
		name                string
		id, capacity, confd int64
		nextSeq             uint64
		live                []Signup
	}{
		{name: "activity id zero", id: 0, capacity: 1, nextSeq: 5},
		{name: "negative capacity", id: act, capacity: -1, nextSeq: 5},
		{name: "capacity above max", id: act, capacity: wire.MaxCapacity + 1, nextSeq: 5},
		{name: "negative confirmed", id: act, capacity: 1, confd: -1, nextSeq: 5},
		{name: "confirmed above capacity", id: act, capacity: 1, confd: 2, nextSeq: 5, live: []Signup{conf(1, 2), conf(2, 3)}},
		{name: "confirmed count mismatch", id: act, capacity: 3, confd: 2, nextSeq: 5, live: []Signup{conf(1, 2)}},
		{name: "waiting while a seat is free", id: act, capacity: 2, confd: 1, nextSeq: 5, live: []Signup{conf(1, 2), wait(2, 3)}},
		{name: "duplicate user", id: act, capacity: 2, confd: 2, nextSeq: 5, live: []Signup{conf(1, 2), conf(1, 3)}},
		{name: "duplicate user across statuses", id: act, capacity: 1, confd: 1, nextSeq: 5, live: []Signup{conf(1, 2), wait(1, 3)}},
		{name: "duplicate queue_seq", id: act, capacity: 2, confd: 2, nextSeq: 5, live: []Signup{conf(1, 2), conf(2, 2)}},
		{name: "cancelled row", id: act, capacity: 1, confd: 0, nextSeq: 5, live: []Signup{canc(1, 2)}},
		{name: "unknown status", id: act, capacity: 1, confd: 0, nextSeq: 5, live: []Signup{{UserID: 1, Status: "HELD", QueueSeq: 2}}},
		{name: "user id zero", id: act, capacity: 1, confd: 1, nextSeq: 5, live: []Signup{conf(0, 2)}},
		{name: "queue_seq zero", id: act, capacity: 1, confd: 1, nextSeq: 5, live: []Signup{conf(1, 0)}},
		{name: "queue_seq at next seq", id: act, capacity: 1, confd: 1, nextSeq: 5, live: []Signup{conf(1, 5)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, err := Restore(tt.id, tt.capacity, tt.confd, tt.nextSeq, 0, tt.live)
			if !errors.Is(err, ErrCorruptState) {
				t.Fatalf("Restore = %v, %v; want ErrCorruptState", a, err)
			}
		})
	}
	t.Run("valid unordered input", func(t *testing.T) {
		live := []Signup{wait(4, 9), conf(1, 2), wait(3, 6), conf(2, 3)}
		a, err := Restore(act, 2, 2, 10, 0, live)
		if err != nil {
			t.Fatalf("Restore: %v", err)
		}
		mustCheck(t, a)
		want := []Signup{conf(1, 2), conf(2, 3), wait(3, 6), wait(4, 9)}
		if !reflect.DeepEqual(a.Live(), want) {
			t.Fatalf("Live = %+v, want %+v", a.Live(), want)
		}
		if a.Position(3) != 1 || a.Position(4) != 2 || a.Waiting() != 2 {
			t.Fatalf("positions %d, %d, waiting %d", a.Position(3), a.Position(4), a.Waiting())
		}
		if live[0] != wait(4, 9) {
			t.Fatalf("Restore reordered its input")
		}
	})
}

func TestClone(t *testing.T) {
	a := applyAll(t, []Request{reqOpen(1), reqJoin(1), reqJoin(2), reqJoin(3)})
	c := a.Clone()
	if _, _, err := Apply(c, reqCancel(1), 10); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Apply(c, reqCancel(3), 11); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a)
	mustCheck(t, c)
	want := []Signup{conf(1, 2), wait(2, 3), wait(3, 4)}
	if !reflect.DeepEqual(a.Live(), want) || a.NextSeq != 5 || a.Position(3) != 2 {
		t.Fatalf("original changed through its clone: %+v", a.Live())
	}
	if (*Activity)(nil).Clone() != nil {
		t.Fatalf("Clone of nil is not nil")
	}
}

func TestAccessorsOnNil(t *testing.T) {
	var a *Activity
	if a.Waiting() != 0 || a.Position(1) != 0 || a.Live() != nil || a.Check() != nil {
		t.Fatalf("nil activity accessors")
	}
	if _, ok := a.Lookup(1); ok {
		t.Fatalf("Lookup on nil found a signup")
	}
}

// TestLargeWaitlist drives a waitlist through growth, removals from the
// middle and head, and compaction, comparing positions with the obvious
// answer.
func TestLargeWaitlist(t *testing.T) {
	const n = 3000
	reqs := []Request{reqOpen(1)}
	for u := int64(1); u <= n; u++ {
		reqs = append(reqs, reqJoin(u))
	}
	a := applyAll(t, reqs)
	seq := uint64(len(reqs))
	next := func() uint64 { seq++; return seq }
	// Cancel every waiter whose id is divisible by 3, then the confirmed
	// user repeatedly, which promotes from the head.
	for u := int64(3); u <= n; u += 3 {
		if _, d, err := Apply(a, reqCancel(u), next()); err != nil || d.Outcome != wire.OutcomeCancelled {
			t.Fatalf("cancel %d: %+v %v", u, d, err)
		}
	}
	mustCheck(t, a)
	for range 500 {
		s := a.Live()[0]
		_, d, err := Apply(a, reqCancel(s.UserID), next())
		if err != nil || len(d.PromotedUserIDs) != 1 {
			t.Fatalf("cancel %d: %+v %v", s.UserID, d, err)
		}
	}
	mustCheck(t, a)
	waiters := 0
	for _, s := range a.Live() {
		if s.Status != wire.StatusWaiting {
			continue
		}
		waiters++
		if p := a.Position(s.UserID); p != int64(waiters) {
			t.Fatalf("Position(%d) = %d, want %d", s.UserID, p, waiters)
		}
	}
	if int64(waiters) != a.Waiting() {
		t.Fatalf("Waiting() = %d, counted %d", a.Waiting(), waiters)
	}
	if len(a.wait.slots) > 2*int(a.Waiting())+compactMin {
		t.Fatalf("%d slots for %d waiters: tombstones not compacted", len(a.wait.slots), a.Waiting())
	}
}

// t0 has a sub-microsecond part, so that held_until's cut to whole
// microseconds shows.
var t0 = time.Date(2026, 12, 1, 3, 0, 0, 500, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// micro is t cut to whole microseconds, as held_until is kept.
func micro(t time.Time) time.Time { return time.UnixMicro(t.UnixMicro()).UTC() }

func held(user int64, seq uint64, until time.Time, holdSeq uint64) Signup {
	return Signup{UserID: user, Status: wire.StatusHeld, QueueSeq: seq, HeldUntil: until, HoldSeq: holdSeq}
}

func evAt(kind wire.EventKind, user int64, until time.Time) Event {
	return Event{Kind: kind, UserID: user, HeldUntil: until}
}

// TestHolds walks every hold outcome in one activity, step by step, with
// the exact decision each gives: events in order (held; expired then
// promoted; confirmed), held_until from the creating request's
// received_at, hold seqs from the creating request's seq.
func TestHolds(t *testing.T) {
	const A, B, C, D, E = 1, 2, 3, 4, 5
	const hold = 2 * time.Second
	open := func(capacity int64, h time.Duration, when time.Duration) Request {
		return Request{Op: wire.OpOpen, ActivityID: act, Capacity: capacity, Hold: h, ReceivedAt: at(when)}
	}
	do := func(op wire.Op, user int64, when time.Duration) Request {
		return Request{Op: op, ActivityID: act, UserID: user, ReceivedAt: at(when)}
	}
	expire := func(user int64, holdSeq uint64, received time.Time) Request {
		return Request{Op: wire.OpExpire, ActivityID: act, UserID: user, HoldSeq: holdSeq, ReceivedAt: received}
	}
	untilA := micro(at(hold))                         // A's join at seq 2
	untilB := micro(wire.HoldDue(untilA).Add(hold))   // promoted by A's expire at seq 11
	untilC := micro(at(20*time.Second + hold))        // promoted by the resize at seq 16
	untilE := micro(at(40*time.Second + time.Second)) // promoted by D's cancel at seq 23
	steps := []step{
		{name: "open capacity 1 with a hold", req: open(1, hold, 0),
			want: Decision{Outcome: wire.OutcomeOpened, Events: []Event{ev(wire.EventOpened, 0)}, Changes: true}},
		{name: "A's join is held", req: do(wire.OpJoin, A, 0),
			want: Decision{Outcome: wire.OutcomeHeld, Status: wire.StatusHeld, HeldUntil: untilA, Changes: true,
				Events:  []Event{evAt(wire.EventHeld, A, untilA), ev(wire.EventSoldOut, 0)},
				Changed: []Signup{held(A, 2, untilA, 2)}}},
		{name: "B waits", req: do(wire.OpJoin, B, time.Second),
			want: Decision{Outcome: wire.OutcomeWaiting, Status: wire.StatusWaiting, Position: 1, Changes: true,
				Events: []Event{ev(wire.EventWaitlisted, B)}, Changed: []Signup{wait(B, 3)}}},
		{name: "C waits", req: do(wire.OpJoin, C, time.Second),
			want: Decision{Outcome: wire.OutcomeWaiting, Status: wire.StatusWaiting, Position: 2, Changes: true,
				Events: []Event{ev(wire.EventWaitlisted, C)}, Changed: []Signup{wait(C, 4)}}},
		{name: "A joins again: its hold", req: do(wire.OpJoin, A, time.Second),
			want: Decision{Outcome: wire.OutcomeAlreadyConfirmed, Status: wire.StatusHeld, HeldUntil: untilA}},
		{name: "A claims: its hold", req: do(wire.OpClaim, A, time.Second),
			want: Decision{Outcome: wire.OutcomeAlreadyOwned, Status: wire.StatusHeld, HeldUntil: untilA}},
		{name: "a waiter's confirm", req: do(wire.OpConfirm, B, time.Second),
			want: Decision{Outcome: wire.OutcomeNotHeld, Status: wire.StatusWaiting, Position: 1}},
		{name: "a stranger's confirm", req: do(wire.OpConfirm, D, time.Second),
			want: Decision{Outcome: wire.OutcomeNotHeld}},
		{name: "an expire received before held_until", req: expire(A, 2, untilA.Add(-time.Nanosecond)),
			want: Decision{Outcome: wire.OutcomeNotHeld, Status: wire.StatusHeld, HeldUntil: untilA}},
		{name: "an expire of another hold", req: expire(A, 5, wire.HoldDue(untilA)),
			want: Decision{Outcome: wire.OutcomeNotHeld, Status: wire.StatusHeld, HeldUntil: untilA}},
		{name: "A's hold expires: expired then promoted", req: expire(A, 2, wire.HoldDue(untilA)),
			want: Decision{Outcome: wire.OutcomeExpired, Status: wire.StatusCancelled, PromotedUserIDs: []int64{B},
				HeldUntil: untilB, Changes: true,
				Events:  []Event{ev(wire.EventExpired, A), evAt(wire.EventPromoted, B, untilB)},
				Changed: []Signup{canc(A, 2), held(B, 3, untilB, 11)}},
			wantLive: []Signup{held(B, 3, untilB, 11), wait(C, 4)}},
		{name: "the same expire again", req: expire(A, 2, wire.HoldDue(untilA)),
			want: Decision{Outcome: wire.OutcomeNotHeld}},
		{name: "B confirms at held_until exactly", req: Request{Op: wire.OpConfirm, ActivityID: act, UserID: B, ReceivedAt: untilB},
			want: Decision{Outcome: wire.OutcomeConfirmed, Status: wire.StatusConfirmed, Changes: true,
				Events: []Event{ev(wire.EventConfirmed, B)}, Changed: []Signup{conf(B, 3)}}},
		{name: "B's expire after the confirm", req: expire(B, 11, wire.HoldDue(untilB)),
			want: Decision{Outcome: wire.OutcomeNotHeld, Status: wire.StatusConfirmed}},
		{name: "B confirms again", req: do(wire.OpConfirm, B, 10*time.Second),
			want: Decision{Outcome: wire.OutcomeAlreadyConfirmed, Status: wire.StatusConfirmed}},
		{name: "resize up promotes C, held", req: open(2, hold, 20*time.Second),
			want: Decision{Outcome: wire.OutcomeResized, PromotedUserIDs: []int64{C}, HeldUntil: untilC, Changes: true,
				Events:  []Event{ev(wire.EventResized, 0), evAt(wire.EventPromoted, C, untilC), ev(wire.EventSoldOut, 0)},
				Changed: []Signup{held(C, 4, untilC, 16)}}},
		{name: "C confirms a nanosecond late", req: Request{Op: wire.OpConfirm, ActivityID: act, UserID: C, ReceivedAt: untilC.Add(1)},
			want: Decision{Outcome: wire.OutcomeHoldExpired, Status: wire.StatusCancelled, Changes: true,
				Events: []Event{ev(wire.EventExpired, C)}, Changed: []Signup{canc(C, 4)}},
			wantLive: []Signup{conf(B, 3)}},
		{name: "a resize of the hold only", req: open(2, 0, 30*time.Second),
			want: Decision{Outcome: wire.OutcomeResized, Events: []Event{ev(wire.EventResized, 0)}, Changes: true}},
		{name: "without a hold a join confirms", req: do(wire.OpJoin, D, 30*time.Second),
			want: Decision{Outcome: wire.OutcomeConfirmed, Status: wire.StatusConfirmed, Changes: true,
				Events: []Event{ev(wire.EventConfirmed, D), ev(wire.EventSoldOut, 0)}, Changed: []Signup{conf(D, 19)}}},
		{name: "the same resize again", req: open(2, 0, 31*time.Second),
			want: Decision{Outcome: wire.OutcomeResized}},
		{name: "a hold again", req: open(2, time.Second, 32*time.Second),
			want: Decision{Outcome: wire.OutcomeResized, Events: []Event{ev(wire.EventResized, 0)}, Changes: true}},
		{name: "E waits", req: do(wire.OpJoin, E, 33*time.Second),
			want: Decision{Outcome: wire.OutcomeWaiting, Status: wire.StatusWaiting, Position: 1, Changes: true,
				Events: []Event{ev(wire.EventWaitlisted, E)}, Changed: []Signup{wait(E, 22)}}},
		{name: "D's cancel promotes E, held", req: do(wire.OpCancel, D, 40*time.Second),
			want: Decision{Outcome: wire.OutcomeCancelled, Status: wire.StatusCancelled, PromotedUserIDs: []int64{E},
				HeldUntil: untilE, Changes: true,
				Events:  []Event{ev(wire.EventCancelled, D), evAt(wire.EventPromoted, E, untilE)},
				Changed: []Signup{canc(D, 19), held(E, 22, untilE, 23)}},
			wantLive: []Signup{conf(B, 3), held(E, 22, untilE, 23)}},
		{name: "E cancels its hold", req: do(wire.OpCancel, E, 40*time.Second),
			want: Decision{Outcome: wire.OutcomeCancelled, Status: wire.StatusCancelled, Changes: true,
				Events: []Event{ev(wire.EventCancelled, E)}, Changed: []Signup{canc(E, 22)}},
			wantLive: []Signup{conf(B, 3)}},
	}
	var a *Activity
	for i, st := range steps {
		a = st.apply(t, a, uint64(i+1))
		// Every state restores to itself, holds included.
		r, err := Restore(a.ID, a.Capacity, a.Confirmed, a.NextSeq, a.Hold, a.Live())
		if err != nil || !reflect.DeepEqual(r.Live(), a.Live()) || r.Held != a.Held || r.Hold != a.Hold {
			t.Fatalf("%s: Restore: %v, %+v", st.name, err, r)
		}
	}
	if a.Capacity != 2 || a.Confirmed != 1 || a.Held != 0 || a.Hold != time.Second {
		t.Fatalf("final counters: capacity %d confirmed %d held %d hold %s", a.Capacity, a.Confirmed, a.Held, a.Hold)
	}
}
