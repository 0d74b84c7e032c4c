package ingest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// burst sends n claims for activity at once (users from 1000 on) and
// returns every answer: status and body.
func (h *harness) burst(activity int64, n int) (codes []int, bodies [][]byte) {
	h.t.Helper()
	return h.burstQuery(activity, n, "")
}

// burstQuery is burst with query added to every claim's URL.
func (h *harness) burstQuery(activity int64, n int, query string) (codes []int, bodies [][]byte) {
	h.t.Helper()
	codes, bodies = make([]int, n), make([][]byte, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			r, err := http.NewRequest("POST", fmt.Sprintf("%s/v1/activities/%d/claims/%d%s", h.srv.URL, activity, 1000+i, query), nil)
			if err != nil {
				h.t.Error(err)
				return
			}
			resp, err := h.cl.Do(r)
			if err != nil {
				h.t.Errorf("claim %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				h.t.Errorf("claim %d: %v", i, err)
				return
			}
			codes[i], bodies[i] = resp.StatusCode, b
		})
	}
	close(start)
	wg.Wait()
	return codes, bodies
}

// requestAt is the request id stored at place, read from the stream.
func (h *harness) requestAt(place uint64) string {
	h.t.Helper()
	ctx := context.Background()
	st := h.requestStream()
	m, err := st.GetMsg(ctx, wire.SeqOf(place))
	if err != nil {
		h.t.Fatalf("seq %d: %v", wire.SeqOf(place), err)
	}
	ds, err := wire.DecodeMessage(m.Subject, m.Header.Get(wire.BatchHeader), m.Data)
	if err != nil || wire.IndexOf(place) >= len(ds) {
		h.t.Fatalf("place %s: %d requests, %v", wire.FormatPlace(place), len(ds), err)
	}
	return ds[wire.IndexOf(place)].Request.RequestID
}

// fullView makes activity full in h's shedding views, at the place of the
// activity's last message: user 1 holds its one seat.
func (h *harness) fullView(activity int64) {
	h.t.Helper()
	m := h.lastMsg(wire.RequestSubject(activity))
	h.svc.shed.PutView(wire.View{ActivityID: activity, Capacity: 1, Confirmed: 1, Seq: m.Sequence,
		Complete: true, Holders: []int64{1}})
}

// TestBurstIsBatchedAndShed: 600 concurrent claims for one full activity
// through the HTTP handler are stored as far fewer messages than requests,
// in batches, and shed: every shed answer names a distinct place, and the
// stream holds the claim's own request at that place.
func TestBurstIsBatchedAndShed(t *testing.T) {
	t.Parallel()
	const n = 600
	h := newHarness(t, nil)
	const act = 5
	resp, body := h.do(req{method: "PUT", path: "/v1/activities/5", body: `{"capacity": 1}`})
	accepted(t, "open", resp, body)
	h.fullView(act)
	codes, bodies := h.burst(act, n)
	places := map[uint64]string{}
	shed := 0
	for i := range n {
		switch codes[i] {
		case http.StatusOK:
			r := decode[wire.Result](t, "shed claim", bodies[i])
			if !r.Shed || r.Outcome != wire.OutcomeSoldOut || r.UserID != int64(1000+i) {
				t.Fatalf("claim %d: %+v, want a shed SOLD_OUT", i, r)
			}
			if other, dup := places[r.PlaceOf()]; dup {
				t.Fatalf("claims %s and %s both shed at %s", other, r.RequestID, wire.FormatPlace(r.PlaceOf()))
			}
			places[r.PlaceOf()] = r.RequestID
			if got := h.requestAt(r.PlaceOf()); got != r.RequestID {
				t.Fatalf("claim %s shed at %s, which holds %s", r.RequestID, wire.FormatPlace(r.PlaceOf()), got)
			}
			shed++
		case http.StatusAccepted:
		default:
			t.Fatalf("claim %d: %d %s", i, codes[i], bodies[i])
		}
	}
	msgs := h.subjectMsgs(wire.RequestSubject(act)) - 1 // the open
	if msgs == 0 || msgs >= n/4 {
		t.Fatalf("%d claims stored as %d messages, want far fewer", n, msgs)
	}
	if shed == 0 {
		t.Fatal("no claim of the burst was shed")
	}
	t.Logf("%d claims in %d messages, %d shed", n, msgs, shed)
}

