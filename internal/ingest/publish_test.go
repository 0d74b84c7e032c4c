package ingest

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest/publish"
	"github.com/allot-dev/allot/internal/ingest/reply"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

// TestDefiniteRefusalIsAnsweredAtOnce: a publish the broker refuses for a
// reason that waiting does not change was retried until the publish
// deadline, holding an in-flight slot all along. It is answered at once,
// 503 "nothing was stored".
func TestDefiniteRefusalIsAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	const timeout = 5 * time.Second
	ctx := context.Background()
	tests := []struct {
		name  string
		spoil func(t *testing.T, h *harness)
	}{
		{"stream full", func(t *testing.T, h *harness) {
			st, err := h.js.Stream(ctx, wire.RequestStream)
			if err != nil {
				t.Fatal(err)
			}
			cfg := st.CachedInfo().Config
			cfg.MaxMsgs, cfg.Discard = 1, jetstream.DiscardNew
			if _, err := h.js.UpdateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/1"})
			accepted(t, "the one message the stream holds", resp, body)
		}},
		{"wrong stream", func(t *testing.T, h *harness) {
			if err := h.js.DeleteStream(ctx, wire.RequestStream); err != nil {
				t.Fatal(err)
			}
			if _, err := h.js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{wire.RequestSubjectPrefix + ">"}}); err != nil {
				t.Fatal(err)
			}
		}},
		{"no stream", func(t *testing.T, h *harness) {
			if err := h.js.DeleteStream(ctx, wire.RequestStream); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *Config, d *Deps) { c.PublishTimeout = timeout })
			tt.spoil(t, h)
			start := time.Now()
			resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/2"})
			took := time.Since(start)
			wantStatus(t, tt.name, resp, body, http.StatusServiceUnavailable)
			if msg := errorSentence(t, tt.name, resp, body); msg != reply.MsgBrokerDown {
				t.Errorf("%s: %q, want %q", tt.name, msg, reply.MsgBrokerDown)
			}
			if loc := resp.Header.Get("Location"); loc != "" {
				t.Errorf("%s: Location %q on a request that is not stored", tt.name, loc)
			}
			if took > timeout/2 {
				t.Errorf("%s: answered after %s, want at once (the publish deadline is %s)", tt.name, took, timeout)
			}
			if n := h.svc.pub.InFlight(); n != 0 {
				t.Errorf("%s: %d in-flight slots held after the answer", tt.name, n)
			}
		})
	}
}

// lostAcks makes the broker take request messages and never answer: the
// request stream is gone and a plain subscriber swallows what is
// published, reporting each copy's Nats-Msg-Id and op. back undoes it: the
// stream is there again and copies are stored.
type lostAcks struct {
	h      *harness
	copies chan lostCopy
	sub    *nats.Subscription
}

type lostCopy struct {
	id string
	op wire.Op
}

