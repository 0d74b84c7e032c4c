package audit_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/wire"
)

// traffic is a published, applied burst and what the tests need to know
// about it.
type traffic struct {
	reqs  []wire.Request
	seqs  map[string]uint64 // request_id → seq of its first message
	last  uint64
	total int // messages stored

	// Fixed tail: activity 50 (capacity 1) with user 1 CONFIRMED by join
	// j1 and user 2 WAITING by join j2; activity 51 (capacity 5) with user
	// 1 CONFIRMED by join j3.
	j1, j2, j3 wire.Request
	opened     int // distinct activities opened
	poison     int
	poisonSeq  uint64 // the garbage message on alloc.req.1
	duplicate  wire.Request
}

// applyTraffic publishes a mixed burst of n requests over activities 1..acts
// plus a repeat of one request (stored twice), two poison messages, a request
// for an activity never opened and the fixed tail, and lets a real allocator
// apply all of it.
func applyTraffic(e *env, n, acts int) traffic {
	e.t.Helper()
	tr := traffic{seqs: map[string]uint64{}}
	tr.reqs = burst(n, acts, 10, 30, 88172645463325252)
	half := len(tr.reqs) / 2
	for i, s := range e.publishAll(tr.reqs[:half]) {
		tr.seqs[tr.reqs[i].RequestID] = s
	}
	// An Idempotency-Key repeat after the broker's duplicate window: the
	// same request stored again under another Nats-Msg-Id.
	for _, r := range tr.reqs[:half] {
		if r.Op == wire.OpJoin {
			tr.duplicate = r
			break
		}
	}
	e.publish(tr.duplicate, "repeat-"+tr.duplicate.RequestID)
	tr.poisonSeq = e.publishRaw(wire.RequestSubject(1), "\x00\xffgarbage")
	e.publishRaw(wire.RequestSubject(2), `{"request_id":"not-a-uuid","op":"join","activity_id":2,"user_id":3}`)
	tr.poison = 2
	for i, s := range e.publishAll(tr.reqs[half:]) {
		tr.seqs[tr.reqs[half+i].RequestID] = s
	}
	tail := []wire.Request{newReq(wire.OpJoin, 99, 1), openReq(50, 1), newReq(wire.OpJoin, 50, 1), newReq(wire.OpJoin, 50, 2),
		openReq(51, 5), newReq(wire.OpJoin, 51, 1)}
	tr.j1, tr.j2, tr.j3 = tail[2], tail[3], tail[5]
	for _, r := range tail {
		tr.last = e.publish(r, "")
		tr.seqs[r.RequestID] = tr.last
	}
	tr.reqs = append(tr.reqs, tail...)
	tr.total = len(tr.reqs) + 1 + tr.poison
	tr.opened = acts + 2
	e.startAllocator()
	e.waitFence(tr.last)
	return tr
}

// TestCleanBurstAuditsClean: traffic applied by the real allocator, with
// every outcome, a request stored twice and poison, audits clean.
func TestCleanBurstAuditsClean(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tr := applyTraffic(e, 3000, 4)
	e.db.CheckInvariants(t)

	outcomes := map[string]bool{}
	for _, o := range e.queryStrings("SELECT DISTINCT outcome FROM processed_request") {
		outcomes[o] = true
	}
	for _, o := range []wire.Outcome{wire.OutcomeOpened, wire.OutcomeResized, wire.OutcomeRejected, wire.OutcomeConfirmed,
		wire.OutcomeWaiting, wire.OutcomeAlreadyConfirmed, wire.OutcomeAlreadyWaiting, wire.OutcomeCancelled,
		wire.OutcomeNotSignedUp, wire.OutcomeGranted, wire.OutcomeSoldOut, wire.OutcomeAlreadyOwned, wire.OutcomeNoSuchActivity} {
		if !outcomes[string(o)] {
			t.Errorf("the burst never produced outcome %s; the audit would not cover it", o)
		}
	}

	rep := e.audit(audit.Config{})
	if !rep.OK || len(rep.Divergences) != 0 {
		t.Fatalf("clean traffic: want no divergence, got %d:%s", len(rep.Divergences), divergences(rep.Divergences))
	}
	want := audit.Report{
		ActivitiesChecked: tr.opened,
		Replayed:          tr.total,
		Messages:          tr.total,
		Compared:          len(tr.reqs),
		Skipped:           1,
		Malformed:         tr.poison,
		Pending:           0,
		LastSeq:           tr.last,
		Fence:             tr.last,
		WindowStart:       1,
		VerifiedFrom:      1,
		VerifiedTo:        tr.last,
		OK:                true,
	}
	got := rep
	got.Divergences = nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("report = %+v, want %+v", got, want)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(text.String(), "\nOK\n") || !strings.Contains(text.String(), "requests replayed:    "+strconv.Itoa(tr.total)) {
		t.Fatalf("text report:\n%s\nwant the counts and a final OK", text.String())
	}
}

