package loadgen

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

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

	bug        string // "", "oversell", "undersell", "double", "lie"
	async      bool   // answer every write 202
	throttleN  atomic.Int64
	throttleOf int64 // answer every throttleOf-th write 429 (0 = never)
}

func newFake(bug string) *fakeServer {
	return &fakeServer{owners: map[int64]int{}, results: map[string]wire.Result{}, polled: map[string]int{}, bug: bug}
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/activities/{a}", f.open)
	mux.HandleFunc("GET /v1/activities/{a}", f.state)
	mux.HandleFunc("POST /v1/activities/{a}/claims/{u}", f.claim)
	mux.HandleFunc("GET /v1/requests/{id}", f.poll)
	mux.ServeHTTP(w, r)
}

func (f *fakeServer) open(w http.ResponseWriter, r *http.Request) {
	var body struct{ Capacity int64 }
	json.NewDecoder(r.Body).Decode(&body) //nolint:errcheck // a zero capacity fails the test anyway
	f.mu.Lock()
	f.capacity = body.Capacity
	f.owners = map[int64]int{}
	f.grants = 0
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