// TestAViewArrivingDuringThePublishSheds: claims that found no view when
// they came in, and whose batch's PubAck comes back after a view arrived,
// are shed from that view rather than left to the allocator.
func TestAViewArrivingDuringThePublishSheds(t *testing.T) {
	t.Parallel()
	const n, act = 100, 8
	var h *harness
	var once sync.Once
	var openSeq uint64
	h = newHarness(t, func(c *Config, d *Deps) {
		d.Test.DropBatchAck = func(string) bool {
			// At the first batch's PubAck, once every claim has come in
			// (each registered to wait, after finding no view), the view
			// arrives.
			once.Do(func() {
				for deadline := time.Now().Add(10 * time.Second); h.svc.results.Count() < n; {
					if time.Now().After(deadline) {
						t.Errorf("only %d of %d claims waiting", h.svc.results.Count(), n)
						break
					}
					time.Sleep(time.Millisecond)
				}
				h.svc.shed.PutView(wire.View{ActivityID: act, Capacity: 1, Confirmed: 1, Seq: openSeq,
					Complete: true, Holders: []int64{1}})
			})
			return false
		}
	})
	resp, body := h.do(req{method: "PUT", path: "/v1/activities/8", body: `{"capacity": 1}`})
	accepted(t, "open", resp, body)
	openSeq = h.lastMsg(wire.RequestSubject(act)).Sequence
	codes, bodies := h.burstQuery(act, n, "?wait=2s")
	shed := 0
	for i := range n {
		switch codes[i] {
		case http.StatusOK:
			r := decode[wire.Result](t, "claim", bodies[i])
			if !r.Shed || r.Outcome != wire.OutcomeSoldOut {
				t.Fatalf("claim %d: %+v, want a shed SOLD_OUT", i, r)
			}
			shed++
		case http.StatusAccepted: // published before the view: left to the allocator
		default:
			t.Fatalf("claim %d: %d %s", i, codes[i], bodies[i])
		}
	}
	if shed < n/2 {
		t.Fatalf("%d of %d claims shed, want most: their PubAcks came after the view", shed, n)
	}
	t.Logf("%d of %d claims shed", shed, n)
}

// TestAViewArrivingWhileClaimsWaitSheds: claims stored before ingest knew
// their activity was full wait for the allocator; when the activity's view
// arrives while they wait, they are shed from it, each at its own place.
func TestAViewArrivingWhileClaimsWaitSheds(t *testing.T) {
	t.Parallel()
	const n, act = 50, 9
	h := newHarness(t, nil)
	resp, body := h.do(req{method: "PUT", path: "/v1/activities/9", body: `{"capacity": 1}`})
	accepted(t, "open", resp, body)
	open := h.lastMsg(wire.RequestSubject(act)).Sequence
	var codes []int
	var bodies [][]byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		codes, bodies = h.burstQuery(act, n, "?wait=20s")
	}()
	// Every claim stored and waiting (no allocator runs here), then the
	// view.
	testenv.WaitFor(t, 10*time.Second, "every claim stored and waiting", func() bool {
		return h.svc.results.Count() == n && h.subjectRequests(wire.RequestSubject(act)) == n+1
	})
	time.Sleep(100 * time.Millisecond)
	h.svc.shed.PutView(wire.View{ActivityID: act, Capacity: 1, Confirmed: 1, Seq: open, Complete: true, Holders: []int64{1}})
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the waiting claims were not answered when the view arrived")
	}
	places := map[uint64]bool{}
	for i := range n {
		if codes[i] != http.StatusOK {
			t.Fatalf("claim %d: %d %s, want a shed answer", i, codes[i], bodies[i])
		}
		r := decode[wire.Result](t, "claim", bodies[i])
		if !r.Shed || r.Outcome != wire.OutcomeSoldOut || places[r.PlaceOf()] {
			t.Fatalf("claim %d: %+v, want a shed SOLD_OUT at a place of its own", i, r)
		}
		if got := h.requestAt(r.PlaceOf()); got != r.RequestID {
			t.Fatalf("claim %s shed at %s, which holds %s", r.RequestID, wire.FormatPlace(r.PlaceOf()), got)
		}
		places[r.PlaceOf()] = true
	}
}