// TestTamperingIsReported changes MySQL behind the allocator's back, one
// change per subtest, restored afterwards; each must be reported with the
// request that explains the row, and expected vs actual.
func TestTamperingIsReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tr := applyTraffic(e, 1000, 3)
	if rep := e.audit(audit.Config{}); !rep.OK {
		t.Fatalf("before tampering: %s", divergences(rep.Divergences))
	}
	mid := tr.reqs[len(tr.reqs)/2]
	var midOutcome string
	var midEvents sql.NullString
	if err := e.db.QueryRow("SELECT outcome, events FROM processed_request WHERE request_id = ?", mid.RequestID).Scan(&midOutcome, &midEvents); err != nil {
		t.Fatal(err)
	}

	// A request whose result changed nothing, to be recorded as refused.
	var quiet wire.Request
	var quietOutcome string
	if err := e.db.QueryRow("SELECT request_id, outcome FROM processed_request WHERE outcome IN ('NOT_SIGNED_UP', 'SOLD_OUT') AND seq > 100 ORDER BY seq LIMIT 1").
		Scan(&quiet.RequestID, &quietOutcome); err != nil {
		t.Fatal(err)
	}
	for _, r := range tr.reqs {
		if r.RequestID == quiet.RequestID {
			quiet = r
		}
	}
	quietSeq := strconv.FormatUint(tr.seqs[quiet.RequestID], 10)

	tests := []tamperCase{
		{
			name:    "waiting user confirmed by hand",
			tamper:  []string{"UPDATE activity_signup SET status = 'CONFIRMED' WHERE activity_id = 50 AND user_id = 2"},
			restore: []string{"UPDATE activity_signup SET status = 'WAITING' WHERE activity_id = 50 AND user_id = 2"},
			want: audit.Divergence{Seq: tr.seqs[tr.j2.RequestID], RequestID: tr.j2.RequestID, Kind: audit.KindSignup,
				ActivityID: 50, UserID: 2, Field: "status", Expected: string(wire.StatusWaiting), Actual: string(wire.StatusConfirmed)},
		},
		{
			name:    "confirmed_count bumped",
			tamper:  []string{"UPDATE activity SET confirmed_count = confirmed_count + 1 WHERE id = 51"},
			restore: []string{"UPDATE activity SET confirmed_count = confirmed_count - 1 WHERE id = 51"},
			want: audit.Divergence{Seq: tr.seqs[tr.j3.RequestID], RequestID: tr.j3.RequestID, Kind: audit.KindActivity,
				ActivityID: 51, Field: "confirmed_count", Expected: "1", Actual: "2"},
		},
		{
			name:    "waiting_count bumped",
			tamper:  []string{"UPDATE activity SET waiting_count = waiting_count + 1 WHERE id = 50"},
			restore: []string{"UPDATE activity SET waiting_count = waiting_count - 1 WHERE id = 50"},
			want: audit.Divergence{Seq: tr.seqs[tr.j2.RequestID], RequestID: tr.j2.RequestID, Kind: audit.KindActivity,
				ActivityID: 50, Field: "waiting_count", Expected: "1", Actual: "2"},
		},
		{
			name:    "waitlist bucket count bumped",
			tamper:  []string{"UPDATE waitlist_bucket SET waiting = waiting + 1 WHERE activity_id = 50"},
			restore: []string{"UPDATE waitlist_bucket SET waiting = waiting - 1 WHERE activity_id = 50"},
			want: audit.Divergence{Seq: tr.seqs[tr.j2.RequestID], RequestID: tr.j2.RequestID, Kind: audit.KindActivity,
				ActivityID: 50, Field: "waitlist_bucket", Expected: strconv.FormatUint(wire.Place(tr.seqs[tr.j2.RequestID], 0), 10) + ":1",
				Actual: strconv.FormatUint(wire.Place(tr.seqs[tr.j2.RequestID], 0), 10) + ":2"},
		},
		{
			name:    "result outcome edited",
			tamper:  []string{"UPDATE processed_request SET outcome = 'TAMPERED' WHERE request_id = '" + mid.RequestID + "'"},
			restore: []string{"UPDATE processed_request SET outcome = '" + midOutcome + "' WHERE request_id = '" + mid.RequestID + "'"},
			want: audit.Divergence{Seq: tr.seqs[mid.RequestID], RequestID: mid.RequestID, Kind: audit.KindResult,
				ActivityID: mid.ActivityID, UserID: mid.UserID, Field: "outcome", Expected: midOutcome, Actual: "TAMPERED"},
		},
		{
			name:    "outbox events of a result edited",
			tamper:  []string{"UPDATE processed_request SET events = 'promoted:999' WHERE request_id = '" + mid.RequestID + "'"},
			restore: []string{"UPDATE processed_request SET events = NULLIF('" + midEvents.String + "', '') WHERE request_id = '" + mid.RequestID + "'"},
			want: audit.Divergence{Seq: tr.seqs[mid.RequestID], RequestID: mid.RequestID, Kind: audit.KindResult,
				ActivityID: mid.ActivityID, UserID: mid.UserID, Field: "events", Expected: midEvents.String, Actual: "promoted:999"},
		},
		{
			name: "result row deleted",
			tamper: []string{
				"CREATE TABLE saved AS SELECT * FROM processed_request WHERE request_id = '" + tr.j1.RequestID + "'",
				"DELETE FROM processed_request WHERE request_id = '" + tr.j1.RequestID + "'",
			},
			restore: []string{"INSERT INTO processed_request SELECT * FROM saved", "DROP TABLE saved"},
			want: audit.Divergence{Seq: tr.seqs[tr.j1.RequestID], RequestID: tr.j1.RequestID, Kind: audit.KindResultMissing,
				ActivityID: 50, UserID: 1, Expected: "a processed_request row with outcome CONFIRMED", Actual: "none"},
		},
		{
			name: "malformed message no longer recorded as rejected",
			tamper: []string{
				"CREATE TABLE saved AS SELECT * FROM rejected_message WHERE subject = 'alloc.req.1'",
				"DELETE FROM rejected_message WHERE subject = 'alloc.req.1'",
			},
			restore: []string{"INSERT INTO rejected_message SELECT * FROM saved", "DROP TABLE saved"},
			want: audit.Divergence{Seq: tr.poisonSeq, Kind: audit.KindNotRejected,
				Expected: "a rejected_message row", Actual: "none"},
		},
		{
			name: "valid request recorded as rejected",
			tamper: []string{
				"CREATE TABLE saved AS SELECT * FROM processed_request WHERE request_id = '" + quiet.RequestID + "'",
				"DELETE FROM processed_request WHERE request_id = '" + quiet.RequestID + "'",
				"INSERT INTO rejected_message (seq, subject, reason, rejected_at) VALUES (" + quietSeq + ", 'alloc.req.x', 'cannot be applied: boom', NOW(6))",
			},
			restore: []string{"INSERT INTO processed_request SELECT * FROM saved", "DROP TABLE saved",
				"DELETE FROM rejected_message WHERE seq = " + quietSeq},
			want: audit.Divergence{Seq: tr.seqs[quiet.RequestID], RequestID: quiet.RequestID, Kind: audit.KindRejectedUnexpected,
				ActivityID: quiet.ActivityID, UserID: quiet.UserID,
				Expected: "applied with outcome " + quietOutcome, Actual: "rejected: cannot be applied: boom"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, _ := e.auditTampered(t, tt)
			var text bytes.Buffer
			rep.WriteText(&text) //nolint:errcheck
			line := "DIVERGENCE seq " + strconv.FormatUint(tt.want.Seq, 10) + " request_id "
			if tt.want.RequestID != "" {
				line += tt.want.RequestID
			}
			if !strings.Contains(text.String(), line) || !strings.Contains(text.String(), "expected "+tt.want.Expected+", actual "+tt.want.Actual) {
				t.Fatalf("text report lacks seq, request_id or expected/actual:\n%s", text.String())
			}
		})
	}
	if rep := e.audit(audit.Config{}); !rep.OK {
		t.Fatalf("after restoring: %s", divergences(rep.Divergences))
	}
}

