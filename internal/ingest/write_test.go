package ingest

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

func TestGoodWriteIsPublishedOnceThenAcked(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)

	tests := []struct {
		name         string
		req          req
		wantOp       wire.Op
		wantActivity int64
		wantUser     int64
		wantCapacity *int64
		wantHold     time.Duration
	}{
		{name: "open", req: req{method: "PUT", path: "/v1/activities/101", body: `{"capacity": 25}`},
			wantOp: wire.OpOpen, wantActivity: 101, wantCapacity: ptr[int64](25)},
		{name: "open zero", req: req{method: "PUT", path: "/v1/activities/102", body: `{"capacity":0}`},
			wantOp: wire.OpOpen, wantActivity: 102, wantCapacity: ptr[int64](0)},
		{name: "open with a hold", req: req{method: "PUT", path: "/v1/activities/106", body: `{"capacity": 3, "hold": "10m"}`},
			wantOp: wire.OpOpen, wantActivity: 106, wantCapacity: ptr[int64](3), wantHold: 10 * time.Minute},
		{name: "open with a zero hold", req: req{method: "PUT", path: "/v1/activities/107", body: `{"capacity": 3, "hold": "0s"}`},
			wantOp: wire.OpOpen, wantActivity: 107, wantCapacity: ptr[int64](3)},
		{name: "confirm", req: req{method: "POST", path: "/v1/activities/108/signups/42/confirm"},
			wantOp: wire.OpConfirm, wantActivity: 108, wantUser: 42},
		{name: "join", req: req{method: "POST", path: "/v1/activities/103/signups/42"},
			wantOp: wire.OpJoin, wantActivity: 103, wantUser: 42},
		{name: "cancel", req: req{method: "DELETE", path: "/v1/activities/104/signups/42"},
			wantOp: wire.OpCancel, wantActivity: 104, wantUser: 42},
		{name: "claim with max ids", req: req{method: "POST", path: "/v1/activities/9223372036854775807/claims/9223372036854775807"},
			wantOp: wire.OpClaim, wantActivity: 9223372036854775807, wantUser: 9223372036854775807},
		{name: "join with a body and wait=0", req: req{method: "POST", path: "/v1/activities/105/signups/7?wait=0", body: `ignored`},
			wantOp: wire.OpJoin, wantActivity: 105, wantUser: 7},
	}
	for _, tt := range tests {
		before := time.Now().UTC()
		resp, body := h.do(tt.req)
		id := accepted(t, tt.name, resp, body)

		subject := wire.RequestSubject(tt.wantActivity)
		if n := h.subjectMsgs(subject); n != 1 {
			t.Fatalf("%s: %d messages on %s, want 1", tt.name, n, subject)
		}
		m := h.lastMsg(subject)
		if got := m.Header.Get(jetstream.MsgIDHeader); got != id {
			t.Errorf("%s: Nats-Msg-Id = %q, want the request id %q", tt.name, got, id)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(m.Data, &fields); err != nil {
			t.Fatalf("%s: message %s: %v", tt.name, m.Data, err)
		}
		wantFields := []string{"request_id", "op", "activity_id", "user_id", "received_at"}
		if tt.wantCapacity != nil {
			wantFields = append(wantFields, "capacity")
		}
		if tt.wantHold != 0 {
			wantFields = append(wantFields, "hold")
		}
		if len(fields) != len(wantFields) {
			t.Errorf("%s: message fields %s, want exactly %v", tt.name, m.Data, wantFields)
		}
		for _, f := range wantFields {
			if _, ok := fields[f]; !ok {
				t.Errorf("%s: message %s lacks %q", tt.name, m.Data, f)
			}
		}
		if _, err := wire.DecodeRequest(m.Subject, m.Data); err != nil {
			t.Errorf("%s: the allocator would reject the message %s: %v", tt.name, m.Data, err)
		}
		msg := decode[wire.Request](t, tt.name, m.Data)
		if msg.RequestID != id || msg.Op != tt.wantOp || msg.ActivityID != tt.wantActivity || msg.UserID != tt.wantUser {
			t.Errorf("%s: message %+v, want id %s op %s activity %d user %d", tt.name, msg, id, tt.wantOp, tt.wantActivity, tt.wantUser)
		}
		if (msg.Capacity == nil) != (tt.wantCapacity == nil) || (msg.Capacity != nil && *msg.Capacity != *tt.wantCapacity) {
			t.Errorf("%s: capacity %v, want %v", tt.name, msg.Capacity, tt.wantCapacity)
		}
		if time.Duration(msg.Hold) != tt.wantHold {
			t.Errorf("%s: hold %s, want %s", tt.name, time.Duration(msg.Hold), tt.wantHold)
		}
		if msg.ReceivedAt.Before(before.Add(-time.Second)) || msg.ReceivedAt.After(time.Now().Add(time.Second)) || msg.ReceivedAt.Location() != time.UTC {
			t.Errorf("%s: received_at %s is not now in UTC", tt.name, msg.ReceivedAt)
		}
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 7 || !h.svc.callers.ids.Issued(u) {
			t.Errorf("%s: request id %s is not an issued UUIDv7 (err %v)", tt.name, id, err)
		}
	}
	if n := natstest.StreamMsgs(t, h.js, wire.RequestStream); n != uint64(len(tests)) {
		t.Fatalf("%s holds %d messages, want %d", wire.RequestStream, n, len(tests))
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	key := func(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }

	join := req{method: "POST", path: "/v1/activities/7/signups/3", header: key("key-1")}
	resp, body := h.do(join)
	first := accepted(t, "first use", resp, body)
	resp, body = h.do(join)
	if again := accepted(t, "repeat", resp, body); again != first {
		t.Fatalf("repeat answered request id %s, want the first one %s", again, first)
	}
	// Leading zeros name the same activity and user, so the same path.
	resp, body = h.do(req{method: "POST", path: "/v1/activities/007/signups/03", header: key("key-1")})
	if again := accepted(t, "repeat, same path spelled with zeros", resp, body); again != first {
		t.Fatalf("repeat answered request id %s, want %s", again, first)
	}
	if n := natstest.StreamMsgs(t, h.js, wire.RequestStream); n != 1 {
		t.Fatalf("%s holds %d messages after three uses of one key, want 1", wire.RequestStream, n)
	}
	m := h.lastMsg(wire.RequestSubject(7))
	if got := decode[wire.Request](t, "message", m.Data); got.RequestID != first || got.IdempotencyKey != "key-1" {
		t.Fatalf("message %+v, want request id %s and idempotency key key-1", got, first)
	}

	conflicts := []struct {
		name string
		req  req
	}{
		{name: "same key, other path", req: req{method: "POST", path: "/v1/activities/7/signups/4", header: key("key-1")}},
		{name: "same key, other activity", req: req{method: "POST", path: "/v1/activities/8/signups/3", header: key("key-1")}},
		{name: "same key, other op, same path", req: req{method: "DELETE", path: "/v1/activities/7/signups/3", header: key("key-1")}},
		{name: "same key, claim", req: req{method: "POST", path: "/v1/activities/7/claims/3", header: key("key-1")}},
		{name: "same key, confirm", req: req{method: "POST", path: "/v1/activities/7/signups/3/confirm", header: key("key-1")}},
	}
	for _, tt := range conflicts {
		resp, body := h.do(tt.req)
		wantStatus(t, tt.name, resp, body, http.StatusUnprocessableEntity)
		msg := errorSentence(t, tt.name, resp, body)
		if !strings.Contains(msg, "join") || !strings.Contains(msg, "/v1/activities/7/signups/3") {
			t.Errorf("%s: %q does not say what the key was used for", tt.name, msg)
		}
	}

	// A confirm's key: its repeat is the same request, and it is bound to
	// the confirm, not to the join on the path below it.
	confirm := req{method: "POST", path: "/v1/activities/7/signups/3/confirm", header: key("confirm-1")}
	resp, body = h.do(confirm)
	confirmID := accepted(t, "confirm", resp, body)
	resp, body = h.do(confirm)
	if again := accepted(t, "confirm repeated", resp, body); again != confirmID {
		t.Fatalf("confirm repeated answered %s, want %s", again, confirmID)
	}
	resp, body = h.do(req{method: "POST", path: "/v1/activities/7/signups/3", header: key("confirm-1")})
	wantStatus(t, "a confirm's key on a join", resp, body, http.StatusUnprocessableEntity)
	if msg := errorSentence(t, "a confirm's key on a join", resp, body); !strings.Contains(msg, "/v1/activities/7/signups/3/confirm") {
		t.Errorf("a confirm's key on a join: %q does not name the confirm's path", msg)
	}

	resp, body = h.do(req{method: "POST", path: "/v1/activities/7/signups/3", header: key(strings.Repeat("k", 256))})
	wantStatus(t, "key of 256 bytes", resp, body, http.StatusBadRequest)
	errorSentence(t, "key of 256 bytes", resp, body)
	resp, body = h.do(req{method: "POST", path: "/v1/activities/7/signups/5", header: key(strings.Repeat("k", 255))})
	accepted(t, "key of 255 bytes", resp, body)

	// An open repeated with the same key keeps the first message, capacity
	// included: the key binds op and path, and the first body wins.
	open := req{method: "PUT", path: "/v1/activities/9", body: `{"capacity": 5}`, header: key("open-9")}
	resp, body = h.do(open)
	openID := accepted(t, "open", resp, body)
	open.body = `{"capacity": 6}`
	resp, body = h.do(open)
	if again := accepted(t, "open repeated", resp, body); again != openID {
		t.Fatalf("open repeated answered %s, want %s", again, openID)
	}
	if got := decode[wire.Request](t, "open message", h.lastMsg(wire.RequestSubject(9)).Data); *got.Capacity != 5 {
		t.Fatalf("open message capacity %d, want the first one, 5", *got.Capacity)
	}
	if n := natstest.StreamMsgs(t, h.js, wire.RequestStream); n != 4 {
		t.Fatalf("%s holds %d messages, want 4", wire.RequestStream, n)
	}
}

func TestIdempotentRepeatOfAnAppliedRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	claim := req{method: "POST", path: "/v1/activities/5/claims/6", header: map[string]string{"Idempotency-Key": "claim-5-6"}}
	resp, body := h.do(claim)
	id := accepted(t, "claim", resp, body)
	want := wire.Result{RequestID: id, State: wire.StateDone, Op: wire.OpClaim, ActivityID: 5, UserID: 6,
		Outcome: wire.OutcomeGranted, Status: ptr(wire.StatusConfirmed), Seq: 1,
		AppliedAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)}
	h.insertResult(want)

	resp, body = h.do(claim)
	if again := accepted(t, "repeat without wait", resp, body); again != id {
		t.Fatalf("repeat answered %s, want %s", again, id)
	}
	claim.path += "?wait=10s"
	start := time.Now()
	resp, body = h.do(claim)
	wantStatus(t, "repeat with wait", resp, body, http.StatusOK)
	if time.Since(start) > 5*time.Second {
		t.Errorf("repeat of an applied request waited %s", time.Since(start))
	}
	if got := decode[wire.Result](t, "repeat with wait", body); !sameResult(got, want) {
		t.Fatalf("repeat with wait answered %+v, want %+v", got, want)
	}
	if n := natstest.StreamMsgs(t, h.js, wire.RequestStream); n != 1 {
		t.Fatalf("%s holds %d messages, want 1", wire.RequestStream, n)
	}
}

