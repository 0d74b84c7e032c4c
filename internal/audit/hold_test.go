package audit_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/wire"
)

// holdsBase has a sub-microsecond part, so that held_until's cut to whole
// microseconds is part of what the audit must replay exactly. It lies an
// hour ahead: the allocator's own schedules of these holds fall due long
// after the test, which stores the expires itself when it chooses.
var holdsBase = time.Now().UTC().Truncate(time.Second).Add(time.Hour).Add(500)

// reqAt is a request received at base + d.
func reqAt(op wire.Op, activity, user int64, d time.Duration) wire.Request {
	r := newReq(op, activity, user)
	r.ReceivedAt = holdsBase.Add(d)
	return r
}

func openHold(activity, capacity int64, hold time.Duration, d time.Duration) wire.Request {
	r := reqAt(wire.OpOpen, activity, 0, d)
	r.Capacity = &capacity
	r.Hold = wire.Duration(hold)
	return r
}

// apply stores r as ingest would and waits until the allocator applied it.
func (e *env) apply(r wire.Request) uint64 {
	e.t.Helper()
	seq := e.publish(r, "")
	e.waitFence(seq)
	return seq
}

// holdOf reads user's hold in activity from MySQL, as the allocator's
// schedule of its expiry knows it after the commit.
func (e *env) holdOf(activity, user int64) (until time.Time, holdSeq uint64) {
	e.t.Helper()
	if err := e.db.QueryRow("SELECT held_until, hold_seq FROM activity_signup WHERE activity_id = ? AND user_id = ? AND status = 'HELD'",
		activity, user).Scan(&until, &holdSeq); err != nil {
		e.t.Fatalf("hold of user %d in activity %d: %v", user, activity, err)
	}
	return until.UTC(), holdSeq
}

// sourceHolds checks that ALLOT_REQUESTS sources the due expires of
// ALLOT_HOLDS onto each activity's request subject, as bus.EnsureStreams
// sets it up: stored with a Nats-Stream-Source header and without
// Nats-Msg-Id. The tests store some expires on the due subject themselves,
// at the moment they choose; the allocator's own schedules of the same
// holds carry the same request ids and are applied once either way.
func (e *env) sourceHolds() {
	e.t.Helper()
	st, err := e.js.Stream(context.Background(), wire.RequestStream)
	if err != nil {
		e.t.Fatal(err)
	}
	srcs := st.CachedInfo().Config.Sources
	if len(srcs) != 1 || srcs[0].Name != wire.HoldStream {
		e.t.Fatalf("ALLOT_REQUESTS sources %v, want ALLOT_HOLDS", srcs)
	}
}

// expire stores the expiry of a hold the way the server does when its
// schedule falls due: wire.ExpireRequest on the hold stream's due subject,
// sourced into ALLOT_REQUESTS onto the activity's subject. It waits until
// the allocator applied it and returns its sequence there.
func (e *env) expire(activity, user int64, holdSeq uint64, until time.Time) uint64 {
	e.t.Helper()
	ctx := context.Background()
	r := wire.ExpireRequest(activity, user, holdSeq, until)
	b, err := json.Marshal(r)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.js.Publish(ctx, wire.HoldDueSubject(activity), b); err != nil {
		e.t.Fatal(err)
	}
	var seq uint64
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		err := e.db.QueryRow("SELECT seq FROM processed_request WHERE request_id = ?", r.RequestID).Scan(&seq)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("expire %s not applied within a minute: %v", r.RequestID, err)
		}
	}
	st, err := e.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		e.t.Fatal(err)
	}
	stored, err := st.GetMsg(ctx, seq)
	if err != nil {
		e.t.Fatal(err)
	}
	if stored.Subject != wire.RequestSubject(activity) || stored.Header.Get(nats.MsgIdHdr) != "" || stored.Header.Get("Nats-Stream-Source") == "" {
		e.t.Fatalf("expire stored on %s with headers %v, want %s, Nats-Stream-Source and no Nats-Msg-Id",
			stored.Subject, stored.Header, wire.RequestSubject(activity))
	}
	return seq
}

