package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/wire"
)

// HoldReport is what a burst against an activity with a hold measured
// about the holds: who was held, how the confirms went, and how every held
// seat ended. Report.Holds is nil for an activity without a hold.
type HoldReport struct {
	// Hold is the activity's hold.
	Hold time.Duration
	// NoShow is the fraction of users who never confirm (Config.NoShow).
	NoShow float64
	// HeldUsers counts users seen holding a seat (a HELD result, a
	// promotion, or their signup read HELD); NoShowsHeld those of them who
	// are no-shows.
	HeldUsers, NoShowsHeld int
	// Confirms counts the outcomes of the confirms loadgen sent after a
	// user was seen HELD (the mix's confirm taps are in Report.Outcomes).
	Confirms map[string]int
	// ConfirmErrors counts those confirms that got no final result.
	ConfirmErrors int
	// SignupReads counts GET …/signups/{u}: the watch for promotions and
	// the final check.
	SignupReads int
	// Settled is true when the activity's held count reached 0 within the
	// settle timeout after the burst; Settle is how long that took.
	Settled bool
	Settle  time.Duration
	// Checked counts users whose signup was read at the end: everyone seen
	// holding, waiting or confirmed. ConfirmedSignups counts those of them
	// who end CONFIRMED, StillHeld those who end HELD.
	Checked, ConfirmedSignups, StillHeld int
	// NoShowsConfirmed counts no-shows who end CONFIRMED.
	NoShowsConfirmed int
	// LostHolds counts confirmers seen HELD who end without a seat, although
	// no confirm of theirs answered HOLD_EXPIRED or NOT_HELD and they never
	// cancelled: their hold vanished.
	LostHolds int
	// LostSeats counts users whose confirmed seat (a CONFIRMED or GRANTED
	// answer not given back by a CANCELLED of their own) is gone at the end.
	LostSeats int
	// Examples lists the first few users behind the counts above.
	Examples []string
}

// userHold is what loadgen knows of one user of a hold burst.
type userHold struct {
	held   bool // seen HELD at least once
	waited bool // seen WAITING at least once
	queued bool // a follow-up confirm is queued or in flight
	// waitAt is the place (wire.Place of seq and index) of the request
	// that put the user in line; 0 when not known to wait. lastAt is the
	// place of the latest result whose status was taken in.
	waitAt  uint64
	lastAt  uint64
	lapsed  bool // a confirm answered HOLD_EXPIRED or NOT_HELD
	seats   int  // CONFIRMED and GRANTED answers: seats confirmed to the user
	cancels int  // CANCELLED answers to the user's own cancels
	final   client.Status
	found   bool // the final read found a signup
}

// holds follows the seats of a burst against an activity with a hold: it
// confirms, for every user who is not a no-show, each seat they are seen
// holding (from their own HELD result, a cancel's promotion, or a read of
// their signup while they wait, since an expiry promotes without a result
// loadgen sees), and afterwards reads how every seat ended.
type holds struct {
	r   *runner
	set holdSettings

	mu      sync.Mutex
	users   map[int64]*userHold
	waiters map[int64]struct{} // users with waitAt > 0
	q       confirmQueue
	tally   holdTally

	wg      sync.WaitGroup
	stop    chan struct{}
	workers []*worker
	report  HoldReport
}

// holdSettings are the run's hold parameters.
type holdSettings struct {
	hold   time.Duration
	noShow float64
	seed   uint64
	tick   time.Duration // the watch's period
}

// confirmQueue is the users waiting for a follow-up confirm (under mu).
type confirmQueue struct {
	cond    *sync.Cond // signals users and closed
	users   []int64    // users to confirm
	pending int        // confirms queued or in flight
	closed  bool
}

// holdTally counts the confirms and the signup reads (under mu).
type holdTally struct {
	confirms map[string]int
	errors   int
	reads    int
}

// confirmers is the number of goroutines sending follow-up confirms.
const confirmers = 8

// watchRun is how many WAITING users in a row end one round of the watch:
// the waitlist is FIFO, so a waiter is promoted only after those ahead.
// More than one tolerates a queue order known only approximately.
const watchRun = 4

func newHolds(r *runner, hold time.Duration) *holds {
	h := &holds{r: r, set: holdSettings{hold: hold, noShow: r.cfg.NoShow, seed: r.cfg.Seed},
		users: map[int64]*userHold{}, waiters: map[int64]struct{}{}, tally: holdTally{confirms: map[string]int{}},
		stop: make(chan struct{})}
	h.q.cond = sync.NewCond(&h.mu)
	h.set.tick = min(max(hold/5, 20*time.Millisecond), 250*time.Millisecond)
	return h
}

// start launches the confirmers and the watch; they run until finish.
func (h *holds) start(ctx context.Context) {
	for i := range confirmers + 1 {
		h.workers = append(h.workers, h.r.newWorker(uint64(1_000_000+i)))
	}
	for _, w := range h.workers[:confirmers] {
		h.wg.Go(func() { h.confirmLoop(ctx, w) })
	}
	h.wg.Go(func() { h.watch(ctx, h.workers[confirmers]) })
}