// fakeNotifier applies every request on alloc.req.> at once, as the
// allocator does: it announces a result, and records it in
// processed_request only when store is set (without it, only the
// notification carries the result).
func fakeNotifier(t *testing.T, h *harness, outcome wire.Outcome, store bool) {
	t.Helper()
	sub, err := h.nc.Subscribe(wire.RequestSubjectPrefix+">", func(m *nats.Msg) {
		var r wire.Request
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("fake allocator: %v", err)
			return
		}
		res := wire.Result{RequestID: r.RequestID, State: wire.StateDone, Op: r.Op, ActivityID: r.ActivityID,
			UserID: r.UserID, Outcome: outcome, Status: ptr(wire.StatusConfirmed), Seq: seqs.Add(1),
			AppliedAt: time.Now().UTC()}
		if store {
			if _, err := h.db.ExecContext(context.Background(),
				"INSERT INTO processed_request (request_id, seq, op, activity_id, user_id, outcome, status, applied_at) VALUES (?,?,?,?,?,?,?,?)",
				res.RequestID, res.Seq, res.Op, res.ActivityID, res.UserID, res.Outcome, res.Status, res.AppliedAt); err != nil {
				t.Errorf("fake allocator: %v", err)
				return
			}
		}
		b, _ := json.Marshal(wire.ResultBatch{Results: []wire.Result{res}})
		h.nc.Publish(wire.ResultSubject, b) //nolint:errcheck
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() }) //nolint:errcheck
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestWriteWithWait(t *testing.T) {
	t.Parallel()
	// A long recheck interval: only the notification can answer in time.
	h := newHarness(t, func(c *Config, d *Deps) { d.Test.RecheckInterval = time.Hour })

	resp, body := h.do(req{method: "POST", path: "/v1/activities/3/signups/4?wait=300ms"})
	accepted(t, "no allocator: the wait ends", resp, body)

	// The result reaches ingest only by its notification: nothing is in
	// MySQL, so a done answer proves the notification woke the handler.
	fakeNotifier(t, h, wire.OutcomeConfirmed, false)
	resp, body = h.do(req{method: "POST", path: "/v1/activities/3/signups/5?wait=20s"})
	wantStatus(t, "join with wait", resp, body, http.StatusOK)
	res := decode[wire.Result](t, "join with wait", body)
	if res.State != wire.StateDone || res.Op != wire.OpJoin || res.ActivityID != 3 || res.UserID != 5 ||
		res.Outcome != wire.OutcomeConfirmed || res.Status == nil || *res.Status != wire.StatusConfirmed {
		t.Fatalf("join with wait answered %+v", res)
	}
	u, err := uuid.Parse(res.RequestID)
	if err != nil || !h.svc.callers.ids.Issued(u) {
		t.Fatalf("result request id %q is not issued (err %v)", res.RequestID, err)
	}
	eventually(t, 5*time.Second, "waiters return to 0", func() bool { return h.svc.results.Count() == 0 })
}

// sameResult compares results field by field, pointers by value.
func sameResult(a, b wire.Result) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { c.RateLimit = 0.001 })
	resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/1"})
	accepted(t, "within the burst", resp, body)
	resp, body = h.do(req{method: "POST", path: "/v1/activities/1/signups/2"})
	wantStatus(t, "beyond the rate", resp, body, http.StatusTooManyRequests)
	errorSentence(t, "beyond the rate", resp, body)
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After = %q, want seconds", resp.Header.Get("Retry-After"))
	}
	if n := natstest.StreamMsgs(t, h.js, wire.RequestStream); n != 1 {
		t.Fatalf("%s holds %d messages, want 1", wire.RequestStream, n)
	}
}
