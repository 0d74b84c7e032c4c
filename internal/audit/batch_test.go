package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/store/waitlist"
	"github.com/allot-dev/allot/internal/wire"
)

// publishBatch stores one message on subject carrying bodies as a batch
// (wire.BatchHeader n, unless header overrides it), under a fresh
// Nats-Msg-Id, and returns its stream sequence.
func (e *env) publishBatch(subject string, header string, bodies ...[]byte) uint64 {
	e.t.Helper()
	if header == "" {
		header = strconv.Itoa(len(bodies))
	}
	msg := nats.NewMsg(subject)
	msg.Header.Set(wire.BatchHeader, header)
	msg.Header.Set(nats.MsgIdHdr, uuid.NewString())
	msg.Data = wire.EncodeBatch(bodies)
	ack, err := e.js.PublishMsg(context.Background(), msg)
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

// body is r as a request message's body (or one request of a batch).
func body(t testing.TB, r wire.Request) []byte {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBatchesReplayAtTheirPlaces needs no allocator: a hand-built stream
// of single messages and batches for one activity, and the rows an
// allocator applying them must leave, written by hand at the places the
// design gives them (seq, index). The audit is clean; a tampered result
// or signup of a batched request is reported at its place "seq#index";
// a batch malformed as a whole is expected refused at (seq, 0), a
// malformed request of a batch alone at (seq, i); a repeat of a request
// id, in the same batch or a later message, is skipped.
func TestBatchesReplayAtTheirPlaces(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	open := openReq(7, 1)
	a, b, c, d, f := newReq(wire.OpJoin, 7, 1), newReq(wire.OpJoin, 7, 2), newReq(wire.OpJoin, 7, 3), newReq(wire.OpJoin, 7, 4), newReq(wire.OpCancel, 7, 1)
	subject := wire.RequestSubject(7)
	bad := []byte(`{"request_id":"not-a-uuid","op":"join","activity_id":7,"user_id":5}`)

	s1 := e.publish(open, "")                                                              // 1: open
	s2 := e.publishBatch(subject, "", body(t, a), body(t, b), body(t, c), bad, body(t, a)) // 2: joins, a malformed one, a repeat of a
	s3 := e.publish(d, "")                                                                 // 3: a single join
	s4 := e.publishBatch(subject, "2", body(t, d))                                         // 4: says 2, carries 1: malformed whole
	s5 := e.publishBatch(subject, "", body(t, f), body(t, b))                              // 5: a cancel, a repeat of b from message 2
	if s1 != 1 || s5 != 5 {
		t.Fatalf("stored at %d..%d, want 1..5", s1, s5)
	}
	p := wire.Place

	// What the allocator records for that stream.
	result := func(place uint64, r wire.Request, outcome, status string, position, capacity any, promoted, events string) {
		e.exec(`INSERT INTO processed_request (partition_id, seq, batch_index, request_id, op, activity_id, user_id, outcome, status, position,
			promoted_user_ids, capacity, events, applied_at) VALUES (0, ?, ?, ?, ?, ?, ?, ?, NULLIF(?, ''), ?, NULLIF(?, ''), ?, NULLIF(?, ''), NOW(6))`,
			wire.SeqOf(place), wire.IndexOf(place), r.RequestID, r.Op, r.ActivityID, r.UserID, outcome, status, position, promoted, capacity, events)
	}
	result(p(s1, 0), open, "OPENED", "", nil, 1, "", "opened:0")
	result(p(s2, 0), a, "CONFIRMED", "CONFIRMED", nil, nil, "", "confirmed:1;sold_out:0")
	result(p(s2, 1), b, "WAITING", "WAITING", 1, nil, "", "waitlisted:2")
	result(p(s2, 2), c, "WAITING", "WAITING", 2, nil, "", "waitlisted:3")
	result(p(s3, 0), d, "WAITING", "WAITING", 3, nil, "", "waitlisted:4")
	result(p(s5, 0), f, "CANCELLED", "CANCELLED", nil, nil, "[2]", "cancelled:1;promoted:2")
	for _, r := range []uint64{p(s2, 3), p(s4, 0)} {
		e.exec("INSERT INTO rejected_message (seq, batch_index, subject, reason, rejected_at) VALUES (?, ?, ?, 'malformed', NOW(6))",
			wire.SeqOf(r), wire.IndexOf(r), subject)
	}
	e.exec("INSERT INTO activity (id, capacity, confirmed_count, next_seq, hold_ns, held_count, waiting_count) VALUES (7, 1, 1, ?, 0, 0, 2)", p(s5, 0)+1)
	for _, bk := range waitlist.Build([]uint64{p(s2, 2), p(s3, 0)}, 0).Buckets() {
		e.exec("INSERT INTO waitlist_bucket (activity_id, first_seq, waiting) VALUES (7, ?, ?)", bk.FirstSeq, bk.Waiting)
	}
	for _, s := range []struct {
		user   int64
		status string
		queue  uint64
	}{{1, "CANCELLED", p(s2, 0)}, {2, "CONFIRMED", p(s2, 1)}, {3, "WAITING", p(s2, 2)}, {4, "WAITING", p(s3, 0)}} {
		e.exec("INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (7, ?, ?, ?)", s.user, s.status, s.queue)
	}
	e.exec("INSERT INTO allocator_partition (partition_id, last_seq) VALUES (0, ?)", s5)

	rep := e.audit(audit.Config{})
	if !rep.OK {
		t.Fatalf("hand-built batches: want no divergence, got %d:%s", len(rep.Divergences), divergences(rep.Divergences))
	}
	want := audit.Report{
		ActivitiesChecked: 1, Replayed: 1 + 5 + 1 + 1 + 2, Messages: 5, Compared: 6, Skipped: 2, Malformed: 2,
		LastSeq: s5, Fence: s5, WindowStart: 1, VerifiedFrom: 1, VerifiedTo: s5, OK: true,
	}
	got := rep
	got.Divergences = nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("report = %+v, want %+v", got, want)
	}

	tests := []struct {
		tamperCase
		// wrongPlace: the tampering also leaves a row at another place
		// of the message, a second divergence.
		wrongPlace bool
	}{
		{tamperCase: tamperCase{
			name:    "outcome of a batched request",
			tamper:  []string{"UPDATE processed_request SET outcome = 'TAMPERED' WHERE seq = 2 AND batch_index = 2"},
			restore: []string{"UPDATE processed_request SET outcome = 'WAITING' WHERE seq = 2 AND batch_index = 2"},
			want: audit.Divergence{Seq: s2, Index: 2, RequestID: c.RequestID, Kind: audit.KindResult,
				ActivityID: 7, UserID: 3, Field: "outcome", Expected: "WAITING", Actual: "TAMPERED"},
		}},
		{tamperCase: tamperCase{
			name:    "status of a batched request's signup",
			tamper:  []string{"UPDATE activity_signup SET status = 'CANCELLED' WHERE activity_id = 7 AND user_id = 3"},
			restore: []string{"UPDATE activity_signup SET status = 'WAITING' WHERE activity_id = 7 AND user_id = 3"},
			want: audit.Divergence{Seq: s2, Index: 2, RequestID: c.RequestID, Kind: audit.KindSignup,
				ActivityID: 7, UserID: 3, Field: "status", Expected: "WAITING", Actual: "CANCELLED"},
		}},
		{tamperCase: tamperCase{
			name:    "a malformed request of a batch not recorded as rejected",
			tamper:  []string{"DELETE FROM rejected_message WHERE seq = 2 AND batch_index = 3"},
			restore: []string{"INSERT INTO rejected_message (seq, batch_index, subject, reason, rejected_at) VALUES (2, 3, 'alloc.req.7', 'malformed', NOW(6))"},
			want:    audit.Divergence{Seq: s2, Index: 3, Kind: audit.KindNotRejected, Expected: "a rejected_message row", Actual: "none"},
		}},
		{wrongPlace: true, tamperCase: tamperCase{
			name:    "a malformed batch is refused at index 0",
			tamper:  []string{"UPDATE rejected_message SET batch_index = 1 WHERE seq = 4"},
			restore: []string{"UPDATE rejected_message SET batch_index = 0 WHERE seq = 4"},
			want:    audit.Divergence{Seq: s4, Kind: audit.KindNotRejected, Expected: "a rejected_message row", Actual: "none"},
		}},
		{wrongPlace: true, tamperCase: tamperCase{
			name:    "a result at the place of a repeat inside a batch",
			tamper:  []string{"UPDATE processed_request SET batch_index = 4 WHERE seq = 2 AND batch_index = 0"},
			restore: []string{"UPDATE processed_request SET batch_index = 0 WHERE seq = 2 AND batch_index = 4"},
			want: audit.Divergence{Seq: s2, RequestID: a.RequestID, Kind: audit.KindResultMissing,
				ActivityID: 7, UserID: 1, Expected: "a processed_request row with outcome CONFIRMED", Actual: "none"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.wrongPlace {
				wrongPlace(t, e, tt.tamperCase)
				return
			}
			rep, _ := e.auditTampered(t, tt.tamperCase)
			var text bytes.Buffer
			rep.WriteText(&text) //nolint:errcheck
			if line := "DIVERGENCE seq " + wire.FormatPlace(p(tt.want.Seq, tt.want.Index)) + " request_id "; !strings.Contains(text.String(), line) {
				t.Fatalf("text report lacks %q:\n%s", line, text.String())
			}
		})
	}
	if rep := e.audit(audit.Config{}); !rep.OK {
		t.Fatalf("after restoring: %s", divergences(rep.Divergences))
	}
}

// wrongPlace applies tc.tamper, audits, restores, and fails t unless the
// audit reported tc.want and one more divergence naming a row at another
// place of the same message: a refusal or result recorded at the wrong
// index.
func wrongPlace(t *testing.T, e *env, tc tamperCase) {
	t.Helper()
	for _, q := range tc.tamper {
		e.exec(q)
	}
	rep := e.audit(audit.Config{})
	for _, q := range tc.restore {
		e.exec(q)
	}
	if len(rep.Divergences) != 2 {
		t.Fatalf("want two divergences, got %d:%s", len(rep.Divergences), divergences(rep.Divergences))
	}
	var found, other bool
	for _, d := range rep.Divergences {
		d.Detail = ""
		switch {
		case d == tc.want:
			found = true
		case d.Seq == tc.want.Seq && d.Index != tc.want.Index &&
			(d.Kind == audit.KindRejectedUnexpected || d.Kind == audit.KindResultUnexpected):
			other = true
		}
	}
	if !found || !other {
		t.Fatalf("want %+v and a row at another place of seq %d, got:%s", tc.want, tc.want.Seq, divergences(rep.Divergences))
	}
}

// TestAllocatedBatchesAuditClean: a stream of single messages and batches
// for one activity (every op but void, repeats of request ids inside a
// batch and across messages, a batch malformed as a whole and a batch with
// one malformed request), applied by the real allocator, audits clean; a
// tampered result of a batched request is reported at its place
// "seq#2"; the malformed batch is refused at (seq, 0), the malformed
// request alone at its place.
func TestAllocatedBatchesAuditClean(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	reqs := burst(800, 1, 6, 25, 0x9e3779b97f4a7c15)
	subject := wire.RequestSubject(1)
	x := uint64(12345)
	next := func(n uint64) int { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return int(x % n) }
	var (
		last    uint64
		batched []uint64 // the batches of three requests or more
		total   int      // requests stored
		msgs    int
	)
	for i := 0; i < len(reqs); {
		n := min(1+next(8), len(reqs)-i)
		if n == 1 {
			last = e.publish(reqs[i], "")
			i, total, msgs = i+1, total+1, msgs+1
			continue
		}
		bodies := make([][]byte, 0, n+1)
		for _, r := range reqs[i : i+n] {
			bodies = append(bodies, body(t, r))
		}
		if next(4) == 0 {
			// A repeat: of this batch's first request, or of one applied
			// in an earlier message.
			bodies = append(bodies, body(t, reqs[next(uint64(i+1))]))
		}
		last = e.publishBatch(subject, "", bodies...)
		if n >= 3 {
			batched = append(batched, last)
		}
		i, total, msgs = i+n, total+len(bodies), msgs+1
	}
	badBatch := e.publishBatch(subject, "3", body(t, newReq(wire.OpJoin, 1, 900)), body(t, newReq(wire.OpJoin, 1, 901)))
	okA, okB := newReq(wire.OpJoin, 1, 902), newReq(wire.OpClaim, 1, 903)
	badOne := e.publishBatch(subject, "", body(t, okA), []byte(`{"request_id":"nope","op":"join","activity_id":1,"user_id":904}`), body(t, okB))
	total, msgs = total+1+3, msgs+2
	e.startAllocator()
	e.waitFence(badOne)

	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message WHERE seq = ? AND batch_index = 0", badBatch); n != 1 {
		t.Errorf("the malformed batch at %d: %d rejected_message rows at (seq, 0), want 1", badBatch, n)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE seq = ?", badBatch); n != 0 {
		t.Errorf("the malformed batch at %d: %d results, want none", badBatch, n)
	}
	if got := e.queryStrings("SELECT CONCAT(batch_index) FROM rejected_message WHERE seq = ?", badOne); len(got) != 1 || got[0] != "1" {
		t.Errorf("the batch at %d with a malformed request: rejected at indexes %v, want [1]", badOne, got)
	}
	if got := e.queryStrings("SELECT request_id FROM processed_request WHERE seq = ? ORDER BY batch_index", badOne); len(got) != 2 || got[0] != okA.RequestID || got[1] != okB.RequestID {
		t.Errorf("the batch at %d with a malformed request: results %v, want its two good requests", badOne, got)
	}

	rep := e.audit(audit.Config{})
	if !rep.OK {
		t.Fatalf("mixed stream: want no divergence, got %d:%s", len(rep.Divergences), divergences(rep.Divergences))
	}
	if rep.Messages != msgs || rep.Replayed != total || rep.Malformed != 2 || rep.Fence != badOne {
		t.Fatalf("report = %+v, want %d messages, %d requests, 2 malformed, fence %d", rep, msgs, total, badOne)
	}
	if len(batched) == 0 {
		t.Fatal("no batch of three requests or more")
	}

	seq := batched[len(batched)/2]
	var (
		id, outcome string
		user        int64
	)
	if err := e.db.QueryRow("SELECT request_id, user_id, outcome FROM processed_request WHERE seq = ? AND batch_index = 2", seq).
		Scan(&id, &user, &outcome); err != nil {
		t.Fatalf("the result at %d#2: %v", seq, err)
	}
	rep, got := e.auditTampered(t, tamperCase{
		tamper:  []string{"UPDATE processed_request SET outcome = 'TAMPERED' WHERE seq = " + strconv.FormatUint(seq, 10) + " AND batch_index = 2"},
		restore: []string{"UPDATE processed_request SET outcome = '" + outcome + "' WHERE seq = " + strconv.FormatUint(seq, 10) + " AND batch_index = 2"},
		want: audit.Divergence{Seq: seq, Index: 2, RequestID: id, Kind: audit.KindResult, ActivityID: 1, UserID: user,
			Field: "outcome", Expected: outcome, Actual: "TAMPERED"},
	})
	var text bytes.Buffer
	rep.WriteText(&text) //nolint:errcheck
	if line := "DIVERGENCE seq " + strconv.FormatUint(seq, 10) + "#2 request_id " + id; !strings.Contains(text.String(), line) {
		t.Fatalf("%s: the text report lacks %q:\n%s", got, line, text.String())
	}

	// The refusals are what the audit expects: without them it reports
	// each at its place.
	e.exec("CREATE TABLE saved AS SELECT * FROM rejected_message")
	e.exec("DELETE FROM rejected_message")
	rep = e.audit(audit.Config{})
	e.exec("INSERT INTO rejected_message SELECT * FROM saved")
	e.exec("DROP TABLE saved")
	var places []string
	for _, d := range rep.Divergences {
		if d.Kind == audit.KindNotRejected {
			places = append(places, wire.FormatPlace(d.Place()))
		}
	}
	if want := []string{strconv.FormatUint(badBatch, 10), strconv.FormatUint(badOne, 10) + "#1"}; !reflect.DeepEqual(places, want) || len(rep.Divergences) != 2 {
		t.Fatalf("without the refusals: not rejected at %v, want %v; all:%s", places, want, divergences(rep.Divergences))
	}
}