// holdTraffic applies, through a real allocator, a stream with holds by
// join and claim, expiries (applied, harmless and stale), confirms in time,
// at held_until exactly and late, a resize that promotes under a new hold,
// and repeats by held users. It returns the outcome of each request id.
func holdTraffic(e *env) map[string]wire.Outcome {
	e.t.Helper()
	const A, B, C = 1, 2, 3
	e.startAllocator()
	e.sourceHolds()
	// The waitlist story: A holds, B and C wait; A's hold expires and B is
	// held; B confirms in time; B's expire finds it confirmed.
	e.apply(openHold(60, 1, 2*time.Second, 0))
	e.apply(reqAt(wire.OpJoin, 60, A, 0))
	e.apply(reqAt(wire.OpJoin, 60, B, time.Second))
	e.apply(reqAt(wire.OpJoin, 60, C, time.Second))
	e.apply(reqAt(wire.OpConfirm, 60, C, time.Second)) // NOT_HELD: waiting
	untilA, seqA := e.holdOf(60, A)
	e.expire(60, A, seqA, untilA)
	untilB, seqB := e.holdOf(60, B)
	confirmB := reqAt(wire.OpConfirm, 60, B, 0)
	confirmB.ReceivedAt = untilB.Add(-time.Microsecond)
	e.apply(confirmB)
	e.expire(60, B, seqB, untilB) // NOT_HELD: confirmed
	e.apply(reqAt(wire.OpJoin, 60, A, 10*time.Second))

	// Claims under a hold: a confirm a nanosecond late releases the seat
	// to the waiter, held; a confirm at held_until exactly is in time.
	e.apply(openHold(61, 2, time.Second, 0))
	e.apply(reqAt(wire.OpClaim, 61, 1, 0))
	e.apply(reqAt(wire.OpClaim, 61, 2, 100*time.Millisecond))
	e.apply(reqAt(wire.OpClaim, 61, 3, 200*time.Millisecond))
	e.apply(reqAt(wire.OpJoin, 61, 4, 200*time.Millisecond))
	until1, seq1 := e.holdOf(61, 1)
	until2, _ := e.holdOf(61, 2)
	late := reqAt(wire.OpConfirm, 61, 1, 0)
	late.ReceivedAt = until1.Add(time.Nanosecond)
	e.apply(late)                 // HOLD_EXPIRED: 4 is held
	e.expire(61, 1, seq1, until1) // NOT_HELD: stale
	onTime := reqAt(wire.OpConfirm, 61, 2, 0)
	onTime.ReceivedAt = until2
	e.apply(onTime)
	e.apply(reqAt(wire.OpJoin, 61, 4, 2*time.Second))  // ALREADY_CONFIRMED, HELD
	e.apply(reqAt(wire.OpClaim, 61, 4, 2*time.Second)) // ALREADY_OWNED, HELD
	e.apply(reqAt(wire.OpJoin, 61, 5, 2*time.Second))
	e.apply(openHold(61, 3, 3*time.Second, 3*time.Second)) // promotes 5 under the new hold
	e.apply(reqAt(wire.OpCancel, 61, 5, 4*time.Second))
	e.apply(reqAt(wire.OpJoin, 61, 6, 4*time.Second))
	// 4 never confirms; its expiry lapses the hold.
	until4, seq4 := e.holdOf(61, 4)
	e.expire(61, 4, seq4, until4)

	out := map[string]wire.Outcome{}
	rows, err := e.db.Query("SELECT request_id, outcome FROM processed_request")
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, o string
		if err := rows.Scan(&id, &o); err != nil {
			e.t.Fatal(err)
		}
		out[id] = wire.Outcome(o)
	}
	return out
}

