// Package allocation is the pure domain of allot: given an activity's state
// and a request, it decides the outcome. It does no I/O and reads no clock, so
// the allocator, the audit replay and the fuzz tests all run exactly the same
// decisions.
package allocation

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// ErrInvalidRequest is returned by Apply for a request the domain refuses to
// decide: an unknown op, ActivityID <= 0, a request for another activity than
// the one passed, UserID <= 0 for join/cancel/claim, UserID != 0 for open,
// Capacity < 0 or > wire.MaxCapacity for open, seq == 0 or seq ==
// math.MaxUint64, or seq < Activity.NextSeq. Ingest never publishes such a
// request, so seeing one means a bug upstream or a replay mistake; the state
// is left untouched.
var ErrInvalidRequest = errors.New("allocation: invalid request")

// ErrCorruptState is returned by Restore (and Activity.Check) when the state
// breaks the invariants (docs/architecture.md); deciding on such a state would
// spread the damage, so the caller must stop instead.
var ErrCorruptState = errors.New("allocation: corrupt state")

// Request is what the domain needs of a request.
type Request struct {
	Op         wire.Op
	ActivityID int64
	UserID     int64         // 0 for open
	Capacity   int64         // open only; ignored by the other ops
	Hold       time.Duration // open only: the hold of seats taken from now on (0: none)
	HoldSeq    uint64        // expire only: the place of the request that created the hold
	// ReceivedAt is when ingest received the request (an expire: when it
	// fell due). A hold created by the request lasts until ReceivedAt plus
	// the activity's hold; a confirm received after that is too late.
	ReceivedAt time.Time
}

// Signup is one user's row in activity_signup.
type Signup struct {
	UserID   int64
	Status   wire.Status
	QueueSeq uint64
	// HeldUntil and HoldSeq describe a HELD signup's hold: when it lapses
	// (whole microseconds, as MySQL keeps it) and the place of the request
	// that created it. Zero for every other status.
	HeldUntil time.Time
	HoldSeq   uint64
}

// Event is an event the decision emits: Kind is one of wire.EventXxx, UserID
// is 0 for the activity-level events (opened, resized, sold_out). HeldUntil
// is set on the held and promoted events of a hold.
type Event struct {
	Kind      wire.EventKind
	UserID    int64
	HeldUntil time.Time
}

// Decision is the result of applying one request. Empty lists are nil.
type Decision struct {
	// Outcome is one of wire.OutcomeXxx.
	Outcome wire.Outcome
	// Status is the requesting user's signup status after the request; ""
	// when there is no signup state to report (open ops, NOT_SIGNED_UP,
	// SOLD_OUT, NO_SUCH_ACTIVITY).
	Status wire.Status
	// Position is the 1-based waitlist position when Status is WAITING, else 0.
	Position int64
	// PromotedUserIDs are the users promoted by this request, in queue order
	// (cancel: at most one; resize up: several).
	PromotedUserIDs []int64
	// Events are the events to publish, in the order they happen.
	Events []Event
	// Changed holds every signup row whose status or queue_seq this request
	// changed, with its value after the request (rows set to CANCELLED
	// included), in the order the changes happen.
	Changed []Signup
	// Changes is true when the request changed the activity row or a signup.
	// The NextSeq fence, which every applied request advances, does not count.
	Changes bool
	// HeldUntil is the end of the hold the request created (for the user
	// or a promoted user; one request creates holds of one end only), or,
	// when the user holds a seat under a hold, the end of that hold.
	HeldUntil time.Time
}

// Activity is one activity's full live state. Build it with Apply (an open)
// or Restore.
type Activity struct {
	ID       int64
	Capacity int64
	// Confirmed counts the seats taken: CONFIRMED and HELD signups.
	Confirmed int64
	// Held counts the HELD signups.
	Held int64
	// Hold is how long a seat taken from now on is held (0: no holds).
	Hold time.Duration
	// NextSeq is one past the place of the last request applied to
	// this activity. Apply refuses anything below it, which makes a replay
	// that goes backwards fail loudly instead of deciding twice.
	NextSeq uint64

	// members holds the live signups (CONFIRMED and WAITING) by user.
	members map[int64]member
	// wait is the waitlist in queue_seq order.
	wait waitlist
}

// member is a live signup. A confirmed or held member has slot -1; a
// waiting one has the index of its waitlist slot, so leaving the waitlist
// from the middle and computing a position are O(log n). A held member has
// until > 0 (held_until in Unix microseconds) and hold, the seq of the
// request that created the hold.
type member struct {
	seq   uint64
	slot  int
	until int64
	hold  uint64
}