func loseAcks(t *testing.T, h *harness) *lostAcks {
	t.Helper()
	if err := h.js.DeleteStream(context.Background(), wire.RequestStream); err != nil {
		t.Fatal(err)
	}
	l := &lostAcks{h: h, copies: make(chan lostCopy, 1000)}
	var err error
	l.sub, err = h.nc.Subscribe(wire.RequestSubjectPrefix+">", func(m *nats.Msg) {
		var r struct {
			Op wire.Op `json:"op"`
		}
		json.Unmarshal(m.Data, &r) //nolint:errcheck // a copy without an op is reported as such
		select {
		case l.copies <- lostCopy{m.Header.Get(jetstream.MsgIDHeader), r.Op}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.sub.Unsubscribe() }) //nolint:errcheck
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

// wait returns once a copy of id with op has left the process, and how
// many copies of id it saw until then.
func (l *lostAcks) wait(t *testing.T, id string, op wire.Op, within time.Duration) int {
	t.Helper()
	deadline := time.After(within)
	n := 0
	for {
		select {
		case c := <-l.copies:
			if c.id != id {
				t.Fatalf("a copy left with Nats-Msg-Id %s, want %s", c.id, id)
			}
			n++
			if c.op == op {
				return n
			}
		case <-deadline:
			t.Fatalf("no copy of %s with op %s left the process within %s (%d copies)", id, op, within, n)
		}
	}
}

func (l *lostAcks) back(t *testing.T) { l.backWith(t, 1) }

// backWith is back with a stream of partitions partitions.
func (l *lostAcks) backWith(t *testing.T, partitions int) {
	t.Helper()
	if err := l.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(context.Background(), l.h.js, natstest.Config(partitions)); err != nil {
		t.Fatal(err)
	}
}

// startAllocator applies the request stream into h's database until the
// test ends.
func startAllocator(t *testing.T, h *harness) { startAllocators(t, h, 1) }

// startAllocators starts one allocator per partition.
func startAllocators(t *testing.T, h *harness, partitions int) {
	t.Helper()
	acfg := config.Defaults[allocator.Config]()
	acfg.Partitions = partitions
	for p := range partitions {
		a, err := allocator.New(acfg, allocator.Deps{DB: h.db.DB, NATS: h.nc, Log: slog.New(slog.DiscardHandler), Partition: p})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Stop)
	}
}

type maybeStored struct {
	Error     string `json:"error"`
	RequestID string `json:"request_id"`
}

func wantMaybeStored(t *testing.T, what string, resp *http.Response, body []byte) string {
	t.Helper()
	wantStatus(t, what, resp, body, http.StatusServiceUnavailable)
	ans := decode[maybeStored](t, what, body)
	if ans.RequestID == "" || resp.Header.Get("Location") != "/v1/requests/"+ans.RequestID {
		t.Fatalf("%s: request_id %q, Location %q: want the id and its Location", what, ans.RequestID, resp.Header.Get("Location"))
	}
	if strings.Contains(ans.Error, "nothing was stored") || !strings.HasSuffix(ans.Error, ".") {
		t.Errorf("%s: error %q, want one sentence that does not say nothing was stored", what, ans.Error)
	}
	return ans.RequestID
}

// pollDone polls id on h until it reads done.
func pollDone(t *testing.T, h *harness, id string, within time.Duration) wire.Result {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, body := h.do(req{method: "GET", path: "/v1/requests/" + id + "?wait=2s"})
		wantStatus(t, "poll of "+id, resp, body, http.StatusOK)
		r := decode[wire.Result](t, "poll of "+id, body)
		if r.State == wire.StateDone {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still reads %s after %s", id, r.State, within)
		}
	}
}

func wantNeverStored(t *testing.T, r wire.Result, id string, user int64) {
	t.Helper()
	if r.RequestID != id || r.Outcome != wire.OutcomeRejected || r.Reason != wire.ReasonNeverStored || r.Op != wire.OpVoid ||
		r.UserID != user || r.ActivityID != 0 || r.Seq == 0 || r.AppliedAt.IsZero() {
		t.Fatalf("settled id: %+v, want done REJECTED %q, op void, user %d", r, wire.ReasonNeverStored, user)
	}
}

// TestLostPubAckAnswersWithTheRequestID: a request that left the process
// and got no PubAck may be stored. It answers 503 with the request id and
// its Location, and the id reaches a final state: here no copy is ever
// stored, so once the copies leave the duplicate window ingest voids the
// id, and it reads REJECTED "never stored" instead of pending for ever.
// The same key, retried, is the same request, answered with that result.
func TestLostPubAckAnswersWithTheRequestID(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { c.PublishTimeout = 500 * time.Millisecond })
	h.svc.pub.Configure(3*time.Second, 1) // a short duplicate window
	lost := loseAcks(t, h)

	key := map[string]string{"Idempotency-Key": "k-1"}
	resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/2", header: key})
	id := wantMaybeStored(t, "lost PubAck", resp, body)
	// Copies of the join go out again in the background, then the void.
	if n := lost.wait(t, id, wire.OpVoid, 30*time.Second); n < 3 {
		t.Errorf("%d copies before the void, want the first and at least one more join, then the void", n)
	}
	resp, body = h.do(req{method: "GET", path: "/v1/requests/" + id})
	wantStatus(t, "poll of the id", resp, body, http.StatusOK)
	if r := decode[wire.Result](t, "poll of the id", body); r.State != wire.StatePending {
		t.Errorf("poll before anything is stored: state %s, want pending", r.State)
	}

	lost.back(t)
	startAllocator(t, h)
	wantNeverStored(t, pollDone(t, h, id, 30*time.Second), id, 2)
	if n := h.subjectMsgs(wire.RequestSubject(1)); n != 1 {
		t.Errorf("%d messages stored for the id, want its void alone", n)
	}
	// The same key, retried, is the same request, with its final result.
	resp, body = h.do(req{method: "POST", path: "/v1/activities/1/signups/2?wait=1s", header: key})
	wantStatus(t, "retry with the key", resp, body, http.StatusOK)
	wantNeverStored(t, decode[wire.Result](t, "retry with the key", body), id, 2)
	h.db.CheckInvariants(t)
}

