package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/stacktest"
	"github.com/allot-dev/allot/internal/wire"
)

// Shed answers must be exactly the allocator's answer at the
// claim's place in the stream, on every ingest, across failover. These
// tests run several ingests and allocators over one database and one
// JetStream server, each with its own connection, as separate processes
// would.

// fleet is one test's system with several ingests and allocators.
type fleet struct {
	t       *testing.T
	db      *dbtest.DB
	ns      *natstest.Server
	ingests []*stack
	allocs  []*allocator.Allocator
	regs    []*prometheus.Registry
	acfg    allocator.Config
	ackWait time.Duration // the consumer's redelivery timeout (0: production's)
}

func newFleet(t *testing.T, ingests int, fo failover) *fleet {
	t.Helper()
	f := &fleet{t: t, db: dbtest.New(t), ns: natstest.New(t), acfg: fo.acfg, ackWait: fo.ackWait}
	f.ns.Setup(t, natstest.Config(fo.acfg.Partitions))
	f.startAllocator()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for range ingests {
		nc, js := f.ns.Connect(t)
		icfg := stacktest.IngestConfig()
		icfg.Partitions = max(fo.acfg.Partitions, 1)
		svc, err := ingest.New(icfg, ingest.Deps{DB: f.db.DB, NATS: nc, JS: js, Log: log, Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		if err := svc.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(svc.Stop)
		srv := httptest.NewServer(svc.Handler())
		t.Cleanup(srv.Close)
		f.ingests = append(f.ingests, &stack{t: t, db: f.db, ns: f.ns, js: js, url: srv.URL,
			cl: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}})
	}
	return f
}

// startAllocator starts one more allocator process (one partition).
func (f *fleet) startAllocator() int {
	f.t.Helper()
	nc, _ := f.ns.Connect(f.t)
	reg := prometheus.NewRegistry()
	a, err := allocator.New(f.acfg, allocator.Deps{DB: f.db.DB, NATS: nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: reg,
		Test: allocator.TestHooks{AckWait: f.ackWait}})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(a.Stop)
	f.allocs = append(f.allocs, a)
	f.regs = append(f.regs, reg)
	return len(f.allocs) - 1
}

// applied is how many requests allocator i has applied.
func (f *fleet) applied(i int) float64 {
	mfs, err := f.regs[i].Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "allot_allocator_decisions_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// holdFence locks the partition's fence row, so that no allocator can apply
// anything until release is called: requests stay stored and unapplied.
func holdFence(t *testing.T, db *dbtest.DB) (release func()) {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("SELECT * FROM allocator_partition FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { tx.Rollback() }) } //nolint:errcheck
	t.Cleanup(release)
	return release
}

// accepted sends a write without ?wait and requires its 202.
func (s *stack) accepted(method, path string) string {
	s.t.Helper()
	code, m := s.call(method, path, "")
	if code != http.StatusAccepted {
		s.t.Fatalf("%s %s: %d %v, want 202", method, path, code, m)
	}
	return m["request_id"].(string)
}

// claimLater claims with ?wait= in the background; the answer arrives on
// the returned channel.
func (s *stack) claimLater(a, u int) <-chan map[string]any {
	ch := make(chan map[string]any, 1)
	go func() {
		_, m, err := s.try("POST", fmt.Sprintf("/v1/activities/%d/claims/%d?wait=20s", a, u), "")
		if err != nil {
			m = map[string]any{"error": err.Error()}
		}
		ch <- m
	}()
	return ch
}

// notYet requires that ch holds no answer after d: the claim is waiting
// for the allocator rather than answered from a view.
func notYet(t *testing.T, what string, ch <-chan map[string]any, d time.Duration) {
	t.Helper()
	select {
	case m := <-ch:
		t.Fatalf("%s: answered %v before the allocator could apply the request before it", what, m)
	case <-time.After(d):
	}
}

// fullAndShedding opens act with one seat for user 1 and claims until
// ingest s sheds one (the view is in place there).
func fullAndShedding(s *stack, act int) {
	s.open(act, 1)
	want(s.t, "holder", s.join(act, 1), "outcome", string(wire.OutcomeConfirmed))
	s.claimUntilShed(act, 99, string(wire.OutcomeSoldOut))
}

// claimBehindPending holds the fence, so that nothing is applied, sends
// the write method path (202: stored, not applied) and then a claim by
// user, requires that the claim is not answered while the write before it
// is pending, and returns the claim's answer once the fence is released.
func (s *stack) claimBehindPending(act int, method, path string, user int) map[string]any {
	s.t.Helper()
	release := holdFence(s.t, s.db)
	s.accepted(method, path)
	claim := s.claimLater(act, user)
	notYet(s.t, "claim after a pending "+method+" "+path, claim, 300*time.Millisecond)
	release()
	return <-claim
}

// TestShedAfterPendingCancel: a cancel acknowledged but not yet
// applied frees a seat at its place in the stream; a claim stored after it
// is GRANTED, never answered SOLD_OUT from the view taken before it.
func TestShedAfterPendingCancel(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act = 88
	fullAndShedding(s, act)

	m := s.claimBehindPending(act, "DELETE", fmt.Sprintf("/v1/activities/%d/signups/1", act), 2)
	want(t, "claim after the cancel", m, "outcome", string(wire.OutcomeGranted), "status", string(wire.StatusConfirmed))
	s.sameAsRecorded("claim after the cancel", m)
	s.db.CheckInvariants(t)
}

// TestShedAfterJoin: a user who joined the waitlist of a full
// activity after its view was taken, and then claims, is ALREADY_WAITING,
// as the allocator answers, not SOLD_OUT.
func TestShedAfterJoin(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act = 89
	fullAndShedding(s, act)

	m := s.claimBehindPending(act, "POST", fmt.Sprintf("/v1/activities/%d/signups/5", act), 5)
	want(t, "claim by a waiter", m, "outcome", string(wire.OutcomeAlreadyWaiting), "status", string(wire.StatusWaiting), "position", 1)
	s.sameAsRecorded("claim by a waiter", m)
	s.db.CheckInvariants(t)
}

// TestShedAfterHandover: the allocator that published a full
// activity's view stops; the survivor takes the partition, a resize frees
// seats, and claims on every ingest are GRANTED. The survivor also rebuilds
// the views it inherited, so no sheddable view outlives the state.
func TestShedAfterHandover(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2, fastFailover())
	in1, in2 := f.ingests[0], f.ingests[1]
	const act = 90
	in1.open(act, 1) // applied by the first allocator, which is pinned
	f.startAllocator()
	want(t, "holder", in1.join(act, 1), "outcome", string(wire.OutcomeConfirmed))
	in1.claimUntilShed(act, 99, string(wire.OutcomeSoldOut))
	in2.claimUntilShed(act, 98, string(wire.OutcomeSoldOut))

	owner, survivor := 0, 1
	if f.applied(1) > f.applied(0) {
		owner, survivor = 1, 0
	}
	if f.applied(owner) == 0 || f.applied(survivor) != 0 {
		t.Fatalf("precondition: one allocator applied everything; got %v and %v", f.applied(0), f.applied(1))
	}
	f.allocs[owner].Stop()

	want(t, "resize", in1.done("PUT", fmt.Sprintf("/v1/activities/%d", act), `{"capacity": 3}`), "outcome", string(wire.OutcomeResized))
	if f.applied(survivor) == 0 {
		t.Fatal("precondition: the survivor did not take the partition")
	}
	for i, in := range []*stack{in1, in2} {
		m := in.done("POST", fmt.Sprintf("/v1/activities/%d/claims/%d", act, 10+i), "")
		want(t, fmt.Sprintf("claim on ingest %d after the resize", i+1), m, "outcome", string(wire.OutcomeGranted))
		in.sameAsRecorded("claim after the resize", m)
	}
	// The stored view is the survivor's, not the stopped owner's.
	e, err := in1.js.KeyValue(context.Background(), wire.ViewBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := e.Get(context.Background(), wire.ViewKey(act))
	if err != nil {
		t.Fatal(err)
	}
	var v wire.View
	if err := json.Unmarshal(entry.Value(), &v); err != nil {
		t.Fatal(err)
	}
	if allocation.ViewDecides(v) && v.Capacity != 3 {
		t.Fatalf("a sheddable view of an older state survived the handover: %+v", v)
	}
	f.db.CheckInvariants(t)
}

// TestLateViewAfterClearIsIgnored: a delayed put of an older full view,
// arriving after a newer clear, neither reinstalls shedding nor answers a
// claim SOLD_OUT on an activity with a free seat.
func TestLateViewAfterClearIsIgnored(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act = 91
	fullAndShedding(s, act)
	ctx := context.Background()
	kv, err := s.js.KeyValue(ctx, wire.ViewBucket)
	if err != nil {
		t.Fatal(err)
	}
	old, err := kv.Get(ctx, wire.ViewKey(act))
	if err != nil {
		t.Fatal(err)
	}
	s.cancel(act, 1) // frees the seat: the view is cleared
	waitView(t, kv, act, func(v wire.View) bool { return !allocation.ViewDecides(v) })
	if _, err := kv.Put(ctx, wire.ViewKey(act), old.Value()); err != nil { // the late put
		t.Fatal(err)
	}
	waitView(t, kv, act, func(v wire.View) bool { return allocation.ViewDecides(v) })
	m := s.done("POST", fmt.Sprintf("/v1/activities/%d/claims/7", act), "")
	want(t, "claim after the late put", m, "outcome", string(wire.OutcomeGranted))
	if m["shed"] == true {
		t.Fatalf("answered from a view: %v", m)
	}
	s.sameAsRecorded("claim after the late put", m)
}

// waitView waits until the stored view of act satisfies ok.
func waitView(t *testing.T, kv jetstream.KeyValue, act int, ok func(wire.View) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := kv.Get(context.Background(), wire.ViewKey(int64(act)))
		if err == nil {
			var v wire.View
			if json.Unmarshal(e.Value(), &v) == nil && ok(v) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the view of activity %d never reached the expected state", act)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestShedAnswerIsRecordedAndAudited: a shed claim is in the
// stream and applied like any other: its poll gives the full result, the
// allocator records the same decision at the same seq, and the audit
// replays it.
func TestShedAnswerIsRecordedAndAudited(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act = 92
	fullAndShedding(s, act)
	holder := s.claimUntilShed(act, 1, string(wire.OutcomeAlreadyOwned))
	sold := s.claimUntilShed(act, 9, string(wire.OutcomeSoldOut))
	for _, m := range []map[string]any{holder, sold} {
		id := m["request_id"].(string)
		code, poll := s.call("GET", "/v1/requests/"+id+"?wait=10s", "")
		if code != http.StatusOK {
			t.Fatalf("poll of a shed answer: %d %v", code, poll)
		}
		want(t, "poll of a shed answer", poll, "state", wire.StateDone, "op", wire.OpClaim,
			"activity_id", act, "user_id", m["user_id"], "outcome", m["outcome"], "seq", m["seq"])
		if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(poll["applied_at"])); err != nil {
			t.Fatalf("poll of a shed answer: applied_at %v", poll["applied_at"])
		}
	}
	waitApplied(t, s.db, sold["seq"].(float64))
	s.sameAsRecorded("holder's shed answer", holder)
	s.sameAsRecorded("shed SOLD_OUT", sold)
	requireCleanAudit(t, s)
}

// waitApplied waits until the fence passes seq.
func waitApplied(t *testing.T, db *dbtest.DB, seq float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for db.Count(t, "SELECT COALESCE(MAX(last_seq), 0) FROM allocator_partition") < int64(seq) {
		if time.Now().After(deadline) {
			t.Fatalf("seq %v never applied", seq)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func requireCleanAudit(t *testing.T, s *stack) {
	t.Helper()
	rep, err := audit.Run(context.Background(), audit.Config{}, audit.Deps{DB: s.db.DB, JS: s.js})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		var lines []string
		for _, d := range rep.Divergences {
			lines = append(lines, fmt.Sprintf("%+v", d))
		}
		t.Fatalf("audit: %d divergences:\n%s", len(rep.Divergences), strings.Join(lines, "\n"))
	}
}

// TestRefusedRequestReadsRejected: a request MySQL refuses is recorded as
// REJECTED with its reason; its poll answers done, never pending forever,
// and a ?wait= write is told at once.
func TestRefusedRequestReadsRejected(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	if _, err := s.db.Exec(`CREATE TRIGGER poison_signup BEFORE INSERT ON activity_signup FOR EACH ROW
		BEGIN IF NEW.user_id = 666 THEN SET NEW.status = 'BOGUS'; END IF; END`); err != nil {
		t.Fatal(err)
	}
	const act = 93
	s.open(act, 5)
	m := s.done("POST", fmt.Sprintf("/v1/activities/%d/signups/666", act), "")
	want(t, "refused join", m, "outcome", string(wire.OutcomeRejected), "op", wire.OpJoin, "activity_id", act, "user_id", 666)
	if r, _ := m["reason"].(string); !strings.Contains(r, "cannot be applied") {
		t.Fatalf("refused join: reason %q", m["reason"])
	}
	code, poll := s.call("GET", "/v1/requests/"+m["request_id"].(string), "")
	if code != http.StatusOK {
		t.Fatalf("poll: %d %v", code, poll)
	}
	want(t, "poll of a refused request", poll, "state", wire.StateDone, "outcome", string(wire.OutcomeRejected),
		"op", wire.OpJoin, "user_id", 666, "seq", m["seq"], "reason", m["reason"])
	// The next request goes through as usual.
	want(t, "next join", s.join(act, 1), "outcome", string(wire.OutcomeConfirmed))
	// A resize below the seats taken is the domain's REJECTED, with a reason.
	m = s.done("PUT", fmt.Sprintf("/v1/activities/%d", act), `{"capacity": 0}`)
	want(t, "shrink below the seats taken", m, "outcome", string(wire.OutcomeRejected))
	if m["reason"] == nil {
		t.Fatalf("a REJECTED resize carries no reason: %v", m)
	}
	s.db.CheckInvariants(t)
}

// TestShedAnswersMatchTheStream: many rounds of concurrent cancels,
// resizes, joins and claims through two ingests and two allocators, with
// shedding on. Every answer a client received equals the allocator's
// recorded decision for that request id, the audit is clean and the
// invariants hold.
func TestShedAnswersMatchTheStream(t *testing.T) {
	t.Parallel()
	rounds := 12
	if testing.Short() {
		rounds = 3
	}
	shedAnswersMatchTheStream(t, 500, rounds, "")
}

// shedAnswersMatchTheStream runs rounds of TestShedAnswersMatchTheStream
// on activities from first on; with a hold, the activities hold the seats
// they give for that long, and confirms join the mix.
func shedAnswersMatchTheStream(t *testing.T, first, rounds int, hold string) {
	f := newFleet(t, 2, fastFailover())
	f.startAllocator()
	rng := rand.New(rand.NewPCG(9, 1))
	openBody := func(c int) string {
		if hold == "" {
			return fmt.Sprintf(`{"capacity": %d}`, c)
		}
		return fmt.Sprintf(`{"capacity": %d, "hold": %q}`, c, hold)
	}
	var (
		mu      sync.Mutex
		answers []map[string]any
		shed    int
	)
	for r := range rounds {
		act := first + r
		c := 2 + rng.IntN(3)
		f.ingests[0].done("PUT", fmt.Sprintf("/v1/activities/%d", act), openBody(c))
		// Fill it, so that views exist and claims can be shed.
		for u := 1; u <= c; u++ {
			f.ingests[u%2].join(act, u)
		}
		f.ingests[0].claimUntilShed(act, 50, string(wire.OutcomeSoldOut))
		f.ingests[1].claimUntilShed(act, 51, string(wire.OutcomeSoldOut))
		if hold != "" {
			// User 1 holds a seat under the hold: shed too, in
			// every round (claimUntilShed fails the test otherwise), and
			// checked against the stream with the others. Not counted: the
			// count below is of the concurrent mix's shed answers.
			m := f.ingests[1].claimUntilShed(act, 1, string(wire.OutcomeAlreadyOwned))
			if m["status"] != string(wire.StatusHeld) {
				t.Fatalf("round %d: a HELD user's shed answer %v", r, m)
			}
			answers = append(answers, m)
		}
		var wg sync.WaitGroup
		send := func(in *stack, method, path, body string) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, m, err := in.try(method, path+"?wait=20s", body)
				if err != nil || code != http.StatusOK {
					t.Errorf("%s %s: %d %v %v", method, path, code, m, err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				answers = append(answers, m)
				if m["shed"] == true {
					shed++
				}
			}()
		}
		for i := range 120 {
			in := f.ingests[i%2]
			u := 1 + rng.IntN(12)
			var method, path, body string
			switch k := rng.IntN(40); {
			case hold != "" && k < 4:
				method, path = "POST", fmt.Sprintf("/v1/activities/%d/signups/%d/confirm", act, u)
			case k < 34:
				method, path = "POST", fmt.Sprintf("/v1/activities/%d/claims/%d", act, u)
			case k < 36:
				method, path = "DELETE", fmt.Sprintf("/v1/activities/%d/signups/%d", act, u)
			case k < 39:
				method, path = "POST", fmt.Sprintf("/v1/activities/%d/signups/%d", act, u)
			default:
				method, path, body = "PUT", fmt.Sprintf("/v1/activities/%d", act), openBody(1+rng.IntN(5))
			}
			send(in, method, path, body)
			if i%10 == 9 {
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			}
		}
		wg.Wait()
		// Then a burst of claims alone, as a sale's tail looks.
		for i := range 60 {
			send(f.ingests[i%2], "POST", fmt.Sprintf("/v1/activities/%d/claims/%d", act, 1+rng.IntN(30)), "")
		}
		wg.Wait()
	}
	if t.Failed() {
		t.FailNow()
	}
	if shed == 0 {
		t.Fatal("no claim was shed: the test proved nothing about shedding")
	}
	for i, m := range answers {
		f.ingests[0].sameAsRecorded(fmt.Sprintf("answer %d", i), m)
	}
	t.Logf("%d answers, %d of them shed in the concurrent mix, all equal to the recorded decisions", len(answers), shed)
	f.db.CheckInvariants(t)
	requireCleanAudit(t, f.ingests[0])
}

// failover is the configuration of a fleet that hands partitions over
// quickly: a short pin, and a short redelivery timeout.
type failover struct {
	acfg    allocator.Config
	ackWait time.Duration
}

func fastFailover() failover {
	c := config.Defaults[allocator.Config]()
	c.PinnedTTL = time.Second
	return failover{acfg: c, ackWait: 2 * time.Second}
}