func (m member) held() bool { return m.until != 0 }

func (m member) heldUntil() time.Time {
	if m.until == 0 {
		return time.Time{}
	}
	return time.UnixMicro(m.until).UTC()
}

func (m member) waiting() bool { return m.slot >= 0 }

// Apply decides req at seq against a (nil when the activity was never
// opened) and mutates a in place. seq is the request's place in the order,
// its stream sequence and index in its batch packed as one number
// (wire.Place); the domain only orders by it, so "seq" in this package
// always means a place. It returns the activity after the
// request: a new *Activity when an open creates it, a itself otherwise (nil
// stays nil for a non-open request on a missing activity).
//
// After a successful Apply on a non-nil result, NextSeq = seq + 1, also for
// requests that changed nothing: the caller persists it as a fence. Requests
// must therefore be applied with strictly increasing seq per activity; a seq
// below NextSeq returns ErrInvalidRequest. On error a is returned unchanged
// with a zero Decision.
func Apply(a *Activity, req Request, seq uint64) (*Activity, Decision, error) {
	if err := validate(req, seq); err != nil {
		return a, Decision{}, err
	}
	if a == nil {
		if req.Op != wire.OpOpen {
			return nil, Decision{Outcome: wire.OutcomeNoSuchActivity}, nil
		}
		a = &Activity{
			ID:       req.ActivityID,
			Capacity: req.Capacity,
			Hold:     req.Hold,
			NextSeq:  seq + 1,
			members:  make(map[int64]member),
		}
		return a, Decision{
			Outcome: wire.OutcomeOpened,
			Events:  []Event{{Kind: wire.EventOpened}},
			Changes: true,
		}, nil
	}
	if req.ActivityID != a.ID {
		return a, Decision{}, fmt.Errorf("%w: request for activity %d applied to activity %d", ErrInvalidRequest, req.ActivityID, a.ID)
	}
	if seq < a.NextSeq {
		return a, Decision{}, fmt.Errorf("%w: seq %d below next seq %d of activity %d", ErrInvalidRequest, seq, a.NextSeq, a.ID)
	}
	var d Decision
	switch req.Op {
	case wire.OpOpen:
		d = a.resize(req, seq)
	case wire.OpJoin:
		d = a.join(req, seq)
	case wire.OpCancel:
		d = a.cancel(req, seq)
	case wire.OpClaim:
		d = a.claim(req, seq)
	case wire.OpConfirm:
		d = a.confirm(req, seq)
	case wire.OpExpire:
		d = a.expire(req, seq)
	}
	a.NextSeq = seq + 1
	return a, d, nil
}

// validate rejects what no valid stream can contain, before any state is
// touched.
func validate(req Request, seq uint64) error {
	if seq == 0 || seq == math.MaxUint64 {
		// 0 is no stream sequence, and MaxUint64 would wrap the NextSeq fence.
		return fmt.Errorf("%w: seq %d", ErrInvalidRequest, seq)
	}
	if req.ActivityID <= 0 {
		return fmt.Errorf("%w: activity id %d", ErrInvalidRequest, req.ActivityID)
	}
	switch req.Op {
	case wire.OpOpen:
		if req.UserID != 0 {
			return fmt.Errorf("%w: open with user id %d", ErrInvalidRequest, req.UserID)
		}
		if req.Capacity < 0 || req.Capacity > wire.MaxCapacity {
			return fmt.Errorf("%w: capacity %d outside 0..%d", ErrInvalidRequest, req.Capacity, wire.MaxCapacity)
		}
		if req.Hold < 0 || req.Hold > wire.MaxHold {
			return fmt.Errorf("%w: hold %s outside 0..%s", ErrInvalidRequest, req.Hold, wire.MaxHold)
		}
	case wire.OpJoin, wire.OpCancel, wire.OpClaim, wire.OpConfirm:
		if req.UserID <= 0 {
			return fmt.Errorf("%w: %s with user id %d", ErrInvalidRequest, req.Op, req.UserID)
		}
	case wire.OpExpire:
		if req.UserID <= 0 || req.HoldSeq == 0 || req.HoldSeq >= seq {
			return fmt.Errorf("%w: expire with user id %d, hold seq %d at seq %d", ErrInvalidRequest, req.UserID, req.HoldSeq, seq)
		}
	default:
		return fmt.Errorf("%w: unknown op %q", ErrInvalidRequest, req.Op)
	}
	return nil
}

