package audit

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/audit/second"
	"github.com/allot-dev/allot/internal/audit/snapshot"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/waitlist"
	"github.com/allot-dev/allot/internal/wire"
)

// auditor is one audit's replay state and findings.
type auditor struct {
	run auditRun
	// fence is the allocator's fence, the highest of the audited
	// partitions'; fences are each partition's: no result is expected
	// beyond a message's partition's fence.
	fence  uint64
	fences map[int]uint64
	// strays are the rows of partitions the audited shard does not own.
	strays strays
	// subjects are the audited activities, by their subject token; nil
	// means all.
	subjects map[string]bool
	// winStart is the first message sequence compared; MaxUint64 until a
	// FromTime window has found its first message.
	winStart uint64

	// rejected holds the rejected_message rows not yet met, by place;
	// rejectedSeqs the stream sequences of the messages they name.
	rejected     map[uint64]snapshot.Rejected
	rejectedSeqs map[uint64]bool
	// ids are the request ids met so far.
	ids requestIDs

	acts map[int64]*allocation.Activity
	// actLast is the request last applied to each activity: the one that
	// last wrote its row (next_seq moves with every applied request).
	actLast map[int64]change
	// signups holds every user's last row per activity, CANCELLED included.
	signups map[signupKey]*signupTrack
	// ref is the second opinion on allocation.Apply: the reference model's
	// state per activity (reference.go, internal/audit/second).
	ref second.Opinion

	// check is the comparison with MySQL's results and what it found.
	check comparison
	// cp is set when the audit starts from checkpoints.
	cp *fromCheckpoint
}

// auditRun is what one audit is given and what it learns of the stream
// when it opens it: fixed for the whole replay.
type auditRun struct {
	cfg Config
	// activities are cfg.Activities in ascending order, each once.
	activities []int64
	// progress gets the progress bar (Deps.Progress).
	progress io.Writer
	// apply is the domain under audit: allocation.Apply but in tests
	// (TestHooks.Apply).
	apply func(*allocation.Activity, allocation.Request, uint64) (*allocation.Activity, allocation.Decision, error)
	// partitions is how many partitions the request stream has.
	partitions int
	// last is the stream's last sequence when the audit opened it.
	last uint64
	// parts are the audited partitions (nil: all), partList the same in
	// order; shard is the shard audited among several (nil: one database).
	parts    map[int]bool
	partList []int
	shard    *shardScope
}

// requestIDs are the request ids the replay has met.
type requestIDs struct {
	// seen maps each applied request_id to the place it was applied at.
	seen map[string]uint64
	// refusedAt maps the request ids of rejected_message rows to the first
	// place they were refused at: a void behind it is a repeat.
	refusedAt map[string]uint64
}

// comparison is MySQL's result rows, read in place order as the replay
// meets them, and the report of what the comparison found.
type comparison struct {
	results *snapshot.Results
	rep     Report
}

// change names the request that changed a row, by its place.
type change struct {
	place     uint64
	requestID string
}

type signupKey struct{ activity, user int64 }

// signupTrack is a signup row as the replay left it.
type signupTrack struct {
	status   string
	queueSeq uint64
	// heldUntil and holdSeq are a HELD row's hold; zero on other rows.
	heldUntil time.Time
	holdSeq   uint64
	by        change
	matched   bool
}

// describe is the row as the replay expects it, for a missing one.
func (t *signupTrack) describe() string {
	s := "status " + t.status + ", queue_seq " + strconv.FormatUint(t.queueSeq, 10)
	if !t.heldUntil.IsZero() || t.holdSeq != 0 {
		s += ", held_until " + timeOrNull(t.heldUntil) + ", hold_seq " + strconv.FormatUint(t.holdSeq, 10)
	}
	return s
}

func subjectOf(activity int64) string { return wire.RequestSubject(activity) }

// activityKey is how a.subjects names an activity: its subject token.
func activityKey(activity int64) string { return strconv.FormatInt(activity, 10) }

// inWindow says whether the request at place is compared: its message is
// in the window.
func (a *auditor) inWindow(place uint64) bool { return wire.SeqOf(place) >= a.winStart }

func (a *auditor) diverge(d Divergence) { a.check.rep.Divergences = append(a.check.rep.Divergences, d) }

// at is d at place: the request concerned, or the one that last changed
// the row.
func at(place uint64, d Divergence) Divergence {
	d.Seq, d.Index = wire.SeqOf(place), wire.IndexOf(place)
	return d
}

