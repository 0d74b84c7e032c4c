package loadgen

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// fakeServer is an in-memory claim API with allot's routes that answers
// the way an asynchronous server can: some writes 202 then pending polls,
// some 429s first. bug makes it misbehave on purpose.
type fakeServer struct {
	mu       sync.Mutex
	capacity int64
	owners   map[int64]int
	grants   int64
	results  map[string]wire.Result
	polled   map[string]int
	seq      atomic.Int64

	bug        string // "", "oversell", "undersell", "double", "lie"; with a hold "keep-held", "expire-confirmed", "lose-hold"
	async      bool   // answer every write 202
	throttleN  atomic.Int64
	throttleOf int64 // answer every throttleOf-th write 429 (0 = never)

	// An open with a hold switches to the hold rules (serveHold): joins,
	// cancels, confirms and signups are served, every seat is HELD first
	// and lapses after hold, promoting the head of the line.
	hold    time.Duration
	signups map[int64]*fakeSignup
	line    []int64 // the waitlist, head first
	seats   int64   // HELD and CONFIRMED signups
	timers  []*time.Timer
}

type fakeSignup struct {
	status  wire.Status
	holdSeq int64 // the seq of the request that created the current hold
}

func newFake(bug string) *fakeServer {
	return &fakeServer{owners: map[int64]int{}, results: map[string]wire.Result{}, polled: map[string]int{}, bug: bug}
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	hold := f.hold
	f.mu.Unlock()
	if hold > 0 {
		f.serveHold(w, r)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/activities/{a}", f.open)
	mux.HandleFunc("GET /v1/activities/{a}", f.state)
	mux.HandleFunc("POST /v1/activities/{a}/claims/{u}", f.claim)
	mux.HandleFunc("GET /v1/requests/{id}", f.poll)
	mux.ServeHTTP(w, r)
}

func (f *fakeServer) open(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Capacity int64
		Hold     wire.Duration
	}
	json.NewDecoder(r.Body).Decode(&body) //nolint:errcheck // a zero capacity fails the test anyway
	f.mu.Lock()
	f.capacity = body.Capacity
	f.owners = map[int64]int{}
	f.grants = 0
	f.hold = time.Duration(body.Hold)
	f.signups, f.line, f.seats = map[int64]*fakeSignup{}, nil, 0
	f.mu.Unlock()
	fakeJSON(w, 200, wire.Result{RequestID: "open", State: wire.StateDone, Op: wire.OpOpen, Outcome: wire.OutcomeOpened})
}

func (f *fakeServer) state(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	confirmed := f.grants
	if f.bug == "lie" && confirmed > 0 {
		confirmed-- // the counter drifted from the results
	}
	fakeJSON(w, 200, State{Capacity: f.capacity, Confirmed: confirmed, Remaining: f.capacity - confirmed})
}

func (f *fakeServer) claim(w http.ResponseWriter, r *http.Request) {
	if f.throttleOf > 0 && f.throttleN.Add(1)%f.throttleOf == 0 {
		w.Header().Set("Retry-After", "1")
		fakeJSON(w, http.StatusTooManyRequests, map[string]string{"error": "Too many requests."})
		return
	}
	u, _ := strconv.ParseInt(r.PathValue("u"), 10, 64)
	id := fmt.Sprintf("req-%d", f.seq.Add(1))
	f.mu.Lock()
	limit := f.capacity
	switch f.bug {
	case "oversell":
		limit += 5
	case "undersell":
		limit--
	}
	out := wire.OutcomeSoldOut
	switch {
	case f.owners[u] > 0 && (f.bug != "double" || f.owners[u] > 1):
		out = wire.OutcomeAlreadyOwned
	case f.grants < limit:
		f.owners[u]++
		f.grants++
		out = wire.OutcomeGranted
	}
	res := wire.Result{RequestID: id, State: wire.StateDone, Op: wire.OpClaim, UserID: u, Outcome: out}
	if f.async {
		f.results[id] = res
	}
	f.mu.Unlock()
	if f.async {
		w.Header().Set("Location", "/v1/requests/"+id)
		fakeJSON(w, http.StatusAccepted, wire.Ack{RequestID: id, State: wire.StatePending})
		return
	}
	fakeJSON(w, 200, res)
}

// poll answers pending once per request, then the result.
func (f *fakeServer) poll(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	f.mu.Lock()
	res, ok := f.results[id]
	f.polled[id]++
	first := f.polled[id] == 1
	f.mu.Unlock()
	switch {
	case !ok:
		fakeJSON(w, http.StatusNotFound, map[string]string{"error": "Unknown request."})
	case first:
		fakeJSON(w, 200, wire.Ack{RequestID: id, State: wire.StatePending})
	default:
		fakeJSON(w, 200, res)
	}
}

func fakeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client is gone; nothing to do
}