// decisionBuf backs the slices of one decision so that the common cases (one
// or two events, one or two changed rows, at most one promotion) cost a
// single allocation; only a resize promoting many waiters grows beyond it.
type decisionBuf struct {
	events   [2]Event
	changed  [2]Signup
	promoted [1]int64
}

// newChange starts a decision for a request that changes state.
func newChange(outcome wire.Outcome) Decision {
	buf := new(decisionBuf)
	return Decision{
		Outcome: outcome,
		// Full slice expressions so that an append beyond the buffer
		// reallocates instead of writing into a neighbouring array.
		Events:          buf.events[:0:len(buf.events)],
		Changed:         buf.changed[:0:len(buf.changed)],
		PromotedUserIDs: buf.promoted[:0:len(buf.promoted)],
		Changes:         true,
	}
}

// trim makes empty lists nil, so that every Decision has one shape for
// "none" and compares equal regardless of how it was built.
func (d *Decision) trim() {
	if len(d.Events) == 0 {
		d.Events = nil
	}
	if len(d.Changed) == 0 {
		d.Changed = nil
	}
	if len(d.PromotedUserIDs) == 0 {
		d.PromotedUserIDs = nil
	}
}

func (a *Activity) resize(req Request, seq uint64) Decision {
	capacity := req.Capacity
	if capacity < a.Confirmed {
		return Decision{Outcome: wire.OutcomeRejected}
	}
	if capacity == a.Capacity && req.Hold == a.Hold {
		// Idempotent: a retried open must not emit a second resized.
		return Decision{Outcome: wire.OutcomeResized}
	}
	d := newChange(wire.OutcomeResized)
	a.Capacity = capacity
	// The new hold applies to the seats taken from now on, the ones this
	// resize promotes to included; holds already given keep their end.
	a.Hold = req.Hold
	d.Events = append(d.Events, Event{Kind: wire.EventResized})
	// Only growth can free seats: waiters exist only when the activity is
	// full, and then any shrink falls below Confirmed and is rejected above.
	promoted := false
	for a.Confirmed < a.Capacity && a.wait.live > 0 {
		a.promoteHead(&d, req, seq)
		promoted = true
	}
	if promoted && a.Confirmed == a.Capacity {
		d.Events = append(d.Events, Event{Kind: wire.EventSoldOut})
	}
	d.trim()
	return d
}

// alreadyWaiting answers a join or a claim from a user who already waits.
func (a *Activity) alreadyWaiting(m member) Decision {
	return Decision{Outcome: wire.OutcomeAlreadyWaiting, Status: wire.StatusWaiting, Position: int64(a.wait.rank(m.slot))}
}

// unchanged answers a request that changes nothing with outcome and the
// user's signup as it is: status, position or hold.
func (a *Activity) unchanged(outcome wire.Outcome, user int64) Decision {
	d := Decision{Outcome: outcome}
	m, ok := a.members[user]
	switch {
	case !ok:
	case m.waiting():
		d.Status, d.Position = wire.StatusWaiting, int64(a.wait.rank(m.slot))
	case m.held():
		d.Status, d.HeldUntil = wire.StatusHeld, m.heldUntil()
	default:
		d.Status = wire.StatusConfirmed
	}
	return d
}

func (a *Activity) join(req Request, seq uint64) Decision {
	user := req.UserID
	if m, ok := a.members[user]; ok {
		if m.waiting() {
			return a.alreadyWaiting(m)
		}
		// A held seat is the user's too: the repeat changes nothing and
		// says until when it is held.
		return a.unchanged(wire.OutcomeAlreadyConfirmed, user)
	}
	if a.Confirmed < a.Capacity {
		return a.takeSeat(req, seq, wire.OutcomeConfirmed, wire.EventConfirmed)
	}
	d := newChange(wire.OutcomeWaiting)
	slot := a.wait.push(user, seq)
	a.setMember(user, member{seq: seq, slot: slot})
	d.Status = wire.StatusWaiting
	d.Position = int64(a.wait.live)
	d.Events = append(d.Events, Event{Kind: wire.EventWaitlisted, UserID: user})
	d.Changed = append(d.Changed, Signup{UserID: user, Status: wire.StatusWaiting, QueueSeq: seq})
	d.trim()
	return d
}