// message replays one stored message: the allocator's steps, in its order,
// for each request it carries at its place (wire.Place(seq, index)). A
// message malformed as a whole is one refused request at (seq, 0).
func (a *auditor) message(seq uint64, subject, batch string, data []byte, stored time.Time) error {
	if a.cp != nil && a.cp.covers(seq, subject) {
		return a.skipCovered(seq)
	}
	if a.winStart == math.MaxUint64 && !a.run.cfg.FromTime.IsZero() && !stored.Before(a.run.cfg.FromTime) {
		a.winStart = seq
	}
	reqs, err := wire.DecodeMessage(subject, batch, data)
	if err != nil {
		reqs = []wire.Decoded{{Err: err}}
	}
	if seq > a.fenceOf(subject) {
		a.check.rep.Pending++
		for _, r := range reqs {
			if err := a.pending(wire.Place(seq, r.Index)); err != nil {
				return err
			}
		}
		return nil
	}
	a.check.rep.Messages++
	for _, r := range reqs {
		if err := a.request(wire.Place(seq, r.Index), subject, r); err != nil {
			return err
		}
	}
	return nil
}

// pending checks the place of a request stored after the allocator's
// fence: nothing may be recorded there yet.
func (a *auditor) pending(place uint64) error {
	got, err := a.resultAt(place)
	if err != nil {
		return err
	}
	rej, rejected := a.rejected[place]
	delete(a.rejected, place)
	if !a.inWindow(place) {
		return nil
	}
	if got != nil {
		a.unexpectedResult(got, "a result recorded beyond the allocator's fence "+strconv.FormatUint(a.fence, 10))
	}
	if rejected {
		a.unexpectedRejected(place, "", rej, "a rejected_message row beyond the allocator's fence "+strconv.FormatUint(a.fence, 10))
	}
	return nil
}

// request replays the request at place, read from its message on subject
// as dec (dec.Err: the request, or the whole message at index 0, is
// malformed).
func (a *auditor) request(place uint64, subject string, dec wire.Decoded) error {
	got, err := a.resultAt(place)
	if err != nil {
		return err
	}
	rej, rejected := a.rejected[place]
	delete(a.rejected, place)
	check := a.inWindow(place)
	a.check.rep.Replayed++

	req, err := dec.Request, dec.Err
	if err != nil {
		a.malformed(place, "", subject, err, got, rejected, check)
		return nil
	}
	if err := bus.CheckRequestSubject(subject, req, a.run.partitions); err != nil {
		a.malformed(place, "", subject, err, got, rejected, check)
		return nil
	}
	if _, dup := a.ids.seen[req.RequestID]; !dup && a.cp != nil && got == nil {
		// A repeat of a request applied before the checkpoint.
		at, before, err := a.cp.appliedBefore(req.RequestID, place)
		if err != nil {
			return err
		}
		if before {
			a.ids.seen[req.RequestID] = at
		}
	}
	if first, dup := a.ids.seen[req.RequestID]; dup {
		// A request id is applied once, whichever messages carry it: a
		// later copy, in this batch or another message, is a repeat.
		a.check.rep.Skipped++
		if check && got != nil {
			a.unexpectedResult(got, "a result recorded for a repeat of request "+req.RequestID+" first applied at "+wire.FormatPlace(first))
		}
		if check && rejected {
			a.unexpectedRejected(place, req.RequestID, rej, "a repeat of an applied request must be skipped, not rejected")
		}
		return nil
	}
	if req.Op == wire.OpVoid {
		a.void(place, req, got, rej, rejected, check)
		return nil
	}
	dreq := allocation.RequestOf(req)
	act := a.acts[req.ActivityID]
	if rejected && got == nil {
		// The allocator refused a request the domain accepts (a store
		// error, say) and applied nothing. Report it once and follow the
		// allocator, so one fault reads as one divergence instead of a
		// cascade; the decision is taken on a copy only to name it.
		_, d, err := allocation.Apply(act.Clone(), dreq, place)
		if err != nil {
			a.malformed(place, req.RequestID, subject, err, nil, true, check)
			return nil
		}
		if check {
			a.check.rep.Compared++
			a.diverge(at(place, Divergence{
				RequestID: req.RequestID, Kind: KindRejectedUnexpected,
				ActivityID: req.ActivityID, UserID: req.UserID,
				Expected: "applied with outcome " + string(d.Outcome), Actual: "rejected: " + rej.Reason,
				Detail: "the replay follows the allocator and leaves the request unapplied",
			}))
		}
		return nil
	}
	after, d, err := a.decide(act, dreq, place, req.RequestID)
	if err != nil {
		a.malformed(place, req.RequestID, subject, err, got, rejected, check)
		return nil
	}
	a.ids.seen[req.RequestID] = place
	by := change{place: place, requestID: req.RequestID}
	if after != nil {
		a.acts[req.ActivityID] = after
		a.actLast[req.ActivityID] = by
	}
	for _, s := range d.Changed {
		k := signupKey{req.ActivityID, s.UserID}
		t := a.signups[k]
		if t == nil {
			t = new(signupTrack)
			a.signups[k] = t
		}
		t.status, t.queueSeq, t.by = string(s.Status), s.QueueSeq, by
		t.heldUntil, t.holdSeq = s.HeldUntil, s.HoldSeq
	}
	if !check {
		return nil
	}
	if rejected {
		// Both a result and a rejection: the result is compared below.
		a.unexpectedRejected(place, req.RequestID, rej, "the request has a result as well")
	}
	a.check.rep.Compared++
	want := allocation.ResultOf(req, place, d, after, time.Time{}) // applied_at is not compared
	if got == nil {
		a.diverge(at(place, Divergence{
			RequestID: req.RequestID, Kind: KindResultMissing,
			ActivityID: req.ActivityID, UserID: req.UserID,
			Expected: "a processed_request row with outcome " + string(want.Outcome), Actual: "none",
		}))
		return nil
	}
	a.compareResult(want, got)
	if exp, act := store.EncodeEvents(d.Events), got.Events.String; exp != act {
		a.diverge(at(place, Divergence{
			RequestID: req.RequestID, Kind: KindResult, ActivityID: req.ActivityID, UserID: req.UserID,
			Field: "events", Expected: exp, Actual: act,
		}))
	}
	return nil
}

