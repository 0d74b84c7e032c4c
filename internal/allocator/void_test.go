package allocator

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// voidOf is the void of request id r for user.
func voidOf(id string, user int64) wire.Request {
	return wire.Request{RequestID: id, Op: wire.OpVoid, UserID: user, ReceivedAt: time.Now().UTC()}
}

// publishVoid stores v on the carrier subject of its id's partition, with
// a Nats-Msg-Id of its own (as if the duplicate window had passed).
func (e *env) publishVoid(v wire.Request, msgID string) uint64 {
	e.t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		e.t.Fatal(err)
	}
	ack, err := e.js.Publish(context.Background(), wire.RequestSubject(bus.VoidCarrier(0, 1)), data, jetstream.WithMsgID(msgID))
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

func (e *env) auditClean() { e.auditCleanWith(audit.Config{}) }

func (e *env) auditCleanWith(opts audit.Config) {
	e.t.Helper()
	rep, err := audit.Run(context.Background(), opts, audit.Deps{DB: e.db.DB, JS: e.js})
	if err != nil {
		e.t.Fatal(err)
	}
	if !rep.OK {
		var lines []string
		for _, d := range rep.Divergences {
			lines = append(lines, d.String())
		}
		e.t.Fatalf("audit found %d divergences:\n%s", len(rep.Divergences), strings.Join(lines, "\n"))
	}
}

// TestVoidSettlesARequestIDForGood: a void of an id with no result records
// it REJECTED "never stored", changing nothing; a copy of the original
// stored after it (the duplicate window passed) is a repeat answered with
// that result, never applied; a void of an id already applied is a repeat
// and leaves its result as it was. The audit replays all of it clean.
func TestVoidSettlesARequestIDForGood(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(open(1, 1), "")

	// Applied first, voided later: the void changes nothing.
	applied := req(wire.OpJoin, 1, 7)
	e.publish(applied, "")
	late := e.publishVoid(voidOf(applied.RequestID, 7), "void-1")

	// Voided first, stored later: the copy is a repeat of the void.
	lost := req(wire.OpJoin, 1, 8)
	voided := e.publishVoid(voidOf(lost.RequestID, 0), "void-2")
	copyAfter := e.publish(lost, "copy-after-void")

	// Two voids of one id, and a void naming no user.
	twice := req(wire.OpClaim, 1, 9)
	e.publishVoid(voidOf(twice.RequestID, 9), "void-3")
	last := e.publishVoid(voidOf(twice.RequestID, 9), "void-4")

	e.start(conf(nil), TestHooks{})
	e.waitFence(max(late, copyAfter, last))

	if r := e.result(applied.RequestID); r.Op != wire.OpJoin || r.Outcome != wire.OutcomeConfirmed || r.Seq >= late {
		t.Errorf("applied request after its void: %+v, want the join's CONFIRMED unchanged", r)
	}
	r := e.result(lost.RequestID)
	if r.Op != wire.OpVoid || r.Outcome != wire.OutcomeRejected || r.Reason != wire.ReasonNeverStored || r.Seq != voided ||
		r.ActivityID != 0 || r.UserID != 0 || r.State != wire.StateDone {
		t.Errorf("voided id: %+v, want REJECTED %q at seq %d", r, wire.ReasonNeverStored, voided)
	}
	if r := e.result(twice.RequestID); r.Op != wire.OpVoid || r.UserID != 9 || r.Reason != wire.ReasonNeverStored {
		t.Errorf("id voided twice: %+v", r)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id IN (?, ?, ?)", applied.RequestID, lost.RequestID, twice.RequestID); n != 3 {
		t.Errorf("%d results for three ids, want one each", n)
	}
	// The copy stored after the void took no seat: user 7 holds the only one.
	if n := e.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = 1 AND user_id = 8"); n != 0 {
		t.Errorf("the copy stored after the void was applied: %d signup rows for user 8", n)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message"); n != 0 {
		t.Errorf("%d messages rejected as malformed, want none", n)
	}
	e.db.CheckInvariants(t)
	e.db.CheckEffects(t)
	e.auditClean()
	// An audit of the carrier's activity alone reads the voids on its
	// subject but not their results (activity_id 0): no divergence.
	e.auditCleanWith(audit.Config{Activities: []int64{1}})
	e.auditCleanWith(audit.Config{Activities: []int64{2}})
}

// TestVoidOnTheWrongSubjectIsRefused: a void names no activity; stored
// anywhere but its partition's carrier subject it is malformed, and so is
// one that carries an activity.
func TestVoidOnTheWrongSubjectIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v := voidOf(req(wire.OpJoin, 1, 1).RequestID, 1)
	data, _ := json.Marshal(v)
	wrong := e.publishRaw(wire.RequestSubject(2), data)
	v2 := voidOf(req(wire.OpJoin, 1, 1).RequestID, 1)
	v2.ActivityID = 1
	data2, _ := json.Marshal(v2)
	withActivity := e.publishRaw(wire.RequestSubject(1), data2)
	e.start(conf(nil), TestHooks{})
	e.waitFence(withActivity)
	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message WHERE seq IN (?, ?)", wrong, withActivity); n != 2 {
		t.Fatalf("%d of the two misplaced voids rejected, want both", n)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request"); n != 0 {
		t.Fatalf("%d results recorded for misplaced voids", n)
	}
	e.auditClean()
}

// TestVoidOfARefusedRequestIsARepeat: a request that was stored and
// refused (here: published on another activity's subject) has its answer,
// the rejection; a void behind it changes nothing, in the same batch or a
// later one.
func TestVoidOfARefusedRequestIsARepeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	misplaced := func() (wire.Request, uint64) {
		r := req(wire.OpJoin, 2, 5)
		data, _ := json.Marshal(r)
		return r, e.publishRaw(wire.RequestSubject(1), data)
	}
	same, _ := misplaced()
	e.publishVoid(voidOf(same.RequestID, 5), "void-same-batch")
	a := e.start(conf(nil), TestHooks{})
	earlier, seq := misplaced()
	e.waitFence(seq)
	a.Stop()
	last := e.publishVoid(voidOf(earlier.RequestID, 5), "void-later-batch")
	e.start(conf(nil), TestHooks{})
	e.waitFence(last)
	for _, id := range []string{same.RequestID, earlier.RequestID} {
		r := e.result(id)
		if r.Op != wire.OpJoin || r.Outcome != wire.OutcomeRejected || r.Reason == wire.ReasonNeverStored {
			t.Errorf("refused request %s after its void: %+v, want its rejection", id, r)
		}
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request"); n != 0 {
		t.Errorf("%d results recorded for voids of refused requests, want none", n)
	}
	e.auditClean()
}