func (a *Activity) claim(req Request, seq uint64) Decision {
	user := req.UserID
	m, ok := a.members[user]
	var seat Signup
	if ok {
		seat = m.signup(user)
	}
	if d, decided := ClaimOnFull(a.Capacity, a.Confirmed, seat, ok); decided {
		return d
	}
	if ok {
		if m.waiting() {
			// A claim never waits, but neither does it throw away a place
			// the user already queued for.
			return a.alreadyWaiting(m)
		}
		// A seat of an activity with seats free.
		return a.unchanged(wire.OutcomeAlreadyOwned, user)
	}
	return a.takeSeat(req, seq, wire.OutcomeGranted, wire.EventGranted)
}

// takeSeat gives a free seat to a user without a live signup, for join and
// claim alike: confirmed at once, or held when the activity has a hold.
func (a *Activity) takeSeat(req Request, seq uint64, outcome wire.Outcome, kind wire.EventKind) Decision {
	user := req.UserID
	m := member{seq: seq, slot: -1}
	status := wire.StatusConfirmed
	if a.Hold > 0 {
		outcome, kind, status = wire.OutcomeHeld, wire.EventHeld, wire.StatusHeld
		m.until, m.hold = a.holdEnd(req), seq
	}
	d := newChange(outcome)
	a.setMember(user, m)
	a.Confirmed++
	if m.held() {
		a.Held++
		d.HeldUntil = m.heldUntil()
	}
	d.Status = status
	d.Events = append(d.Events, Event{Kind: kind, UserID: user, HeldUntil: d.HeldUntil})
	if a.Confirmed == a.Capacity {
		d.Events = append(d.Events, Event{Kind: wire.EventSoldOut})
	}
	d.Changed = append(d.Changed, m.signup(user))
	d.trim()
	return d
}

// holdEnd is when a hold created by req ends, in Unix microseconds (what
// MySQL's DATETIME(6) keeps, so that a restored hold ends at the same
// instant): req's received_at plus the activity's hold.
func (a *Activity) holdEnd(req Request) int64 {
	end := req.ReceivedAt.Add(a.Hold).UnixMicro()
	if end == 0 {
		// 0 means "not held"; an instant exactly at the epoch is a
		// microsecond later.
		end = 1
	}
	return end
}

func (a *Activity) cancel(req Request, seq uint64) Decision {
	user := req.UserID
	m, ok := a.members[user]
	if !ok {
		return Decision{Outcome: wire.OutcomeNotSignedUp}
	}
	d := newChange(wire.OutcomeCancelled)
	a.release(&d, user, m, wire.EventCancelled, req, seq)
	return d
}

// release ends user's live signup m for request req at seq: the row becomes
// CANCELLED with event kind, and a freed seat goes to the head of the
// waitlist in the same decision, so no state with a free seat and a waiter
// is ever visible. The activity was full before and is full again: no
// sold_out.
func (a *Activity) release(d *Decision, user int64, m member, kind wire.EventKind, req Request, seq uint64) {
	d.Status = wire.StatusCancelled
	delete(a.members, user)
	switch {
	case m.waiting():
		a.removeWaiter(m.slot)
	case m.held():
		a.Held--
		a.Confirmed--
	default:
		a.Confirmed--
	}
	d.Events = append(d.Events, Event{Kind: kind, UserID: user})
	d.Changed = append(d.Changed, Signup{UserID: user, Status: wire.StatusCancelled, QueueSeq: m.seq})
	if !m.waiting() && a.wait.live > 0 {
		a.promoteHead(d, req, seq)
	}
	d.trim()
}

// confirm turns the user's hold into a confirmed seat, if req was received
// by the end of the hold; a later confirm finds the hold lapsed and
// releases it as its expire would.
func (a *Activity) confirm(req Request, seq uint64) Decision {
	user := req.UserID
	m, ok := a.members[user]
	switch {
	case !ok || m.waiting():
		return a.unchanged(wire.OutcomeNotHeld, user)
	case !m.held():
		return a.unchanged(wire.OutcomeAlreadyConfirmed, user)
	case req.ReceivedAt.After(m.heldUntil()):
		d := newChange(wire.OutcomeHoldExpired)
		a.release(&d, user, m, wire.EventExpired, req, seq)
		return d
	}
	d := newChange(wire.OutcomeConfirmed)
	m.until, m.hold = 0, 0
	a.members[user] = m
	a.Held--
	d.Status = wire.StatusConfirmed
	d.Events = append(d.Events, Event{Kind: wire.EventConfirmed, UserID: user})
	d.Changed = append(d.Changed, m.signup(user))
	d.trim()
	return d
}