// void checks the void of an id that has no result before it: the
// allocator records REJECTED "never stored" and changes nothing.
func (a *auditor) void(place uint64, req wire.Request, got *snapshot.Result, rej snapshot.Rejected, rejected, check bool) {
	if refused, ok := a.ids.refusedAt[req.RequestID]; ok && refused < place {
		// The request was stored and refused before: it has its answer,
		// and the void is a repeat, as of an applied request.
		a.check.rep.Skipped++
		if check && got != nil {
			a.unexpectedResult(got, "a result recorded for the void of request "+req.RequestID+" refused at "+wire.FormatPlace(refused))
		}
		if check && rejected {
			a.unexpectedRejected(place, req.RequestID, rej, "a void of a refused request must be skipped, not rejected")
		}
		return
	}
	a.ids.seen[req.RequestID] = place
	if !check || a.subjects != nil {
		// An audit of some activities reads their results only, and a
		// void's (activity_id 0) is none of them.
		return
	}
	if rejected {
		a.unexpectedRejected(place, req.RequestID, rej, "a void is recorded as a result, not rejected")
	}
	a.check.rep.Compared++
	// A void is never part of a batch: its place is its message's.
	want := allocation.VoidResult(req, wire.SeqOf(place), time.Time{})
	if got == nil {
		a.diverge(at(place, Divergence{
			RequestID: req.RequestID, Kind: KindResultMissing, UserID: req.UserID,
			Expected: "a processed_request row with outcome " + string(want.Outcome) + " (" + wire.ReasonNeverStored + ")", Actual: "none",
		}))
		return
	}
	a.compareResult(want, got)
	if got.Events.String != "" {
		a.diverge(at(place, Divergence{
			RequestID: req.RequestID, Kind: KindResult, UserID: req.UserID,
			Field: "events", Expected: "", Actual: got.Events.String,
		}))
	}
}

// malformed checks a request (or a whole message, at index 0) the
// allocator must have refused.
func (a *auditor) malformed(place uint64, requestID, subject string, cause error, got *snapshot.Result, rejected, check bool) {
	a.check.rep.Malformed++
	if !check {
		return
	}
	what := "malformed message"
	if wire.IndexOf(place) > 0 {
		what = "malformed request of a batch"
	}
	if !rejected {
		a.diverge(at(place, Divergence{
			RequestID: requestID, Kind: KindNotRejected,
			Expected: "a rejected_message row", Actual: "none",
			Detail: what + " on " + subject + " not recorded as rejected: " + cause.Error(),
		}))
	}
	if got != nil {
		a.unexpectedResult(got, "a result recorded for a "+what+": "+cause.Error())
	}
}