func (h *holds) user(u int64) *userHold {
	s := h.users[u]
	if s == nil {
		s = &userHold{}
		h.users[u] = s
	}
	return s
}

// observe takes in the final result of a planned request of user.
func (h *holds) observe(user int64, res *client.Result) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.user(user)
	switch res.Outcome {
	case client.Confirmed, client.Granted:
		s.seats++
	case client.Cancelled:
		s.cancels++
	case client.HoldExpired:
		s.lapsed = true
	case client.NotHeld:
		s.lapsed = s.lapsed || s.held
	}
	// One user's taps may be in flight on several workers at once, and
	// their results come back in any order: a status older than one taken
	// in already is stale. Requests are applied in place order, (seq,
	// index): several of them may share a message.
	at := placeOf(res)
	if res.Status != nil && (at == 0 || at >= s.lastAt) {
		s.lastAt = max(s.lastAt, at)
		h.status(user, s, *res.Status, at)
	}
	for _, p := range promotedBy(res) {
		if ps := h.user(p); at == 0 || at >= ps.lastAt {
			ps.lastAt = max(ps.lastAt, at)
			h.status(p, ps, client.StatusHeld, 0)
		}
	}
}

// placeOf is the place res was applied at, as one number that orders as
// (seq, index) do (wire.Place); 0 when res names none.
func placeOf(res *client.Result) uint64 {
	if res.Seq == 0 {
		return 0
	}
	return wire.Place(res.Seq, res.Index)
}

func promotedBy(res *client.Result) []int64 {
	if res.PromotedUserID != nil && !slices.Contains(res.PromotedUserIDs, *res.PromotedUserID) {
		return append([]int64{*res.PromotedUserID}, res.PromotedUserIDs...)
	}
	return res.PromotedUserIDs
}

// status records that user was seen with st, at the place of the request
// that showed it (0 from a read); h.mu is held.
func (h *holds) status(user int64, s *userHold, st client.Status, at uint64) {
	switch st {
	case client.StatusHeld:
		s.held = true
		h.unwait(user, s)
		h.enqueue(user, s)
	case client.StatusWaiting:
		// The earliest place seen while waiting: an ALREADY_WAITING may be
		// recorded before the WAITING that put the user in line.
		if at > 0 && (s.waitAt == 0 || at < s.waitAt) {
			s.waitAt = at
		}
		if s.waitAt == 0 {
			s.waitAt = ^uint64(0) // in line, place unknown: watched last
		}
		s.waited = true
		h.waiters[user] = struct{}{}
	default:
		h.unwait(user, s)
	}
}

func (h *holds) unwait(user int64, s *userHold) {
	s.waitAt = 0
	delete(h.waiters, user)
}

// enqueue queues a confirm for a user who confirms; h.mu is held.
func (h *holds) enqueue(user int64, s *userHold) {
	if s.queued || noShow(user, h.set.seed, h.set.noShow) {
		return
	}
	s.queued = true
	h.q.pending++
	h.q.users = append(h.q.users, user)
	h.q.cond.Signal()
}

func (h *holds) confirmLoop(ctx context.Context, w *worker) {
	for {
		h.mu.Lock()
		for len(h.q.users) == 0 && !h.q.closed {
			h.q.cond.Wait()
		}
		if len(h.q.users) == 0 {
			h.mu.Unlock()
			return
		}
		u := h.q.users[0]
		h.q.users = h.q.users[1:]
		h.mu.Unlock()
		h.confirm(ctx, w, u)
	}
}

// confirm sends user's confirm and follows it to its result.
func (h *holds) confirm(ctx context.Context, w *worker, user int64) {
	c := w.clientFor(user)
	res, ack, err := c.Submit(ctx, client.Write{Op: client.OpConfirm, Activity: h.r.cfg.Activity, User: user})
	if err == nil && res == nil {
		res, err = c.Wait(ctx, ack.RequestID)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.user(user)
	s.queued = false
	h.q.pending--
	if err != nil {
		h.tally.errors++
		h.r.sample("confirm: " + err.Error())
		return
	}
	h.tally.confirms[string(res.Outcome)]++
	switch res.Outcome {
	case client.Confirmed:
		s.seats++
	case client.HoldExpired, client.NotHeld:
		s.lapsed = true
	}
	if at := placeOf(res); res.Status != nil && (at == 0 || at >= s.lastAt) {
		s.lastAt = max(s.lastAt, at)
		h.status(user, s, *res.Status, 0)
	}
}

// watch reads the signups of waiting users, in line order, every tick:
// an expiry promotes the head of the line without a result loadgen sees,
// and the promoted user must confirm before the hold lapses. A round stops
// after watchRun users in a row still wait.
func (h *holds) watch(ctx context.Context, w *worker) {
	t := time.NewTicker(h.set.tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.stop:
			return
		case <-t.C:
		}
		h.mu.Lock()
		line := make([]int64, 0, len(h.waiters))
		for u := range h.waiters {
			line = append(line, u)
		}
		slices.SortFunc(line, func(a, b int64) int {
			return cmp.Or(cmp.Compare(h.users[a].waitAt, h.users[b].waitAt), cmp.Compare(a, b))
		})
		h.mu.Unlock()
		run := 0
		for _, u := range line {
			if run >= watchRun || ctx.Err() != nil {
				break
			}
			st, found, err := h.read(ctx, w, u)
			if err != nil {
				break
			}
			h.mu.Lock()
			s := h.user(u)
			switch {
			case s.waitAt == 0:
				// A result moved the user meanwhile; it knows better.
			case !found:
				h.unwait(u, s)
			default:
				h.status(u, s, st, 0)
			}
			h.mu.Unlock()
			if found && st == client.StatusWaiting {
				run++
			} else {
				run = 0
			}
		}
	}
}