// expire lapses the hold the request at req.HoldSeq gave the user, if the
// user still has that very hold and it has ended by req's received_at;
// anything else (confirmed, cancelled, released and held again since) makes
// it NOT_HELD and changes nothing.
func (a *Activity) expire(req Request, seq uint64) Decision {
	user := req.UserID
	m, ok := a.members[user]
	if !ok || !m.held() || m.hold != req.HoldSeq || req.ReceivedAt.Before(m.heldUntil()) {
		return a.unchanged(wire.OutcomeNotHeld, user)
	}
	d := newChange(wire.OutcomeExpired)
	a.release(&d, user, m, wire.EventExpired, req, seq)
	return d
}

// promoteHead gives the freed seat to the waiter with the lowest queue_seq:
// confirmed, or held from req (at seq) when the activity has a hold. The
// caller guarantees a free seat and a non-empty waitlist.
func (a *Activity) promoteHead(d *Decision, req Request, seq uint64) {
	s := a.wait.slots[a.wait.head]
	a.removeWaiter(a.wait.head)
	// A promoted signup keeps its queue_seq: it is the row's identity in
	// the order of the broker, and changing it could collide.
	m := member{seq: s.seq, slot: -1}
	if a.Hold > 0 {
		m.until, m.hold = a.holdEnd(req), seq
		a.Held++
		d.HeldUntil = m.heldUntil()
	}
	a.members[s.user] = m
	a.Confirmed++
	d.PromotedUserIDs = append(d.PromotedUserIDs, s.user)
	d.Events = append(d.Events, Event{Kind: wire.EventPromoted, UserID: s.user, HeldUntil: m.heldUntil()})
	d.Changed = append(d.Changed, m.signup(s.user))
}

func (a *Activity) setMember(user int64, m member) {
	if a.members == nil {
		a.members = make(map[int64]member)
	}
	a.members[user] = m
}

// removeWaiter takes the waiter in slot i off the waitlist, compacting the
// slots when tombstones outnumber the live waiters. Compaction rewrites the
// slot index of every live member, so it must run here, where the members
// are at hand, and never while a caller holds a slot index.
func (a *Activity) removeWaiter(i int) {
	w := &a.wait
	w.kill(i)
	switch {
	case w.live == 0:
		w.reset()
	case len(w.slots)-w.live > w.live && len(w.slots) >= compactMin:
		a.compact()
	}
}

// compactMin keeps tiny waitlists from compacting on every cancel.
// Compaction is amortised O(1) for any value: it costs O(slots) and only
// runs after more than slots/2 removals, each of which was one request.
const compactMin = 8

// compact moves the live waiters to the front of the slots, in order, and
// rebuilds the tree.
func (a *Activity) compact() {
	w := &a.wait
	slots := w.slots
	if cap(slots) >= 1024 && cap(slots) >= 8*w.live {
		// Give back the memory of a waitlist that has mostly drained.
		slots = make([]slot, 0, 2*w.live)
		w.tree = make([]int, 1, 2*w.live+1)
	} else {
		slots = slots[:0]
	}
	for _, s := range w.slots[w.head:] {
		if s.user == 0 {
			continue
		}
		a.members[s.user] = member{seq: s.seq, slot: len(slots)}
		slots = append(slots, s)
	}
	w.slots = slots
	w.head = 0
	w.rebuild()
}

// waitlist is the queue of WAITING signups in queue_seq order: an append-only
// slice of slots with a head index and tombstones, and a Fenwick tree over
// slot liveness so that a waiter's rank is a prefix sum. Join appends,
// promotion pops the head, a waiter's cancel tombstones its slot from the
// middle; each is O(log n), and so is a position.
type waitlist struct {
	slots []slot
	// tree is the Fenwick tree, 1-based: tree[k] counts the live slots in
	// (k - lowbit(k), k]. len(tree) == len(slots)+1.
	tree []int
	// head is the index of the first live slot (len(slots) when empty);
	// everything before it is dead.
	head int
	live int
}

// slot is one place in the waitlist; user 0 (never a valid user) marks a
// tombstone.
type slot struct {
	user int64
	seq  uint64
}