// TestLostPubAckIsStoredOnceInTheBackground: the broker lost the PubAcks
// of a request's first copies, then answers again: a copy published in the
// background is stored, once, and the id reads the applied result.
func TestLostPubAckIsStoredOnceInTheBackground(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { c.PublishTimeout = 500 * time.Millisecond })
	lost := loseAcks(t, h)
	resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/2"})
	id := wantMaybeStored(t, "lost PubAck", resp, body)
	lost.wait(t, id, wire.OpJoin, 5*time.Second)
	lost.back(t)
	startAllocator(t, h)
	r := pollDone(t, h, id, 30*time.Second)
	if r.Op != wire.OpJoin || r.Outcome != wire.OutcomeNoSuchActivity || r.UserID != 2 {
		t.Fatalf("settled id: %+v, want the join applied (NO_SUCH_ACTIVITY: nothing was opened)", r)
	}
	if n := h.subjectMsgs(wire.RequestSubject(1)); n != 1 {
		t.Errorf("%d messages stored for the request, want 1", n)
	}
	if n := testutil.ToFloat64(h.svc.metrics.publish.Settle.Confirmed.WithLabelValues("stored")); n != 1 {
		t.Errorf("allot_ingest_settle_confirmed_total{how=stored} = %v, want 1", n)
	}
	if n := testutil.ToFloat64(h.svc.metrics.publish.Settle.Voids.WithLabelValues("issuer")); n != 0 {
		t.Errorf("%v voids published for a request that was stored", n)
	}
}

// TestPollSettlesTheIDOfADeadIngest: the ingest that issued an id stopped
// before any copy was stored (it died). Another ingest, asked for the id
// after the bound, voids it: the id reads done on both; before the bound
// it reads pending and nothing is published.
func TestPollSettlesTheIDOfADeadIngest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { c.PublishTimeout = 500 * time.Millisecond })
	const window = 3 * time.Second
	h.svc.pub.Configure(window, 1)
	lost := loseAcks(t, h)
	resp, body := h.do(req{method: "POST", path: "/v1/activities/1/claims/4"})
	id := wantMaybeStored(t, "lost PubAck", resp, body)
	h.svc.pub.StopSettling() // the issuer is gone: nothing republishes or voids
	issuedAt := time.Now()
	lost.back(t)
	startAllocator(t, h)

	other := h.another(t, nil)
	other.svc.pub.Configure(window, 1)
	if time.Since(issuedAt) < publish.VoidAfter(window)-time.Second {
		resp, body = other.do(req{method: "GET", path: "/v1/requests/" + id})
		wantStatus(t, "early poll", resp, body, http.StatusOK)
		if r := decode[wire.Result](t, "early poll", body); r.State != wire.StatePending {
			t.Fatalf("early poll: state %s, want pending", r.State)
		}
		if n := h.subjectMsgs(wire.RequestSubject(1)); n != 0 {
			t.Fatalf("%d messages stored by a poll before the bound", n)
		}
	}
	wantNeverStored(t, pollDone(t, other, id, 30*time.Second), id, 0)
	wantNeverStored(t, pollDone(t, h, id, 5*time.Second), id, 0)
	if n := testutil.ToFloat64(other.svc.metrics.publish.Settle.Voids.WithLabelValues("poll")); n != 1 {
		t.Errorf("allot_ingest_voids_total{by=poll} = %v, want 1", n)
	}
}