// TestUnsureClaimsAreNotShed: when no PubAck of a batch comes back, the
// batch is published again with its own Nats-Msg-Id, then each of its
// requests alone: a request may then be stored twice, its place is not
// known for sure, and it is never shed (a claim that went out alone from
// the start may be). Each is stored alone once, and each batch once.
func TestUnsureClaimsAreNotShed(t *testing.T) {
	t.Parallel()
	const n = 200
	h := newHarness(t, func(c *Config, d *Deps) {
		c.PublishTimeout = 2 * time.Second
		d.Test.DropBatchAck = func(string) bool { return true }
	})
	const act = 6
	resp, body := h.do(req{method: "PUT", path: "/v1/activities/6", body: `{"capacity": 1}`})
	accepted(t, "open", resp, body)
	h.fullView(act)
	codes, bodies := h.burst(act, n)
	ids := map[string]bool{}
	shedAlone := map[string]bool{}
	for i := range n {
		switch codes[i] {
		case http.StatusOK: // shed: only a claim that went out alone
			r := decode[wire.Result](t, "shed claim", bodies[i])
			ids[r.RequestID], shedAlone[r.RequestID] = true, true
		case http.StatusAccepted:
			ack := decode[wire.Ack](t, "claim", bodies[i])
			ids[ack.RequestID] = true
		default:
			t.Fatalf("claim %d: %d %s", i, codes[i], bodies[i])
		}
	}
	// Every claim is stored alone (Nats-Msg-Id = its id) besides its
	// batches, none of them twice.
	ctx := context.Background()
	st, err := h.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	alone, batches, inBatch := map[string]int{}, map[string]int{}, map[string]bool{}
	for seq := info.State.FirstSeq + 1; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		if m.Header.Get(wire.BatchHeader) != "" {
			batches[id]++
			ds, err := wire.DecodeMessage(m.Subject, m.Header.Get(wire.BatchHeader), m.Data)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ds {
				inBatch[d.Request.RequestID] = true
			}
		} else {
			alone[id]++
		}
	}
	for id := range ids {
		if alone[id] != 1 {
			t.Fatalf("claim %s stored alone %d times, want once", id, alone[id])
		}
		if inBatch[id] && shedAlone[id] {
			t.Fatalf("claim %s, stored in a batch and alone, was shed", id)
		}
	}
	for id, k := range batches {
		if k != 1 {
			t.Fatalf("batch %s stored %d times, want once", id, k)
		}
	}
	if len(batches) == 0 {
		t.Fatal("no batch was published: the test proves nothing")
	}
}

// TestBurstResultsHaveDistinctPlaces: 500 concurrent claims for one
// activity, stored in batches, are applied by the allocator: each
// accepted request has a result, and no two results share a place.
func TestBurstResultsHaveDistinctPlaces(t *testing.T) {
	t.Parallel()
	const n = 500
	h := newHarness(t, nil)
	startAllocator(t, h)
	const act = 7
	resp, body := h.do(req{method: "PUT", path: "/v1/activities/7?wait=10s", body: `{"capacity": 10}`})
	wantStatus(t, "open", resp, body, http.StatusOK)
	codes, bodies := h.burst(act, n)
	var ids []string
	for i := range n {
		switch codes[i] {
		case http.StatusAccepted:
			ids = append(ids, decode[wire.Ack](t, "claim", bodies[i]).RequestID)
		case http.StatusOK:
			ids = append(ids, decode[wire.Result](t, "claim", bodies[i]).RequestID)
		default:
			t.Fatalf("claim %d: %d %s", i, codes[i], bodies[i])
		}
	}
	if msgs := h.subjectMsgs(wire.RequestSubject(act)) - 1; msgs >= n/4 {
		t.Fatalf("%d claims stored as %d messages, want far fewer", n, msgs)
	}
	places := map[uint64]string{}
	granted := 0
	for _, id := range ids {
		r := pollDone(t, h, id, 30*time.Second)
		if other, dup := places[r.PlaceOf()]; dup {
			t.Fatalf("%s and %s both at %s", other, id, wire.FormatPlace(r.PlaceOf()))
		}
		places[r.PlaceOf()] = id
		if got := h.requestAt(r.PlaceOf()); got != id {
			t.Fatalf("%s recorded at %s, which holds %s", id, wire.FormatPlace(r.PlaceOf()), got)
		}
		if r.Outcome == wire.OutcomeGranted {
			granted++
		}
	}
	if granted != 10 {
		t.Fatalf("%d claims granted on an activity of 10 seats", granted)
	}
	h.db.CheckInvariants(t)
}

// subjectRequests is how many requests the messages stored on subject
// carry (a batch as its Allot-Batch).
func (h *harness) subjectRequests(subject string) int {
	h.t.Helper()
	ctx := context.Background()
	st := h.requestStream()
	info, err := st.Info(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	n := 0
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			h.t.Fatal(err)
		}
		if m.Subject != subject {
			continue
		}
		if b := m.Header.Get(wire.BatchHeader); b != "" {
			k, err := strconv.Atoi(b)
			if err != nil {
				h.t.Fatalf("seq %d: %s %q", seq, wire.BatchHeader, b)
			}
			n += k
		} else {
			n++
		}
	}
	return n
}