// push appends a live slot and returns its index.
func (w *waitlist) push(user int64, seq uint64) int {
	if len(w.tree) == 0 {
		w.tree = append(w.tree, 0)
	}
	i := len(w.slots)
	w.slots = append(w.slots, slot{user: user, seq: seq})
	// The new node k covers (k - lowbit(k), k]: itself plus the nodes that
	// tile (k - lowbit(k), k-1], all of which already exist.
	k := i + 1
	v := 1
	for j := k - 1; j > k-(k&-k); j -= j & -j {
		v += w.tree[j]
	}
	w.tree = append(w.tree, v)
	w.live++
	return i
}

// kill tombstones slot i and moves head past any dead prefix.
func (w *waitlist) kill(i int) {
	w.slots[i].user = 0
	for k := i + 1; k < len(w.tree); k += k & -k {
		w.tree[k]--
	}
	w.live--
	for w.head < len(w.slots) && w.slots[w.head].user == 0 {
		w.head++
	}
}

// rank is the 1-based position of the live slot i: the number of live slots
// up to and including it.
func (w *waitlist) rank(i int) int {
	n := 0
	for k := i + 1; k > 0; k -= k & -k {
		n += w.tree[k]
	}
	return n
}

// reset empties the waitlist, keeping its memory.
func (w *waitlist) reset() {
	w.slots = w.slots[:0]
	if len(w.tree) > 0 {
		w.tree = w.tree[:1]
	}
	w.head = 0
	w.live = 0
}

// rebuild recomputes the tree in O(n) for slots that are all live.
func (w *waitlist) rebuild() {
	n := len(w.slots)
	w.tree = slices.Grow(w.tree[:0], n+1)[:n+1]
	w.tree[0] = 0
	for k := 1; k <= n; k++ {
		w.tree[k] = 1
	}
	for k := 1; k <= n; k++ {
		if p := k + k&-k; p <= n {
			w.tree[p] += w.tree[k]
		}
	}
	w.live = n
}

// Restore rebuilds an activity from stored rows: the activity row's
// counters and hold and its live (CONFIRMED, HELD and WAITING) signups, in
// any order. It checks the invariants of docs/architecture.md (confirmed equals the
// number of CONFIRMED and HELD rows and is at most capacity, no WAITING row
// while a seat is free, one row per user, unique queue_seqs) and that every
// queue_seq and hold seq lies in 1..nextSeq-1, since each is the stream
// sequence of an applied request; otherwise it returns ErrCorruptState,
// wrapped with detail.
func Restore(id, capacity, confirmed int64, nextSeq uint64, hold time.Duration, live []Signup) (*Activity, error) {
	if id <= 0 {
		return nil, fmt.Errorf("%w: activity id %d", ErrCorruptState, id)
	}
	if capacity < 0 || capacity > wire.MaxCapacity {
		return nil, fmt.Errorf("%w: activity %d: capacity %d outside 0..%d", ErrCorruptState, id, capacity, wire.MaxCapacity)
	}
	if confirmed < 0 || confirmed > capacity {
		return nil, fmt.Errorf("%w: activity %d: confirmed %d outside 0..capacity %d", ErrCorruptState, id, confirmed, capacity)
	}
	if hold < 0 || hold > wire.MaxHold {
		return nil, fmt.Errorf("%w: activity %d: hold %s outside 0..%s", ErrCorruptState, id, hold, wire.MaxHold)
	}
	// Sort a copy: the waitlist must be built in queue_seq order, and the
	// caller's slice is not ours to reorder.
	sorted := slices.Clone(live)
	slices.SortFunc(sorted, func(x, y Signup) int {
		switch {
		case x.QueueSeq < y.QueueSeq:
			return -1
		case x.QueueSeq > y.QueueSeq:
			return 1
		}
		return 0
	})
	a := &Activity{
		ID:        id,
		Capacity:  capacity,
		Confirmed: confirmed,
		Hold:      hold,
		NextSeq:   nextSeq,
		members:   make(map[int64]member, len(sorted)),
	}
	var nConfirmed int64
	for i, s := range sorted {
		if s.UserID <= 0 {
			return nil, fmt.Errorf("%w: activity %d: user id %d", ErrCorruptState, id, s.UserID)
		}
		if s.QueueSeq == 0 || s.QueueSeq >= nextSeq {
			return nil, fmt.Errorf("%w: activity %d: user %d: queue_seq %d is 0 or not below next seq %d", ErrCorruptState, id, s.UserID, s.QueueSeq, nextSeq)
		}
		if i > 0 && sorted[i-1].QueueSeq == s.QueueSeq {
			return nil, fmt.Errorf("%w: activity %d: queue_seq %d used twice", ErrCorruptState, id, s.QueueSeq)
		}
		if _, dup := a.members[s.UserID]; dup {
			return nil, fmt.Errorf("%w: activity %d: user %d has two live signups", ErrCorruptState, id, s.UserID)
		}
		switch s.Status {
		case wire.StatusConfirmed:
			a.members[s.UserID] = member{seq: s.QueueSeq, slot: -1}
			nConfirmed++
		case wire.StatusHeld:
			until := s.HeldUntil.UnixMicro()
			if s.HeldUntil.IsZero() || until == 0 || s.HoldSeq < s.QueueSeq || s.HoldSeq >= nextSeq {
				return nil, fmt.Errorf("%w: activity %d: user %d: hold until %v from seq %d (queue_seq %d, next seq %d)",
					ErrCorruptState, id, s.UserID, s.HeldUntil, s.HoldSeq, s.QueueSeq, nextSeq)
			}
			a.members[s.UserID] = member{seq: s.QueueSeq, slot: -1, until: until, hold: s.HoldSeq}
			nConfirmed++
			a.Held++
		case wire.StatusWaiting:
			a.members[s.UserID] = member{seq: s.QueueSeq, slot: len(a.wait.slots)}
			a.wait.slots = append(a.wait.slots, slot{user: s.UserID, seq: s.QueueSeq})
		default:
			return nil, fmt.Errorf("%w: activity %d: user %d: status %q is not live", ErrCorruptState, id, s.UserID, s.Status)
		}
	}
	if nConfirmed != confirmed {
		return nil, fmt.Errorf("%w: activity %d: confirmed %d but %d CONFIRMED and HELD rows", ErrCorruptState, id, confirmed, nConfirmed)
	}
	a.wait.rebuild()
	if a.wait.live > 0 && confirmed < capacity {
		return nil, fmt.Errorf("%w: activity %d: %d waiting while %d of %d seats are taken", ErrCorruptState, id, a.wait.live, confirmed, capacity)
	}
	return a, nil
}