// read reads user's signup; found is false when there is none.
func (h *holds) read(ctx context.Context, w *worker, user int64) (client.Status, bool, error) {
	h.mu.Lock()
	h.tally.reads++
	h.mu.Unlock()
	st, err := w.api.c.Signup(ctx, h.r.cfg.Activity, user)
	if errors.Is(err, client.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return st.Status, true, nil
}

// idle reports whether no confirm is queued or in flight.
func (h *holds) idle() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.q.pending == 0
}

// settle waits, after the burst, until the activity holds no seat and no
// confirm is under way, or timeout; then it stops the confirmers and the
// watch and reads every user's signup once.
func (h *holds) settle(ctx context.Context, timeout time.Duration, state func(context.Context) (*State, error)) {
	start := time.Now()
	deadline := start.Add(timeout)
	for ctx.Err() == nil {
		st, err := state(ctx)
		if err == nil && st != nil && st.Held == 0 && h.idle() {
			h.report.Settled = true
			break
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(h.set.tick):
		}
	}
	h.report.Settle = time.Since(start)
	h.finish()
	h.check(ctx)
}

// finish stops the confirmers (after the queue drains) and the watch.
func (h *holds) finish() {
	h.mu.Lock()
	if h.q.closed {
		h.mu.Unlock()
		return
	}
	h.q.closed = true
	h.q.cond.Broadcast()
	h.mu.Unlock()
	close(h.stop)
	h.wg.Wait()
}

// check reads the final signup of every user loadgen saw take a seat or
// wait, over the holds' workers.
func (h *holds) check(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	h.mu.Lock()
	// Only these can end with a seat or in line; a user who only ever
	// heard SOLD_OUT needs no read.
	users := make([]int64, 0, len(h.users))
	for u, s := range h.users {
		if s.held || s.waited || s.seats > 0 || s.cancels > 0 {
			users = append(users, u)
		}
	}
	h.mu.Unlock()
	slices.Sort(users)
	next := make(chan int64)
	var wg sync.WaitGroup
	for _, w := range h.workers {
		wg.Go(func() {
			for u := range next {
				st, found, err := h.read(ctx, w, u)
				h.mu.Lock()
				if err != nil {
					h.tally.errors++
					h.r.sample("read signup: " + err.Error())
				} else {
					s := h.users[u]
					s.final, s.found = st, found
				}
				h.mu.Unlock()
			}
		})
	}
	for _, u := range users {
		next <- u
	}
	close(next)
	wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	rep := &h.report
	rep.Hold, rep.NoShow = h.set.hold, h.set.noShow
	rep.Confirms, rep.ConfirmErrors, rep.SignupReads = h.tally.confirms, h.tally.errors, h.tally.reads
	example := func(format string, u int64) {
		if len(rep.Examples) < maxSamples {
			rep.Examples = append(rep.Examples, fmt.Sprintf(format, u))
		}
	}
	for _, u := range users {
		s := h.users[u]
		ns := noShow(u, h.set.seed, h.set.noShow)
		if s.held {
			rep.HeldUsers++
			if ns {
				rep.NoShowsHeld++
			}
		}
		rep.Checked++
		switch s.final {
		case client.StatusConfirmed:
			rep.ConfirmedSignups++
			if ns {
				rep.NoShowsConfirmed++
				example("no-show %d ends CONFIRMED", u)
			}
		case client.StatusHeld:
			rep.StillHeld++
			example("user %d is still HELD", u)
		}
		net := s.seats - s.cancels
		if net > 1 {
			h.r.holdDoubles = append(h.r.holdDoubles, u)
		}
		gone := s.final != client.StatusConfirmed
		switch {
		case net >= 1 && gone:
			rep.LostSeats++
			example("user %d lost a confirmed seat", u)
		case s.held && !ns && gone && s.final != client.StatusHeld && !s.lapsed && s.cancels == 0 && s.seats == 0:
			rep.LostHolds++
			example("confirmer %d lost a hold without HOLD_EXPIRED", u)
		}
	}
}