// TestFiltersLimitWhatIsCompared: -activity and -from-seq/-from-time only
// narrow what is compared; the state is still replayed from the start.
func TestFiltersLimitWhatIsCompared(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tr := applyTraffic(e, 1500, 3)
	// An early result of activity 1 and a late one of activity 2.
	var early, late wire.Request
	for _, r := range tr.reqs[3:] {
		if r.ActivityID == 1 {
			early = r
			break
		}
	}
	for i := len(tr.reqs) - 1; i >= 0; i-- {
		if r := tr.reqs[i]; r.ActivityID == 2 {
			late = r
			break
		}
	}
	for _, r := range []wire.Request{early, late} {
		e.exec("UPDATE processed_request SET outcome = 'TAMPERED' WHERE request_id = ?", r.RequestID)
	}
	// A signup row no request made: reported whatever the window.
	e.exec("INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (3, 9999, 'CANCELLED', 999999)")

	count := func(q string, args ...any) int { return int(e.db.Count(t, q, args...)) }
	tests := []struct {
		name     string
		opts     audit.Config
		want     []string // request ids of the expected result divergences
		extra    bool     // the hand-made signup row is reported
		compared int
	}{
		{"all", audit.Config{}, []string{early.RequestID, late.RequestID}, true, len(tr.reqs)},
		{"activity 1", audit.Config{Activities: []int64{1}}, []string{early.RequestID}, false,
			count("SELECT COUNT(*) FROM processed_request WHERE activity_id = 1")},
		{"activity 2", audit.Config{Activities: []int64{2, 2}}, []string{late.RequestID}, false,
			count("SELECT COUNT(*) FROM processed_request WHERE activity_id = 2")},
		{"activity 3", audit.Config{Activities: []int64{3}}, nil, true,
			count("SELECT COUNT(*) FROM processed_request WHERE activity_id = 3")},
		{"never opened", audit.Config{Activities: []int64{12345}}, nil, false, 0},
		{"from after the early one", audit.Config{FromSeq: tr.seqs[early.RequestID] + 1}, []string{late.RequestID}, true,
			count("SELECT COUNT(*) FROM processed_request WHERE seq > ?", tr.seqs[early.RequestID])},
		{"from after the late one", audit.Config{FromSeq: tr.seqs[late.RequestID] + 1}, nil, true,
			count("SELECT COUNT(*) FROM processed_request WHERE seq > ?", tr.seqs[late.RequestID])},
		{"activity 2 from after the early one", audit.Config{Activities: []int64{2}, FromSeq: tr.seqs[early.RequestID] + 1},
			[]string{late.RequestID}, false,
			count("SELECT COUNT(*) FROM processed_request WHERE activity_id = 2 AND seq > ?", tr.seqs[early.RequestID])},
		{"from a time in the future", audit.Config{FromTime: time.Now().Add(time.Hour)}, nil, true, 0},
		{"from a time in the past", audit.Config{FromTime: time.Now().Add(-time.Hour)}, []string{early.RequestID, late.RequestID}, true, len(tr.reqs)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := e.audit(tt.opts)
			var got []string
			extra := false
			for _, d := range rep.Divergences {
				switch {
				case d.Kind == audit.KindResult && d.Field == "outcome" && d.Actual == "TAMPERED":
					got = append(got, d.RequestID)
				case d.Kind == audit.KindSignupUnexpected && d.ActivityID == 3 && d.UserID == 9999:
					extra = true
				default:
					t.Errorf("unexpected divergence %s", d)
				}
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("tampered results reported = %v, want %v", got, tt.want)
			}
			if extra != tt.extra {
				t.Errorf("hand-made signup row reported = %v, want %v", extra, tt.extra)
			}
			if rep.Compared != tt.compared {
				t.Errorf("compared = %d, want %d", rep.Compared, tt.compared)
			}
			if rep.OK != (len(tt.want) == 0 && !tt.extra) {
				t.Errorf("OK = %v with %d divergences", rep.OK, len(rep.Divergences))
			}
		})
	}
}