// TestVoidLandsInTheRequestsPartition: with several partitions the id
// names its request's partition, and the void is stored in that
// partition's order (on its carrier's subject), applied by its allocator,
// and audited clean.
func TestVoidLandsInTheRequestsPartition(t *testing.T) {
	t.Parallel()
	const partitions = 4
	h := newHarness(t, func(c *Config, d *Deps) { c.PublishTimeout = 500 * time.Millisecond; c.Partitions = partitions })
	h.svc.pub.Configure(3*time.Second, partitions)
	activity := int64(2)
	for bus.PartitionOf(activity, partitions) == 0 {
		activity++
	}
	p := bus.PartitionOf(activity, partitions)
	lost := loseAcks(t, h)
	resp, body := h.do(req{method: "POST", path: "/v1/activities/" + strconv.FormatInt(activity, 10) + "/signups/3"})
	id := wantMaybeStored(t, "lost PubAck", resp, body)
	if got := wire.PartitionOfID(uuid.MustParse(id), partitions); got != p {
		t.Fatalf("id %s names partition %d, its activity %d is in %d", id, got, activity, p)
	}
	lost.wait(t, id, wire.OpVoid, 30*time.Second)
	lost.backWith(t, partitions)
	startAllocators(t, h, partitions)
	wantNeverStored(t, pollDone(t, h, id, 30*time.Second), id, 3)
	carrier := bus.StoredSubject(bus.VoidCarrier(p, partitions), partitions)
	if n := h.subjectMsgs(carrier); n != 1 {
		t.Errorf("%d messages on %s, want the void", n, carrier)
	}
	if n := h.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ? AND partition_id = ?", id, p); n != 1 {
		t.Errorf("the void is not recorded in partition %d", p)
	}
	rep, err := audit.Run(context.Background(), audit.Config{}, audit.Deps{DB: h.db.DB, JS: h.js})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range rep.Divergences {
		t.Errorf("audit divergence: %+v", d)
	}
}

// TestSettlingIsBounded: beyond SettleMax ids followed at once, a lost
// PubAck's void is published at once, unfollowed; the id still settles.
func TestSettlingIsBounded(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { c.PublishTimeout = 500 * time.Millisecond; d.Test.SettleMax = 1 })
	lost := loseAcks(t, h)
	resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/1"})
	followed := wantMaybeStored(t, "first lost PubAck", resp, body)
	resp, body = h.do(req{method: "POST", path: "/v1/activities/1/signups/2"})
	id := wantMaybeStored(t, "second lost PubAck", resp, body)
	if n := testutil.ToFloat64(h.svc.metrics.publish.Settle.Voids.WithLabelValues("overflow")); n != 1 {
		t.Fatalf("allot_ingest_voids_total{by=overflow} = %v, want 1", n)
	}
	if n := testutil.ToFloat64(h.svc.metrics.publish.Settle.Active); n != 1 {
		t.Fatalf("allot_ingest_settle_active = %v, want 1 (the bound)", n)
	}
	lost.back(t)
	startAllocator(t, h)
	// The overflowed void was swallowed with the broker's lost answers;
	// a poll after the bound settles the id.
	h.svc.pub.Configure(time.Second, 1)
	wantNeverStored(t, pollDone(t, h, id, 30*time.Second), id, 0)
	if r := pollDone(t, h, followed, 30*time.Second); r.Op != wire.OpJoin {
		t.Errorf("followed id: %+v, want the join stored and applied", r)
	}
}

// TestDuplicateInProcessIsMaybeStored: the broker answering "duplicate
// message id is in process" (10158) says a copy with this id is being
// stored: the write answers 503 with the id (it may be stored), never
// "nothing was stored".
func TestDuplicateInProcessIsMaybeStored(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { c.PublishTimeout = time.Second; c.CommitMinBatch = -1 })
	if err := h.js.DeleteStream(context.Background(), wire.RequestStream); err != nil {
		t.Fatal(err)
	}
	// A broker that answers every copy with 10158.
	sub, err := h.nc.Subscribe(wire.RequestSubjectPrefix+">", func(m *nats.Msg) {
		m.Respond([]byte(`{"error":{"code":409,"err_code":10158,"description":"duplicate message id is in process"}}`)) //nolint:errcheck
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/2"})
	wantMaybeStored(t, "10158", resp, body)
}
