package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/stacktest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// TestAgainstTheStack drives a real ingest and allocator through the
// client: every call, the waitlist's promotion, idempotent resubmission,
// state reads and the events the allocator published.
func TestAgainstTheStack(t *testing.T) {
	st := stacktest.Start(t, config.Defaults[allocator.Config](), stacktest.IngestConfig(), ingest.Deps{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(st.URL, client.WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	must := func(r *client.Result, err error) *client.Result {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if !r.Done() {
			t.Fatalf("result %+v is not final", r)
		}
		return r
	}

	if r := must(c.Open(ctx, 9001, 1)); r.Outcome != client.Opened || *r.Capacity != 1 {
		t.Errorf("open: %+v", r)
	}
	if r := must(c.Join(ctx, 9001, 1)); r.Outcome != client.Confirmed {
		t.Errorf("join 1: %s", r.Outcome)
	}
	if r := must(c.Join(ctx, 9001, 2)); r.Outcome != client.Waiting || *r.Position != 1 {
		t.Errorf("join 2: %+v", r)
	}
	if s, err := c.Signup(ctx, 9001, 2); err != nil || s.Status != client.StatusWaiting || *s.Position != 1 {
		t.Errorf("signup 2: %+v, %v", s, err)
	}
	if r := must(c.Cancel(ctx, 9001, 1)); r.Outcome != client.Cancelled || r.PromotedUserID == nil || *r.PromotedUserID != 2 {
		t.Errorf("cancel 1: %+v", r)
	}
	if r := must(c.Claim(ctx, 9001, 3)); r.Outcome != client.SoldOut {
		t.Errorf("claim 3: %s", r.Outcome)
	}
	if a, err := c.Activity(ctx, 9001); err != nil || *a != (client.ActivityState{ActivityID: 9001, Capacity: 1, Confirmed: 1, Waiting: 0, Remaining: 0}) {
		t.Errorf("activity: %+v, %v", a, err)
	}
	if _, err := c.Activity(ctx, 424242); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("unknown activity: %v, want ErrNotFound", err)
	}

	// An activity with a hold: the seat is HELD until its end, then
	// confirmed.
	if r := must(c.OpenWithHold(ctx, 9002, 2, time.Hour)); r.Outcome != client.Opened {
		t.Errorf("open with a hold: %+v", r)
	}
	held := must(c.Join(ctx, 9002, 1))
	if held.Outcome != client.Held || *held.Status != client.StatusHeld || held.HeldUntil == nil ||
		held.HeldUntil.Before(time.Now().Add(59*time.Minute)) {
		t.Errorf("join under a hold: %+v", held)
	}
	if s, err := c.Signup(ctx, 9002, 1); err != nil || s.Status != client.StatusHeld || s.HeldUntil == nil || !s.HeldUntil.Equal(*held.HeldUntil) {
		t.Errorf("held signup: %+v, %v", s, err)
	}
	if a, err := c.Activity(ctx, 9002); err != nil || *a != (client.ActivityState{ActivityID: 9002, Capacity: 2, Confirmed: 1, Held: 1, Remaining: 1, Hold: "1h0m0s"}) {
		t.Errorf("activity with a held seat: %+v, %v", a, err)
	}
	if r := must(c.Confirm(ctx, 9002, 1)); r.Outcome != client.Confirmed || *r.Status != client.StatusConfirmed || r.HeldUntil != nil {
		t.Errorf("confirm: %+v", r)
	}
	if r := must(c.Confirm(ctx, 9002, 2)); r.Outcome != client.NotHeld {
		t.Errorf("confirm without a seat: %+v", r)
	}

	// One logical attempt submitted twice (a retry after a lost answer):
	// one request id, applied once.
	w := client.Write{Op: client.OpJoin, Activity: 9001, User: 4, Key: client.NewKey()}
	_, first, err := c.Submit(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Do(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	if again.RequestID != first.RequestID || again.Outcome != client.Waiting {
		t.Errorf("resubmission: %s %s, want request %s WAITING", again.RequestID, again.Outcome, first.RequestID)
	}

	// Events decode into the public type.
	stream, err := st.JS.Stream(ctx, wire.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[client.EventKind]int{}
	// Events are relayed after the commit: wait for the last one.
	testenv.WaitFor(t, 10*time.Second, "two waitlisted events relayed", func() bool {
		clear(kinds)
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := stream.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := client.DecodeEvent(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(m.Subject, "."+string(ev.Kind)) || ev.At.IsZero() || ev.RequestID == "" {
				t.Errorf("event %+v on %s", ev, m.Subject)
			}
			if (ev.Kind == client.EventHeld) != (ev.HeldUntil != nil) {
				t.Errorf("event %+v: held_until only and always on a held event here", ev)
			}
			kinds[ev.Kind]++
		}
		return kinds[client.EventWaitlisted] >= 2 && kinds[client.EventHeld] >= 1 && kinds[client.EventConfirmed] >= 2
	})
	for _, k := range []client.EventKind{client.EventOpened, client.EventConfirmed, client.EventWaitlisted,
		client.EventCancelled, client.EventPromoted, client.EventSoldOut, client.EventHeld} {
		if kinds[k] == 0 {
			t.Errorf("no %s event decoded; saw %v", k, kinds)
		}
	}
}

// jsonFields maps the JSON names of t's fields to their Go kinds (pointer
// and slice kinds kept apart, typed strings as string).
func jsonFields(t reflect.Type) map[string]string {
	out := map[string]string{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		k := f.Type.Kind().String()
		if f.Type.Kind() == reflect.Pointer || f.Type.Kind() == reflect.Slice {
			k += " " + f.Type.Elem().Kind().String()
		}
		if f.Type.Kind() == reflect.Struct {
			k = f.Type.String()
		}
		out[name] = k
	}
	return out
}

// TestTypesMatchTheServers: the public types carry every field the server
// encodes, with the same JSON name and kind, so a field added on the
// server side fails here until the client has it too, and no field the
// server never sends.
func TestTypesMatchTheServers(t *testing.T) {
	pairs := []struct {
		name           string
		public, server any
	}{
		{"Result", client.Result{}, wire.Result{}},
		{"Event", client.Event{}, wire.Event{}},
		{"Ack", client.Ack{}, wire.Ack{}},
		{"ActivityState", client.ActivityState{}, store.ActivityState{}},
		{"SignupState", client.SignupState{}, store.SignupState{}},
	}
	for _, p := range pairs {
		pub, srv := jsonFields(reflect.TypeOf(p.public)), jsonFields(reflect.TypeOf(p.server))
		for name, kind := range srv {
			if pub[name] != kind {
				t.Errorf("%s.%s: the server sends a %s, the client has %q", p.name, name, kind, pub[name])
			}
		}
		for name := range pub {
			if _, ok := srv[name]; !ok {
				t.Errorf("%s.%s: the client has it, the server never sends it", p.name, name)
			}
		}
	}
}

// TestWordsMatchTheServers: the untyped request states spell the server's
// (the typed words are compared in TestEveryServerWordIsTyped), and a
// result the server encodes decodes into the client's type intact.
func TestWordsMatchTheServers(t *testing.T) {
	if client.StatePending != wire.StatePending || client.StateDone != wire.StateDone {
		t.Errorf("the client's states are %q and %q, the server's %q and %q",
			client.StatePending, client.StateDone, wire.StatePending, wire.StateDone)
	}
	// A result the server encodes decodes into the client's type intact.
	pos, st := int64(3), wire.StatusWaiting
	in := wire.Result{RequestID: "r", State: wire.StateDone, Op: wire.OpJoin, ActivityID: 1, UserID: 2,
		Outcome: wire.OutcomeWaiting, Status: &st, Position: &pos, PromotedUserIDs: []int64{5, 6}, Seq: 7, Index: 3,
		AppliedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Shed: true}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out client.Result
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	back, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	var a, b map[string]any
	if err := json.Unmarshal(data, &a); err != nil {
		t.Fatalf("the server's result %s: %v", data, err)
	}
	if err := json.Unmarshal(back, &b); err != nil {
		t.Fatalf("the client's result %s: %v", back, err)
	}
	if !reflect.DeepEqual(a, b) {
		keys := func(m map[string]any) []string {
			var k []string
			for x := range m {
				k = append(k, x)
			}
			sort.Strings(k)
			return k
		}
		t.Errorf("round trip changed the result:\n server %s\n client %s\n keys %v vs %v", data, back, keys(a), keys(b))
	}
}