// Waiting is the number of WAITING signups.
func (a *Activity) Waiting() int64 {
	if a == nil {
		return 0
	}
	return int64(a.wait.live)
}

// Lookup returns the user's live signup, and false when the user has none
// (never signed up, or cancelled).
func (a *Activity) Lookup(user int64) (Signup, bool) {
	if a == nil {
		return Signup{}, false
	}
	m, ok := a.members[user]
	if !ok {
		return Signup{}, false
	}
	return m.signup(user), true
}

func (m member) signup(user int64) Signup {
	switch {
	case m.waiting():
		return Signup{UserID: user, Status: wire.StatusWaiting, QueueSeq: m.seq}
	case m.held():
		return Signup{UserID: user, Status: wire.StatusHeld, QueueSeq: m.seq, HeldUntil: m.heldUntil(), HoldSeq: m.hold}
	}
	return Signup{UserID: user, Status: wire.StatusConfirmed, QueueSeq: m.seq}
}

// Position is the 1-based rank of a WAITING user in the waitlist, and 0 when
// the user is not waiting.
func (a *Activity) Position(user int64) int64 {
	if a == nil {
		return 0
	}
	m, ok := a.members[user]
	if !ok || !m.waiting() {
		return 0
	}
	return int64(a.wait.rank(m.slot))
}

// Live returns all live signups ordered by QueueSeq: what a store writes
// and what Restore takes back.
func (a *Activity) Live() []Signup {
	if a == nil || len(a.members) == 0 {
		return nil
	}
	out := make([]Signup, 0, len(a.members))
	for u, m := range a.members {
		out = append(out, m.signup(u))
	}
	slices.SortFunc(out, func(x, y Signup) int {
		switch {
		case x.QueueSeq < y.QueueSeq:
			return -1
		case x.QueueSeq > y.QueueSeq:
			return 1
		}
		return 0
	})
	return out
}

// Clone returns a deep copy, so a caller can decide speculatively (for
// example inside a transaction that may roll back) and keep the original.
func (a *Activity) Clone() *Activity {
	if a == nil {
		return nil
	}
	c := *a
	c.members = maps.Clone(a.members)
	c.wait.slots = slices.Clone(a.wait.slots)
	c.wait.tree = slices.Clone(a.wait.tree)
	return &c
}