// resultAt returns the processed_request row at place, or nil, after
// reporting every row before place: no request the replay read sits there.
func (a *auditor) resultAt(place uint64) (*snapshot.Result, error) {
	for {
		r, err := a.check.results.Peek()
		if err != nil || r == nil || r.Place() > place {
			return nil, err
		}
		a.check.results.Next()
		if r.Place() == place {
			return r, nil
		}
		if a.inWindow(r.Place()) {
			a.unexpectedResult(r, "no request at this place"+a.scope())
		}
	}
}

// drainResults reports the rows after the last message read.
func (a *auditor) drainResults() error {
	for {
		r, err := a.check.results.Peek()
		if err != nil || r == nil {
			return err
		}
		a.check.results.Next()
		if a.inWindow(r.Place()) {
			a.unexpectedResult(r, "no request at this place"+a.scope())
		}
	}
}

// scope says which part of the stream "no message" refers to.
func (a *auditor) scope() string {
	if a.subjects != nil {
		return " among the audited activities' subjects up to seq " + strconv.FormatUint(a.run.last, 10)
	}
	return " up to seq " + strconv.FormatUint(a.run.last, 10)
}

// leftoverRejected reports rejected_message rows no message accounted for.
func (a *auditor) leftoverRejected() {
	places := make([]uint64, 0, len(a.rejected))
	for place, r := range a.rejected {
		if a.subjects != nil && !a.subjects[wire.ActivityOfSubject(r.Subject)] {
			continue
		}
		if a.inWindow(place) {
			places = append(places, place)
		}
	}
	slices.Sort(places)
	for _, place := range places {
		a.unexpectedRejected(place, "", a.rejected[place], "no request at this place"+a.scope())
	}
}

func (a *auditor) unexpectedResult(r *snapshot.Result, why string) {
	a.diverge(Divergence{
		Seq: r.Seq, Index: r.Index, RequestID: r.RequestID, Kind: KindResultUnexpected,
		ActivityID: r.ActivityID, UserID: r.UserID,
		Expected: "no processed_request row", Actual: "a row with outcome " + r.Outcome,
		Detail: why,
	})
}

func (a *auditor) unexpectedRejected(place uint64, requestID string, r snapshot.Rejected, why string) {
	a.diverge(at(place, Divergence{
		RequestID: requestID, Kind: KindRejectedUnexpected,
		Expected: "no rejected_message row", Actual: "rejected on " + r.Subject + ": " + r.Reason,
		Detail: why,
	}))
}

// compareResult compares the recorded result with the replayed one, column
// by column, so each difference reads as expected vs actual.
func (a *auditor) compareResult(want wire.Result, got *snapshot.Result) {
	field := func(name, exp, act string) {
		a.diverge(Divergence{
			Seq: want.Seq, Index: want.Index, RequestID: want.RequestID, Kind: KindResult,
			ActivityID: want.ActivityID, UserID: want.UserID,
			Field: name, Expected: exp, Actual: act,
		})
	}
	if got.RequestID != want.RequestID {
		field("request_id", want.RequestID, got.RequestID)
	}
	if got.Op != string(want.Op) {
		field("op", string(want.Op), got.Op)
	}
	if got.ActivityID != want.ActivityID {
		field("activity_id", itoa(want.ActivityID), itoa(got.ActivityID))
	}
	if got.UserID != want.UserID {
		field("user_id", itoa(want.UserID), itoa(got.UserID))
	}
	if got.Outcome != string(want.Outcome) {
		field("outcome", string(want.Outcome), got.Outcome)
	}
	if want.Status == nil && got.Status.Valid || want.Status != nil && (!got.Status.Valid || got.Status.String != string(*want.Status)) {
		field("status", strOrNull(want.Status), nullStr(got.Status))
	}
	if !sameInt(want.Position, got.Position) {
		field("position", intOrNull(want.Position), nullInt(got.Position))
	}
	if !sameInt(want.Capacity, got.Capacity) {
		field("capacity", intOrNull(want.Capacity), nullInt(got.Capacity))
	}
	var wantUntil time.Time
	if want.HeldUntil != nil {
		wantUntil = *want.HeldUntil
	}
	if !sameTime(wantUntil, got.HeldUntil) {
		field("held_until", timeOrNull(wantUntil), nullTime(got.HeldUntil))
	}
	// The allocator stores a cancel's single promoted user as a one-element
	// list, like a resize's (store.InsertResults).
	ids := want.PromotedUserIDs
	if want.PromotedUserID != nil {
		ids = []int64{*want.PromotedUserID}
	}
	exp := idList(ids)
	act := "null"
	if got.Promoted.Valid && got.Promoted.String != "" {
		act = got.Promoted.String
	}
	if act != exp {
		var parsed []int64
		if json.Unmarshal([]byte(act), &parsed) != nil || !slices.Equal(parsed, ids) {
			field("promoted_user_ids", exp, act)
		}
	}
}

