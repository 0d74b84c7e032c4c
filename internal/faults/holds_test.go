package faults

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

// TestScenario12HoldsSurviveKill: kill -9 the allocator right after
// commits that created holds, before its relay scheduled their expiries,
// and start it again only after every hold has ended. To make sure the kill
// lands there, ALLOT_HOLDS stops taking schedules meanwhile (its subjects
// are moved aside, so the relay's publishes find no stream); `allotctl
// setup` puts the stream's configuration back before the allocator starts
// again (the allocator only checks it, and would not start on it). The outbox schedules
// what the dead relay did not; every hold's expire is stored once and
// applied once, in stream order, received at or after its hold's end (as
// the stream and the hold's recorded held_until say), and promotes the next
// waiter, whose hold lapses in turn.
func TestScenario12HoldsSurviveKill(t *testing.T) {
	s := newStack(t, stackConfig{})
	ctx := context.Background()
	const (
		act     = 1201
		seats   = 300
		waiters = 100
		hold    = 2 * time.Second
	)
	// Opened straight on the stream: the test needs no more of ingest
	// than the joins.
	capacity := int64(seats)
	open := wire.Request{RequestID: uuid.Must(uuid.NewV7()).String(), Op: wire.OpOpen, ActivityID: act,
		Capacity: &capacity, Hold: wire.Duration(hold), ReceivedAt: time.Now().UTC()}
	data, _ := json.Marshal(open)
	msg := nats.NewMsg(wire.RequestSubject(act))
	msg.Data = data
	if _, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgID(open.RequestID)); err != nil {
		t.Fatal(err)
	}
	s.must(poll(20*time.Second, "the activity opened", func() (bool, error) {
		return s.db.Count(t, "SELECT COUNT(*) FROM activity WHERE id = ?", act) == 1, nil
	}))

	// The relay cannot schedule from now on.
	st, err := s.js.Stream(ctx, wire.HoldStream)
	if err != nil {
		t.Fatal(err)
	}
	aside := st.CachedInfo().Config
	aside.Subjects = []string{"allot.test.holds-aside.>"}
	if _, err := s.js.UpdateStream(ctx, aside); err != nil {
		t.Fatal(err)
	}

	// The joins, and a kill once holds are committed.
	var wg sync.WaitGroup
	users := make(chan int64)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range users {
				a := s.send(ctx, request{method: http.MethodPost, path: fmt.Sprintf("/v1/activities/%d/signups/%d", act, u)})
				if a.err != nil || a.code != http.StatusAccepted {
					t.Errorf("join of user %d: %+v", u, a)
				}
			}
		}()
	}
	go func() {
		for u := int64(1); u <= seats+waiters; u++ {
			users <- u
		}
		close(users)
	}()
	var held, scheduled int64
	s.must(poll(20*time.Second, "the first holds committed", func() (bool, error) {
		held = s.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND status = 'HELD'", act)
		return held >= 50, nil
	}))
	if err := s.allocs[0].kill(); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	wg.Wait()
	held = s.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND status = 'HELD'", act)
	// The stream is there (moved aside, not gone), so that no message in
	// it is no message scheduled.
	if _, err := s.js.Stream(ctx, wire.HoldStream); err != nil {
		t.Fatalf("precondition: stream %s: %v", wire.HoldStream, err)
	}
	scheduled = int64(natstest.StreamMsgs(t, s.js, wire.HoldStream))
	t.Logf("killed the allocator with %d holds committed and %d expiries scheduled", held, scheduled)
	if scheduled != 0 || held == 0 {
		t.Fatalf("%d expiries scheduled for %d holds before the kill: the kill did not land between commits and their relay", scheduled, held)
	}

	// Restart only once every committed hold has ended.
	var lastEnd time.Time
	if err := s.db.QueryRow("SELECT COALESCE(MAX(held_until), NOW(6)) FROM activity_signup WHERE activity_id = ?", act).Scan(&lastEnd); err != nil {
		t.Fatal(err)
	}
	time.Sleep(max(time.Until(lastEnd.Add(time.Second)), time.Until(killedAt.Add(hold+time.Second))))
	s.must(s.runSetup())
	s.must(s.startAllocator(0))

	// Every seat is held once by a joiner and, as their holds lapse, by a
	// waiter; in the end every hold has lapsed.
	s.must(poll(60*time.Second, "every hold lapsed", func() (bool, error) {
		var taken, waiting int64
		err := s.db.QueryRow("SELECT a.confirmed_count, (SELECT COUNT(*) FROM activity_signup w WHERE w.activity_id = a.id AND w.status = 'WAITING') "+
			"FROM activity a WHERE a.id = ?", act).Scan(&taken, &waiting)
		return err == nil && taken == 0 && waiting == 0, err
	}))
	holds := s.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND outcome = 'HELD'", act) +
		s.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND op = 'expire' AND promoted_user_ids IS NOT NULL", act)
	if holds != seats+waiters {
		t.Errorf("%d holds given, want %d (every joiner held once)", holds, seats+waiters)
	}
	if n := s.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND op = 'expire' AND outcome = 'EXPIRED'", act); n != holds {
		t.Errorf("%d expires applied, want one per hold (%d)", n, holds)
	}
	if n := s.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND op = 'expire' AND outcome <> 'EXPIRED'", act); n != 0 {
		t.Errorf("%d expires did not find their hold", n)
	}
	// Stored once: the stream holds the open, the joins and one expire
	// per hold, in messages of one request or batches.
	if n := storedRequests(t, s.js); n != uint64(1+seats+waiters+holds) {
		t.Errorf("request stream holds %d requests, want %d", n, 1+seats+waiters+holds)
	}
	// In stream order: an expire's place follows the place (queue_seq,
	// seq * 65536 + index) of the signup it expires.
	if n := s.db.Count(t, "SELECT COUNT(*) FROM processed_request e JOIN activity_signup s ON s.activity_id = e.activity_id AND s.user_id = e.user_id "+
		"WHERE e.activity_id = ? AND e.op = 'expire' AND e.seq * 65536 + e.batch_index <= s.queue_seq", act); n != 0 {
		t.Errorf("%d expires ordered before the signup they expire", n)
	}
	// After the hold's end: every expire was received (fell due) at or
	// after the held_until recorded by the request that gave its hold (the
	// join, or the expire that promoted the user), and follows it in the
	// stream.
	requests, err := s.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	var expires []uint64
	rows, err := s.db.Query("SELECT seq FROM processed_request WHERE activity_id = ? AND op = 'expire' ORDER BY seq", act)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var seq uint64
		if err := rows.Scan(&seq); err != nil {
			t.Fatal(err)
		}
		expires = append(expires, seq)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if int64(len(expires)) != holds {
		t.Errorf("%d expires recorded, want one per hold (%d)", len(expires), holds)
	}
	for _, seq := range expires {
		m, err := requests.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("expire at seq %d: %v", seq, err)
		}
		var req wire.Request
		if err := json.Unmarshal(m.Data, &req); err != nil {
			t.Fatalf("expire at seq %d: %v", seq, err)
		}
		var heldUntil sql.NullTime
		// One request gives holds of one end only: its result's held_until.
		if err := s.db.QueryRow("SELECT held_until FROM processed_request WHERE activity_id = ? AND seq = ?",
			act, req.HoldSeq).Scan(&heldUntil); err != nil {
			t.Fatalf("the hold at seq %d that the expire at seq %d lapses: %v", req.HoldSeq, seq, err)
		}
		if !heldUntil.Valid || req.HoldSeq >= seq || req.ReceivedAt.Before(heldUntil.Time) {
			t.Errorf("expire at seq %d of user %d received at %v, for the hold from seq %d held until %v",
				seq, req.UserID, req.ReceivedAt, req.HoldSeq, heldUntil)
		}
	}
	s.db.CheckInvariants(t)
	// The audit replays the holds, the expiries the restarted relay
	// scheduled late and the promotions they made, and agrees.
	rep, err := audit.Run(ctx, audit.Config{}, audit.Deps{DB: s.db.DB, JS: s.js})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range rep.Divergences {
		t.Errorf("audit divergence: %+v", d)
	}
	if rep.Pending != 0 || rep.Malformed != 0 {
		t.Errorf("audit: %d pending, %d malformed", rep.Pending, rep.Malformed)
	}
}

// storedRequests is the number of requests the request stream holds, read
// from its messages' headers: a batch counts its wire.BatchHeader, any
// other message one.
func storedRequests(t testing.TB, js jetstream.JetStream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs == 0 {
		return 0
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{HeadersOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for {
		msgs, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range msgs.Messages() {
			got++
			size, err := wire.BatchSize(m.Headers().Get(wire.BatchHeader))
			if err != nil || size == 0 {
				size = 1
			}
			n += uint64(size)
			if md, err := m.Metadata(); err == nil && md.Sequence.Stream >= info.State.LastSeq {
				return n
			}
		}
		if msgs.Error() != nil || got == 0 {
			t.Fatalf("read the request stream's headers: %v after %d requests", msgs.Error(), n)
		}
	}
}