// serveHold serves the routes under a hold, every write answered at once.
func (f *fakeServer) serveHold(w http.ResponseWriter, r *http.Request) {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/activities/{a}", f.open)
	mux.HandleFunc("GET /v1/activities/{a}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		var held int64
		for _, s := range f.signups {
			if s.status == wire.StatusHeld {
				held++
			}
		}
		fakeJSON(w, 200, State{Capacity: f.capacity, Confirmed: f.seats, Held: held, Waiting: int64(len(f.line)),
			Remaining: f.capacity - f.seats, Hold: f.hold.String()})
	})
	mux.HandleFunc("GET /v1/activities/{a}/signups/{u}", func(w http.ResponseWriter, r *http.Request) {
		u, _ := strconv.ParseInt(r.PathValue("u"), 10, 64)
		f.mu.Lock()
		defer f.mu.Unlock()
		s := f.signups[u]
		if s == nil {
			fakeJSON(w, http.StatusNotFound, map[string]string{"error": "No signup."})
			return
		}
		fakeJSON(w, 200, map[string]any{"user_id": u, "status": s.status})
	})
	for _, op := range []struct {
		route string
		op    wire.Op
	}{
		{"POST /v1/activities/{a}/claims/{u}", wire.OpClaim},
		{"POST /v1/activities/{a}/signups/{u}", wire.OpJoin},
		{"DELETE /v1/activities/{a}/signups/{u}", wire.OpCancel},
		{"POST /v1/activities/{a}/signups/{u}/confirm", wire.OpConfirm},
	} {
		mux.HandleFunc(op.route, func(w http.ResponseWriter, r *http.Request) {
			u, _ := strconv.ParseInt(r.PathValue("u"), 10, 64)
			fakeJSON(w, 200, f.applyHold(op.op, u))
		})
	}
	mux.ServeHTTP(w, r)
}

// applyHold applies one write under the hold rules (docs/architecture.md).
func (f *fakeServer) applyHold(op wire.Op, u int64) wire.Result {
	seq := f.seq.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	res := wire.Result{RequestID: fmt.Sprintf("req-%d", seq), State: wire.StateDone, Op: op, UserID: u, Seq: uint64(seq)}
	s := f.signups[u]
	live := s != nil && s.status != wire.StatusCancelled
	switch {
	case op == wire.OpConfirm && live && s.status == wire.StatusHeld:
		s.status, res.Outcome = wire.StatusConfirmed, wire.OutcomeConfirmed
		if f.bug == "lose-hold" {
			s.status, res.Outcome = wire.StatusCancelled, wire.OutcomeConfirmed // a confirm that drops the seat
			f.seats--
		}
	case op == wire.OpConfirm && live && s.status == wire.StatusConfirmed:
		res.Outcome = wire.OutcomeAlreadyConfirmed
	case op == wire.OpConfirm:
		res.Outcome = wire.OutcomeNotHeld
	case op == wire.OpCancel && !live:
		res.Outcome = wire.OutcomeNotSignedUp
	case op == wire.OpCancel:
		res.Outcome = wire.OutcomeCancelled
		if s.status == wire.StatusWaiting {
			f.line = slices.DeleteFunc(f.line, func(x int64) bool { return x == u })
			s.status = wire.StatusCancelled
			break
		}
		s.status = wire.StatusCancelled
		f.seats--
		if p, ok := f.promote(seq); ok {
			res.PromotedUserID = &p
		}
	case live && s.status == wire.StatusWaiting:
		res.Outcome = wire.OutcomeAlreadyWaiting
	case live && op == wire.OpClaim:
		res.Outcome = wire.OutcomeAlreadyOwned
	case live:
		res.Outcome = wire.OutcomeAlreadyConfirmed
	case f.seats < f.capacity:
		f.take(u, seq)
		res.Outcome = wire.OutcomeHeld
	case op == wire.OpClaim:
		res.Outcome = wire.OutcomeSoldOut
	default:
		f.signups[u] = &fakeSignup{status: wire.StatusWaiting}
		f.line = append(f.line, u)
		res.Outcome = wire.OutcomeWaiting
	}
	if s := f.signups[u]; s != nil && res.Outcome != wire.OutcomeSoldOut && res.Outcome != wire.OutcomeNotSignedUp {
		st := s.status
		res.Status = &st
	}
	return res
}

// take holds a seat for u and schedules the expiry; f.mu is held.
func (f *fakeServer) take(u, seq int64) {
	f.signups[u] = &fakeSignup{status: wire.StatusHeld, holdSeq: seq}
	f.seats++
	if f.bug == "keep-held" {
		return
	}
	f.timers = append(f.timers, time.AfterFunc(f.hold+wire.HoldGrace/10, func() { f.expire(u, seq) }))
}

// promote holds the freed seat for the head of the line; f.mu is held.
func (f *fakeServer) promote(seq int64) (int64, bool) {
	if len(f.line) == 0 || f.seats >= f.capacity {
		return 0, false
	}
	p := f.line[0]
	f.line = f.line[1:]
	f.take(p, seq)
	return p, true
}

// expire lapses u's hold holdSeq unless it was confirmed or replaced.
func (f *fakeServer) expire(u, holdSeq int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.signups[u]
	if s == nil || s.holdSeq != holdSeq {
		return
	}
	if s.status != wire.StatusHeld && !(f.bug == "expire-confirmed" && s.status == wire.StatusConfirmed) {
		return
	}
	s.status = wire.StatusCancelled
	f.seats--
	f.promote(f.seq.Add(1))
}

// stopTimers cancels the expiries still scheduled.
func (f *fakeServer) stopTimers() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.timers {
		t.Stop()
	}
}