// TestHoldsAuditClean: a stream with holds, confirms in time and late, and
// expiries stored as the server stores them (sourced, without
// Nats-Msg-Id) audits clean, every hold outcome among its results.
func TestHoldsAuditClean(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	outcomes := holdTraffic(e)
	seen := map[wire.Outcome]bool{}
	for _, o := range outcomes {
		seen[o] = true
	}
	for _, o := range []wire.Outcome{wire.OutcomeHeld, wire.OutcomeConfirmed, wire.OutcomeNotHeld, wire.OutcomeExpired,
		wire.OutcomeHoldExpired, wire.OutcomeAlreadyConfirmed, wire.OutcomeAlreadyOwned, wire.OutcomeResized} {
		if !seen[o] {
			t.Errorf("the traffic never produced %s", o)
		}
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE op = 'expire'"); n != 4 {
		t.Errorf("%d expires recorded, want 4", n)
	}
	if outcomes[wire.ExpireRequestID(60, 1, wire.Place(2, 0))] != wire.OutcomeExpired {
		t.Errorf("the expire of A's hold (seq 2): outcome %q, want EXPIRED", outcomes[wire.ExpireRequestID(60, 1, wire.Place(2, 0))])
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE held_until IS NOT NULL AND events LIKE '%:%:%'"); n == 0 {
		t.Error("no result with held_until and a held event")
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE status = 'HELD'"); n != 1 {
		t.Errorf("%d HELD rows at the end, want 1 (user 6 of activity 61)", n)
	}
	rep := e.audit(audit.Config{})
	if !rep.OK {
		t.Fatalf("holds: want no divergence, got %d:%s", len(rep.Divergences), divergences(rep.Divergences))
	}
	if rep.Compared != len(outcomes) || rep.Skipped != 0 || rep.Malformed != 0 {
		t.Fatalf("compared %d, skipped %d, malformed %d; want %d compared", rep.Compared, rep.Skipped, rep.Malformed, len(outcomes))
	}
}