// TestPendingAndBadInput: messages beyond the fence are pending, not
// divergences; a stream that lost its start and contradictory options are
// errors.
func TestPendingAndBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(openReq(1, 2), "")
	last := e.publish(newReq(wire.OpJoin, 1, 1), "")
	e.startAllocator()
	e.waitFence(last)
	e.stopAllocator()
	for u := int64(2); u <= 4; u++ {
		e.publish(newReq(wire.OpJoin, 1, u), "")
	}
	var bar bytes.Buffer
	rep := e.auditDeps(audit.Config{}, audit.Deps{Progress: &bar})
	if bar.Len() == 0 {
		t.Error("no progress bar drawn on the Progress writer")
	}
	if !rep.OK || rep.Pending != 3 || rep.Replayed != 2 || rep.Compared != 2 || rep.Fence != last {
		t.Fatalf("report = %+v, want OK with 2 replayed and compared, 3 pending, fence %d", rep, last)
	}
	b, err := json.Marshal(rep)
	if err != nil || !strings.Contains(string(b), `"divergences":[]`) || !strings.Contains(string(b), `"pending":3`) {
		t.Fatalf("json report = %s (%v), want pending 3 and an empty divergences array", b, err)
	}

	ctx := context.Background()
	if err := (audit.Config{FromSeq: 2, FromTime: time.Now()}).Validate(); !errors.Is(err, audit.ErrInvalidConfig) {
		t.Fatalf("from-seq with from-time: err = %v, want ErrInvalidConfig", err)
	}
	if err := (audit.Config{Activities: []int64{0}}).Validate(); !errors.Is(err, audit.ErrInvalidConfig) {
		t.Fatalf("activity 0: err = %v, want ErrInvalidConfig", err)
	}
	if err := (audit.Config{Partitions: []int{-1}}).Validate(); !errors.Is(err, audit.ErrInvalidConfig) {
		t.Fatalf("partition -1: err = %v, want ErrInvalidConfig", err)
	}
	st, err := e.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSequence(2)); err != nil {
		t.Fatal(err)
	}
	_, err = audit.Run(ctx, audit.Config{}, audit.Deps{DB: e.db.DB, JS: e.js})
	if !errors.Is(err, audit.ErrIncompleteStream) || !strings.Contains(err.Error(), "starts at sequence 2") {
		t.Fatalf("stream without its first message: err = %v, want ErrIncompleteStream naming sequence 2", err)
	}
}