// Check verifies every invariant of the activity, including the consistency
// of its internal indexes, by brute force in O(n log n). It returns
// ErrCorruptState, wrapped with detail, on the first violation. It is meant
// for tests, audits and debugging, not for the hot path.
func (a *Activity) Check() error {
	if a == nil {
		return nil
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: activity %d: %s", ErrCorruptState, a.ID, fmt.Sprintf(format, args...))
	}
	if a.Capacity < 0 || a.Capacity > wire.MaxCapacity {
		return fail("capacity %d", a.Capacity)
	}
	if a.Confirmed < 0 || a.Confirmed > a.Capacity {
		return fail("confirmed %d, capacity %d", a.Confirmed, a.Capacity)
	}
	var nConfirmed, nWaiting, nHeld int64
	seqs := make(map[uint64]int64, len(a.members))
	var maxConfirmed, minWaiting uint64 = 0, math.MaxUint64
	for u, m := range a.members {
		if u <= 0 {
			return fail("user id %d", u)
		}
		if m.seq == 0 || m.seq >= a.NextSeq {
			return fail("user %d: queue_seq %d, next seq %d", u, m.seq, a.NextSeq)
		}
		if other, dup := seqs[m.seq]; dup {
			return fail("queue_seq %d held by users %d and %d", m.seq, other, u)
		}
		seqs[m.seq] = u
		if m.held() {
			nHeld++
			if m.hold < m.seq || m.hold >= a.NextSeq || m.slot != -1 {
				return fail("user %d: hold from seq %d, queue_seq %d, next seq %d, slot %d", u, m.hold, m.seq, a.NextSeq, m.slot)
			}
		} else if m.hold != 0 {
			return fail("user %d: hold seq %d without a hold", u, m.hold)
		}
		if !m.waiting() {
			nConfirmed++
			maxConfirmed = max(maxConfirmed, m.seq)
			continue
		}
		nWaiting++
		minWaiting = min(minWaiting, m.seq)
		if m.slot < a.wait.head || m.slot >= len(a.wait.slots) {
			return fail("user %d: slot %d outside %d..%d", u, m.slot, a.wait.head, len(a.wait.slots))
		}
		if s := a.wait.slots[m.slot]; s.user != u || s.seq != m.seq {
			return fail("user %d: slot %d holds user %d seq %d", u, m.slot, s.user, s.seq)
		}
	}
	if nConfirmed != a.Confirmed {
		return fail("confirmed %d but %d confirmed and held signups", a.Confirmed, nConfirmed)
	}
	if nHeld != a.Held {
		return fail("held %d but %d held signups", a.Held, nHeld)
	}
	if a.Hold < 0 || a.Hold > wire.MaxHold {
		return fail("hold %s", a.Hold)
	}
	if nWaiting > 0 && a.Confirmed < a.Capacity {
		return fail("%d waiting while %d of %d seats are taken", nWaiting, a.Confirmed, a.Capacity)
	}
	if nWaiting > 0 && maxConfirmed > minWaiting {
		// Seats go to waiters in queue order, and nobody skips a queue.
		return fail("confirmed queue_seq %d after waiting queue_seq %d", maxConfirmed, minWaiting)
	}
	w := &a.wait
	if len(w.slots) > 0 && len(w.tree) != len(w.slots)+1 {
		return fail("tree of %d nodes for %d slots", len(w.tree), len(w.slots))
	}
	if w.head < len(w.slots) && w.slots[w.head].user == 0 {
		return fail("head %d is a tombstone", w.head)
	}
	live, prev := 0, uint64(0)
	for i, s := range w.slots {
		if s.user == 0 {
			if w.rank(i) != live {
				return fail("rank at tombstone %d is %d, want %d", i, w.rank(i), live)
			}
			continue
		}
		if i < w.head {
			return fail("live slot %d before head %d", i, w.head)
		}
		if s.seq <= prev {
			return fail("slot %d seq %d not after %d", i, s.seq, prev)
		}
		prev = s.seq
		live++
		if m, ok := a.members[s.user]; !ok || m.slot != i {
			return fail("slot %d user %d not indexed", i, s.user)
		}
		if w.rank(i) != live {
			return fail("rank of slot %d is %d, want %d", i, w.rank(i), live)
		}
	}
	if int64(live) != nWaiting || w.live != live {
		return fail("%d live slots, count %d, %d waiting members", live, w.live, nWaiting)
	}
	return nil
}