// TestHoldTamperingIsReported: a hold changed in MySQL behind the
// allocator's back (a HELD row's held_until, hold_seq or status, the
// activity's hold or held count, a result's held_until, a held event) is
// reported, with the request that explains the row.
func TestHoldTamperingIsReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	holdTraffic(e)
	e.stopAllocator()
	if rep := e.audit(audit.Config{}); !rep.OK {
		t.Fatalf("before tampering: %s", divergences(rep.Divergences))
	}
	// User 6 of activity 61 holds a seat by its join.
	var (
		until   time.Time
		holdSeq uint64
		joinID  string
		events  sql.NullString
	)
	if err := e.db.QueryRow("SELECT s.held_until, s.hold_seq, p.request_id, p.events FROM activity_signup s "+
		// hold_seq is the place of the join: seq * 65536 + index (wire.Place).
		"JOIN processed_request p ON p.seq = s.hold_seq DIV 65536 AND p.batch_index = s.hold_seq MOD 65536 "+
		"WHERE s.activity_id = 61 AND s.user_id = 6").Scan(&until, &holdSeq, &joinID, &events); err != nil {
		t.Fatal(err)
	}
	until = until.UTC()
	later := until.Add(time.Second)
	seq := itoa(int64(holdSeq))
	// A statement and its arguments.
	type stmt struct {
		q    string
		args []any
	}
	const signup = " WHERE activity_id = 61 AND user_id = 6"
	tests := []struct {
		name            string
		tamper, restore []stmt
		kind            audit.Kind
		field           string
		expected        string
		// requestID is the request the divergence must name: the one that
		// explains the row (user 6's join, for its signup and its result);
		// empty for the activity's row, which must name one.
		requestID string
	}{
		{"held_until moved", []stmt{{"UPDATE activity_signup SET held_until = ?" + signup, []any{later}}},
			[]stmt{{"UPDATE activity_signup SET held_until = ?" + signup, []any{until}}},
			audit.KindSignup, "held_until", until.Format(time.RFC3339Nano), joinID},
		{"hold_seq changed", []stmt{{"UPDATE activity_signup SET hold_seq = hold_seq - 1" + signup, nil}},
			[]stmt{{"UPDATE activity_signup SET hold_seq = hold_seq + 1" + signup, nil}},
			audit.KindSignup, "hold_seq", seq, joinID},
		{"HELD made CONFIRMED", []stmt{{"UPDATE activity_signup SET status = 'CONFIRMED', held_until = NULL, hold_seq = NULL" + signup, nil}},
			[]stmt{{"UPDATE activity_signup SET status = 'HELD', held_until = ?, hold_seq = ?" + signup, []any{until, holdSeq}}},
			audit.KindSignup, "status", "HELD", joinID},
		{"hold_ns changed", []stmt{{"UPDATE activity SET hold_ns = hold_ns + 1 WHERE id = 61", nil}},
			[]stmt{{"UPDATE activity SET hold_ns = hold_ns - 1 WHERE id = 61", nil}},
			audit.KindActivity, "hold_ns", itoa(int64(3 * time.Second)), ""},
		{"held_count changed", []stmt{{"UPDATE activity SET held_count = held_count - 1 WHERE id = 61", nil}},
			[]stmt{{"UPDATE activity SET held_count = held_count + 1 WHERE id = 61", nil}},
			audit.KindActivity, "held_count", "1", ""},
		{"result held_until moved", []stmt{{"UPDATE processed_request SET held_until = ? WHERE request_id = ?", []any{later, joinID}}},
			[]stmt{{"UPDATE processed_request SET held_until = ? WHERE request_id = ?", []any{until, joinID}}},
			audit.KindResult, "held_until", until.Format(time.RFC3339Nano), joinID},
		{"held event's held_until moved", []stmt{{"UPDATE processed_request SET events = REPLACE(events, ?, ?) WHERE request_id = ?",
			[]any{itoa(until.UnixMicro()), itoa(later.UnixMicro()), joinID}}},
			[]stmt{{"UPDATE processed_request SET events = ? WHERE request_id = ?", []any{events.String, joinID}}},
			audit.KindResult, "events", events.String, joinID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, q := range tt.tamper {
				e.exec(q.q, q.args...)
			}
			rep := e.audit(audit.Config{})
			for _, q := range tt.restore {
				e.exec(q.q, q.args...)
			}
			found := false
			for _, d := range rep.Divergences {
				named := d.RequestID != "" && (tt.requestID == "" || d.RequestID == tt.requestID)
				found = found || d.Kind == tt.kind && d.Field == tt.field && d.Expected == tt.expected && named
			}
			if rep.OK || !found {
				t.Fatalf("want a %s divergence of %s expecting %s naming request %q, got %d:%s", tt.kind, tt.field, tt.expected,
					tt.requestID, len(rep.Divergences), divergences(rep.Divergences))
			}
		})
	}
	if rep := e.audit(audit.Config{}); !rep.OK {
		t.Fatalf("after restoring: %s", divergences(rep.Divergences))
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestHoldsAuditFromCheckpoint: a checkpoint taken while seats are held
// carries the holds (hold_ns, held_count, held_until, hold_seq), so that
// after retention has removed the requests that created them, the audit
// from the checkpoint replays the confirm, expire and late confirm of
// those holds exactly as the allocator decided them; a hold changed in
// the checkpoint's rows breaks its digest.
func TestHoldsAuditFromCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	a, err := allocator.New(checkpointing(100*time.Millisecond), allocator.Deps{DB: e.db.DB, NATS: e.nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	e.sourceHolds()

	e.apply(openHold(70, 2, 5*time.Second, 0))
	for u := int64(1); u <= 4; u++ {
		e.apply(reqAt(wire.OpJoin, 70, u, time.Duration(u)*time.Millisecond))
	}
	ckptSeq := e.apply(reqAt(wire.OpJoin, 71, 1, 0)) // NO_SUCH_ACTIVITY: the fence moves on
	e.waitCheckpoint(t, 0, ckptSeq)
	if n := e.db.Count(t, "SELECT COUNT(*) FROM allocator_checkpoint_signup WHERE seq = ? AND status = 'HELD' AND held_until IS NOT NULL AND hold_seq IS NOT NULL", ckptSeq); n != 2 {
		t.Fatalf("the checkpoint holds %d HELD rows with their hold, want 2", n)
	}
	st, err := e.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	// As retention would: everything up to the checkpoint leaves.
	if err := st.Purge(ctx, jetstream.WithPurgeSequence(ckptSeq+1)); err != nil {
		t.Fatal(err)
	}
	until1, _ := e.holdOf(70, 1)
	until2, seq2 := e.holdOf(70, 2)
	confirm := reqAt(wire.OpConfirm, 70, 1, 0)
	confirm.ReceivedAt = until1
	e.apply(confirm)              // CONFIRMED
	e.expire(70, 2, seq2, until2) // EXPIRED: 3 is held
	until3, _ := e.holdOf(70, 3)
	late := reqAt(wire.OpConfirm, 70, 3, 0)
	late.ReceivedAt = until3.Add(time.Microsecond)
	last := e.apply(late) // HOLD_EXPIRED: 4 is held
	outcomes := e.queryStrings("SELECT outcome FROM processed_request WHERE seq > ? ORDER BY seq", ckptSeq)
	if got := strings.Join(outcomes, " "); got != "CONFIRMED EXPIRED HOLD_EXPIRED" {
		t.Fatalf("outcomes after the checkpoint: %s", got)
	}

	rep := e.audit(audit.Config{FromCheckpoint: true})
	if !rep.OK {
		t.Fatalf("audit from a checkpoint with holds diverges:%s", divergences(rep.Divergences))
	}
	if len(rep.Checkpoints) != 1 || rep.Checkpoints[0].Seq != ckptSeq || !rep.Checkpoints[0].DigestOK ||
		rep.VerifiedFrom != ckptSeq+1 || rep.VerifiedTo != last || rep.Compared != 3 {
		t.Fatalf("report %+v, want the checkpoint at %d with its digest, seq %d..%d verified, 3 compared", rep, ckptSeq, ckptSeq+1, last)
	}

	// A hold changed in the checkpoint's rows.
	a.Stop()
	e.exec("UPDATE allocator_checkpoint_signup SET held_until = held_until + INTERVAL 1 SECOND WHERE seq = ? AND activity_id = 70 AND user_id = 2", ckptSeq)
	rep = e.audit(audit.Config{FromCheckpoint: true})
	found := false
	for _, d := range rep.Divergences {
		found = found || d.Kind == audit.KindCheckpoint && d.Field == "digest" && d.Seq == ckptSeq
	}
	if rep.OK || !found || rep.Checkpoints[0].DigestOK {
		t.Fatalf("a hold changed in the checkpoint: ok %v, checkpoints %+v, want a digest divergence:%s", rep.OK, rep.Checkpoints, divergences(rep.Divergences))
	}
}

// TestSecondOpinionOnHolds: when allocation.Apply gets a hold wrong (here
// the held_until of the seat an expiry hands to the next in line) and
// MySQL holds the same wrong value, the reference model objects.
//
// Its wrong Apply is a test hook of this audit alone.
func TestSecondOpinionOnHolds(t *testing.T) {
	e := newEnv(t)
	holdTraffic(e)
	e.stopAllocator()
	if rep := e.audit(audit.Config{}); !rep.OK {
		t.Fatalf("before the fault: %s", divergences(rep.Divergences))
	}
	id := wire.ExpireRequestID(60, 1, wire.Place(2, 0))
	var (
		seq   uint64
		index int
		until time.Time
	)
	if err := e.db.QueryRow("SELECT seq, batch_index, held_until FROM processed_request WHERE request_id = ?", id).Scan(&seq, &index, &until); err != nil {
		t.Fatal(err)
	}
	wrong := until.Add(time.Second)
	hooks := audit.TestHooks{Apply: func(a *allocation.Activity, req allocation.Request, s uint64) (*allocation.Activity, allocation.Decision, error) {
		after, d, err := allocation.Apply(a, req, s)
		if s == wire.Place(seq, index) {
			d.HeldUntil = wrong // a wrong answer; the state change is right
		}
		return after, d, err
	}}
	e.exec("UPDATE processed_request SET held_until = ? WHERE request_id = ?", wrong, id)

	rep := e.auditDeps(audit.Config{}, audit.Deps{Test: hooks})
	if rep.OK || len(rep.Divergences) != 1 {
		t.Fatalf("want exactly one divergence (the second opinion's), got %d:%s", len(rep.Divergences), divergences(rep.Divergences))
	}
	d := rep.Divergences[0]
	if d.Kind != audit.KindReference || d.Seq != seq || d.RequestID != id ||
		!strings.Contains(d.Expected, "EXPIRED status CANCELLED held_until "+until.UTC().Format(time.RFC3339Nano)+" promoted [2]") ||
		!strings.Contains(d.Actual, "held_until "+wrong.UTC().Format(time.RFC3339Nano)) {
		t.Fatalf("divergence = %+v", d)
	}
}
