package ingest

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/allot-dev/allot/internal/wire"
)

func TestPoll(t *testing.T) {
	t.Parallel()
	// A long recheck interval: a wait can only end early by a notification.
	h := newHarness(t, func(c *Config, d *Deps) { d.Test.RecheckInterval = time.Hour })

	notFound := []struct{ name, id string }{
		{name: "random v4", id: uuid.NewString()},
		{name: "v7 never issued", id: uuid.Must(uuid.NewV7()).String()},
	}
	for _, tt := range notFound {
		resp, body := h.do(req{method: "GET", path: "/v1/requests/" + tt.id})
		wantStatus(t, tt.name, resp, body, http.StatusNotFound)
		errorSentence(t, tt.name, resp, body)
		resp, body = h.do(req{method: "GET", path: "/v1/requests/" + tt.id + "?wait=1s"})
		wantStatus(t, tt.name+" with wait", resp, body, http.StatusNotFound)
	}
	resp, body := h.do(req{method: "GET", path: "/v1/requests/123"})
	wantStatus(t, "malformed", resp, body, http.StatusBadRequest)
	errorSentence(t, "malformed", resp, body)

	resp, body = h.do(req{method: "POST", path: "/v1/activities/9001/claims/42"})
	id := accepted(t, "claim", resp, body)
	for _, path := range []string{"/v1/requests/" + id, "/v1/requests/" + strings.ToUpper(id)} {
		resp, body = h.do(req{method: "GET", path: path})
		wantStatus(t, "poll issued id", resp, body, http.StatusOK)
		if got := decode[wire.Ack](t, "poll issued id", body); got != (wire.Ack{RequestID: id, State: wire.StatePending}) {
			t.Fatalf("poll %s answered %+v, want pending", path, got)
		}
	}

	// A poll that waits, woken by the result notification.
	type answer struct {
		status int
		body   []byte
	}
	done := make(chan answer, 1)
	go func() {
		r, err := http.Get(h.srv.URL + "/v1/requests/" + id + "?wait=5s")
		if err != nil {
			t.Errorf("poll with wait: %v", err)
			done <- answer{}
			return
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		done <- answer{status: r.StatusCode, body: b}
	}()
	eventually(t, 5*time.Second, "the poll registers its waiter", func() bool { return h.svc.results.Count() == 1 })

	want := wire.Result{RequestID: id, State: wire.StateDone, Op: wire.OpClaim, ActivityID: 9001, UserID: 42,
		Outcome: wire.OutcomeGranted, Status: ptr(wire.StatusConfirmed), Seq: 1234,
		AppliedAt: time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)}
	// Only the notification carries the result: MySQL gets it after the
	// answer, so a done answer proves the poll was woken by the
	// notification, whatever the clock says.
	h.publishResults(want)

	a := <-done
	if a.status != http.StatusOK {
		t.Fatalf("poll with wait: status %d, body %s", a.status, a.body)
	}
	got := decode[wire.Result](t, "poll with wait", a.body)
	if !sameResult(got, want) {
		t.Fatalf("poll with wait answered %s, want %+v: it was not woken by the notification", a.body, want)
	}
	h.insertResult(want)
	for _, f := range []string{`"position":null`, `"promoted_user_id":null`, `"applied_at":"2026-03-01T12:00:00.123456Z"`, `"seq":1234`} {
		if !strings.Contains(string(a.body), f) {
			t.Errorf("poll body %s lacks %s", a.body, f)
		}
	}
	eventually(t, 5*time.Second, "waiters return to 0", func() bool { return h.svc.results.Count() == 0 })

	// Done now: read from MySQL, with or without wait.
	for _, q := range []string{"", "?wait=2s"} {
		resp, body = h.do(req{method: "GET", path: "/v1/requests/" + id + q})
		wantStatus(t, "poll done"+q, resp, body, http.StatusOK)
		if got := decode[wire.Result](t, "poll done", body); !sameResult(got, want) {
			t.Fatalf("poll done%s answered %s, want %+v", q, body, want)
		}
	}

	// A result recorded by another tool under an id ingest never issued is
	// still readable: MySQL is read before the checksum is checked.
	foreign := want
	foreign.RequestID = uuid.NewString()
	foreign.Seq = 1235
	h.insertResult(foreign)
	resp, body = h.do(req{method: "GET", path: "/v1/requests/" + foreign.RequestID})
	wantStatus(t, "foreign result", resp, body, http.StatusOK)

	if h.svc.results.Count() != 0 {
		t.Fatalf("%d waiters left registered", h.svc.results.Count())
	}
	_, body = h.do(req{method: "GET", path: "/metrics"})
	if !strings.Contains(string(body), "\nallot_ingest_waiters 0\n") {
		t.Errorf("/metrics does not show allot_ingest_waiters 0")
	}
}

func TestPollRereadsMySQLAtTheDeadline(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { d.Test.RecheckInterval = time.Hour })
	resp, body := h.do(req{method: "DELETE", path: "/v1/activities/3/signups/8"})
	id := accepted(t, "cancel", resp, body)

	// The notification is lost: the result is only in MySQL.
	want := wire.Result{RequestID: id, State: wire.StateDone, Op: wire.OpCancel, ActivityID: 3, UserID: 8,
		Outcome: wire.OutcomeCancelled, Status: ptr(wire.StatusCancelled), PromotedUserID: ptr[int64](9), Seq: 77,
		AppliedAt: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	done := make(chan []byte, 1)
	go func() {
		r, err := http.Get(h.srv.URL + "/v1/requests/" + id + "?wait=1500ms")
		if err != nil {
			t.Errorf("poll: %v", err)
			done <- nil
			return
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		if r.StatusCode != http.StatusOK {
			t.Errorf("poll: status %d", r.StatusCode)
		}
		done <- b
	}()
	eventually(t, 5*time.Second, "the poll registers its waiter", func() bool { return h.svc.results.Count() == 1 })
	h.insertResult(want)
	got := decode[wire.Result](t, "poll", <-done)
	if !sameResult(got, want) {
		t.Fatalf("poll answered %+v, want %+v", got, want)
	}
	eventually(t, 5*time.Second, "waiters return to 0", func() bool { return h.svc.results.Count() == 0 })
}

func TestPollWaitEndsPending(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { d.Test.RecheckInterval = 100 * time.Millisecond })
	resp, body := h.do(req{method: "POST", path: "/v1/activities/3/signups/8"})
	id := accepted(t, "join", resp, body)
	start := time.Now()
	resp, body = h.do(req{method: "GET", path: "/v1/requests/" + id + "?wait=500ms"})
	wantStatus(t, "poll with wait", resp, body, http.StatusOK)
	if got := decode[wire.Ack](t, "poll", body); got.State != wire.StatePending || got.RequestID != id {
		t.Fatalf("poll answered %+v, want pending", got)
	}
	if el := time.Since(start); el < 500*time.Millisecond {
		t.Fatalf("poll with wait=500ms answered after %s", el)
	}
	if h.svc.results.Count() != 0 {
		t.Fatalf("%d waiters left registered", h.svc.results.Count())
	}
}