// compareRows compares the final activity and signup rows with the replay.
func (a *auditor) compareRows(ctx context.Context, tx *sql.Tx) error {
	rows, err := snapshot.ReadActivities(ctx, tx, a.run.activities)
	if err != nil {
		return err
	}
	buckets, err := snapshot.ReadBuckets(ctx, tx, a.run.activities)
	if err != nil {
		return err
	}
	checked := make(map[int64]bool, len(a.acts)+len(rows))
	for _, id := range a.run.activities {
		if a.activityInScope(id) {
			checked[id] = true
		}
	}
	inRow := make(map[int64]bool, len(rows))
	for _, r := range rows {
		if !a.activityInScope(r.ID) {
			delete(buckets, r.ID) // another partition's: not this audit's
			continue
		}
		checked[r.ID] = true
		inRow[r.ID] = true
		bs := buckets[r.ID]
		delete(buckets, r.ID) // the rest have no activity row
		act := a.acts[r.ID]
		if act == nil {
			a.diverge(Divergence{
				Kind: KindActivityUnexpected, ActivityID: r.ID,
				Expected: "no activity row (never opened)",
				Actual:   fmt.Sprintf("capacity %d, confirmed_count %d, next_seq %d", r.Capacity, r.Confirmed, r.NextSeq),
			})
			continue
		}
		by := a.actLast[r.ID]
		if !a.inWindow(by.place) {
			continue
		}
		col := func(name string, exp, act int64) {
			if exp != act {
				a.diverge(at(by.place, Divergence{
					RequestID: by.requestID, Kind: KindActivity, ActivityID: r.ID,
					Field: name, Expected: itoa(exp), Actual: itoa(act),
				}))
			}
		}
		col("capacity", act.Capacity, r.Capacity)
		col("confirmed_count", act.Confirmed, r.Confirmed)
		col("next_seq", int64(act.NextSeq), int64(r.NextSeq))
		col("hold_ns", int64(act.Hold), r.Hold)
		col("held_count", act.Held, r.Held)
		col("waiting_count", act.Waiting(), r.Waiting)
		// The waitlist buckets must describe the replay's waitlist: every
		// waiter counted in the bucket its queue_seq falls in.
		var waiters []uint64
		for _, s := range act.Live() {
			if s.Status == wire.StatusWaiting {
				waiters = append(waiters, s.QueueSeq)
			}
		}
		if !waitlist.Of(bs).Fits(waiters) {
			a.diverge(at(by.place, Divergence{
				RequestID: by.requestID, Kind: KindActivity, ActivityID: r.ID, Field: "waitlist_bucket",
				Expected: describeBuckets(waitlist.Build(waiters, 0).Buckets()), Actual: describeBuckets(bs),
			}))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(buckets)) {
		if !a.activityInScope(id) {
			continue
		}
		a.diverge(Divergence{Kind: KindActivityUnexpected, ActivityID: id, Field: "waitlist_bucket",
			Expected: "no waitlist bucket (no activity row)", Actual: describeBuckets(buckets[id])})
	}
	ids := make([]int64, 0, len(a.acts))
	for id := range a.acts {
		checked[id] = true
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if by := a.actLast[id]; !inRow[id] && a.inWindow(by.place) {
			act := a.acts[id]
			a.diverge(at(by.place, Divergence{
				RequestID: by.requestID, Kind: KindActivityMissing, ActivityID: id,
				Expected: fmt.Sprintf("capacity %d, confirmed_count %d, next_seq %d", act.Capacity, act.Confirmed, act.NextSeq),
				Actual:   "no activity row",
			}))
		}
	}
	a.check.rep.ActivitiesChecked = len(checked)

	err = snapshot.EachSignup(ctx, tx, a.run.activities, func(activity, user int64, r snapshot.Signup) {
		if !a.activityInScope(activity) {
			return
		}
		k := signupKey{activity, user}
		t := a.signups[k]
		if t == nil {
			a.diverge(Divergence{
				Kind: KindSignupUnexpected, ActivityID: k.activity, UserID: k.user,
				Expected: "no signup row (the user never signed up)",
				Actual:   "status " + r.Status + ", queue_seq " + strconv.FormatUint(r.QueueSeq, 10),
			})
			return
		}
		t.matched = true
		if !a.inWindow(t.by.place) {
			return
		}
		field := func(name, exp, act string) {
			a.diverge(at(t.by.place, Divergence{
				RequestID: t.by.requestID, Kind: KindSignup, ActivityID: k.activity, UserID: k.user,
				Field: name, Expected: exp, Actual: act,
			}))
		}
		if r.Status != t.status {
			field("status", t.status, r.Status)
		}
		if r.QueueSeq != t.queueSeq {
			field("queue_seq", strconv.FormatUint(t.queueSeq, 10), strconv.FormatUint(r.QueueSeq, 10))
		}
		if !sameTime(t.heldUntil, r.HeldUntil) {
			field("held_until", timeOrNull(t.heldUntil), nullTime(r.HeldUntil))
		}
		if want := t.holdSeq; want == 0 && r.HoldSeq.Valid || want != 0 && (!r.HoldSeq.Valid || uint64(r.HoldSeq.Int64) != want) {
			exp := "null"
			if want != 0 {
				exp = strconv.FormatUint(want, 10)
			}
			field("hold_seq", exp, nullInt(r.HoldSeq))
		}
	})
	if err != nil {
		return err
	}
	var missing []signupKey
	for k, t := range a.signups {
		if !t.matched && a.inWindow(t.by.place) {
			missing = append(missing, k)
		}
	}
	slices.SortFunc(missing, func(x, y signupKey) int {
		if x.activity != y.activity {
			return cmp.Compare(x.activity, y.activity)
		}
		return cmp.Compare(x.user, y.user)
	})
	for _, k := range missing {
		t := a.signups[k]
		a.diverge(at(t.by.place, Divergence{
			RequestID: t.by.requestID, Kind: KindSignupMissing, ActivityID: k.activity, UserID: k.user,
			Expected: t.describe(),
			Actual:   "no signup row",
		}))
	}
	return nil
}

// describeBuckets is buckets on one line, "first_seq:waiting …", cut
// after a few.
func describeBuckets(bs []waitlist.Bucket) string {
	if len(bs) == 0 {
		return "no buckets"
	}
	var b strings.Builder
	for i, x := range bs {
		if i == 8 {
			fmt.Fprintf(&b, " … (%d buckets)", len(bs))
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d:%d", x.FirstSeq, x.Waiting)
	}
	return b.String()
}

func (a *auditor) report() Report {
	r := a.check.rep
	r.LastSeq, r.Fence = a.run.last, a.fence
	r.VerifiedFrom, r.VerifiedTo = a.verifiedRange()
	if a.cp != nil {
		r.Checkpoints = a.cp.used
	}
	if a.winStart != math.MaxUint64 {
		r.WindowStart = a.winStart
	}
	if r.Divergences == nil {
		r.Divergences = []Divergence{}
	}
	r.OK = len(r.Divergences) == 0
	return r
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func sameInt(want *int64, got sql.NullInt64) bool {
	if want == nil {
		return !got.Valid
	}
	return got.Valid && got.Int64 == *want
}

func strOrNull[T ~string](p *T) string {
	if p == nil {
		return "null"
	}
	return string(*p)
}

func nullStr(s sql.NullString) string {
	if !s.Valid {
		return "null"
	}
	return s.String
}

// sameTime says whether a stored DATETIME(6) holds want (the zero time:
// NULL).
func sameTime(want time.Time, got sql.NullTime) bool {
	if want.IsZero() {
		return !got.Valid
	}
	return got.Valid && got.Time.Equal(want)
}

// timeOrNull formats an instant the replay expects, "null" for none.
func timeOrNull(t time.Time) string {
	if t.IsZero() {
		return "null"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func nullTime(t sql.NullTime) string {
	if !t.Valid {
		return "null"
	}
	return t.Time.UTC().Format(time.RFC3339Nano)
}

func intOrNull(p *int64) string {
	if p == nil {
		return "null"
	}
	return itoa(*p)
}

func nullInt(n sql.NullInt64) string {
	if !n.Valid {
		return "null"
	}
	return itoa(n.Int64)
}

// idList formats ids the way the allocator stores them: a JSON array, or
// "null" for none.
func idList(ids []int64) string {
	if len(ids) == 0 {
		return "null"
	}
	b := []byte{'['}
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(append(b, ']'))
}
