package notifier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/syncbuf"
	"github.com/allot-dev/allot/internal/wire"
)

// flaky fails each event in one of four ways before it succeeds, chosen by
// the event's key: at once; one 500; a timeout, then a 500; a dropped
// connection, then a 429.
func flaky(key string, call int) answer {
	h := fnv.New32a()
	h.Write([]byte(key))
	scripts := [][]answer{
		{},
		{answer500},
		{answerHang, answer500},
		{answerDrop, answer429},
	}
	script := scripts[h.Sum32()%uint32(len(scripts))]
	if call <= len(script) {
		return script[call-1]
	}
	return answerOK
}

func TestIntermittentReceiverGetsEveryPromotion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rcv := newReceiver(t, flaky)
	const n = 40
	promoted := e.publish(wire.EventPromoted, n)
	var others []string
	for _, kind := range []wire.EventKind{wire.EventConfirmed, wire.EventWaitlisted, wire.EventCancelled, wire.EventOpened} {
		others = append(others, e.publish(kind, 5)...)
	}

	cfg := testConfig(rcv.URL())
	cfg.Timeout = 200 * time.Millisecond
	nt, _ := e.start(cfg, nil)

	waitFor(t, 30*time.Second, "every promotion accepted", func() bool { return rcv.acceptedCount() >= n })
	e.waitDrained(defaultDurable)

	rcv.check(e, promoted)
	if got, want := rcv.acceptedIDs(), sorted(promoted); !slices.Equal(got, want) {
		t.Errorf("accepted ids differ from the promoted ids:\n got %v\nwant %v", got, want)
	}
	rcv.mu.Lock()
	for _, id := range others {
		if c := rcv.calls[id]; c > 0 {
			t.Errorf("event %s is not a promotion but was POSTed %d times", id, c)
		}
	}
	var retried int
	for _, id := range promoted {
		if want := len(scriptFor(id)) + 1; rcv.calls[id] < want {
			t.Errorf("event %s: %d calls, its script needs %d", id, rcv.calls[id], want)
		}
		if rcv.calls[id] > 1 {
			retried++
		}
	}
	rcv.mu.Unlock()
	if retried == 0 {
		t.Error("no event needed a retry: the receiver did not fail")
	}
	if got := natstest.StreamMsgs(t, e.js, DLQStream); got != 0 {
		t.Errorf("dead-letter stream holds %d messages, want 0", got)
	}
	if got := testutil.ToFloat64(nt.m.deliveries.WithLabelValues(resultDelivered)); got != n {
		t.Errorf("deliveries_total{result=delivered} = %v, want %d", got, n)
	}
	if got := testutil.ToFloat64(nt.m.attempts.WithLabelValues("timeout")); got == 0 {
		t.Error("attempts_total{outcome=timeout} = 0: no attempt timed out")
	}
}

func scriptFor(key string) []answer {
	var s []answer
	for call := 1; ; call++ {
		a := flaky(key, call)
		if a == answerOK {
			return s
		}
		s = append(s, a)
	}
}

func TestFailingReceiverFillsDeadLetterStream(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		answer       answer
		wantAttempts int
		wantReason   string
		wantErr      string
	}{
		{name: "500 always", answer: answer500, wantAttempts: 3, wantReason: ReasonExhausted, wantErr: "webhook answered 500: receiver is having a bad day"},
		{name: "timeout always", answer: answerHang, wantAttempts: 3, wantReason: ReasonExhausted, wantErr: "timed out"},
		{name: "429 always", answer: answer429, wantAttempts: 3, wantReason: ReasonExhausted, wantErr: "webhook answered 429"},
		{name: "400 is permanent", answer: answer400, wantAttempts: 1, wantReason: ReasonRejected, wantErr: "webhook answered 400"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			rcv := newReceiver(t, func(string, int) answer { return tt.answer })
			const n = 12
			ids := e.publish(wire.EventPromoted, n)
			cfg := testConfig(rcv.URL())
			cfg.MaxAttempts = 3
			cfg.Timeout = 100 * time.Millisecond
			cfg.BackoffMax = 2 * time.Millisecond
			nt, _ := e.start(cfg, nil)

			waitFor(t, 30*time.Second, "every event dead-lettered", func() bool {
				return natstest.StreamMsgs(t, e.js, DLQStream) >= n
			})
			e.waitDrained(defaultDurable)

			dls := e.deadLetters()
			if len(dls) != n {
				t.Fatalf("dead-letter stream holds %d messages, want %d", len(dls), n)
			}
			var got []string
			for _, m := range dls {
				id := m.Header.Get(HeaderEventID)
				got = append(got, id)
				if m.Subject != DLQSubject {
					t.Errorf("dead letter on %s, want %s", m.Subject, DLQSubject)
				}
				if msgID := m.Header.Get(jetstream.MsgIDHeader); msgID != id {
					t.Errorf("dead letter %s has Nats-Msg-Id %q", id, msgID)
				}
				if !bytes.Equal(m.Data, e.eventJSON(id)) {
					t.Errorf("dead letter %s: body %s, want the event JSON %s", id, m.Data, e.eventJSON(id))
				}
				if a := m.Header.Get(HeaderAttempts); a != strconv.Itoa(tt.wantAttempts) {
					t.Errorf("dead letter %s: attempts %q, want %d", id, a, tt.wantAttempts)
				}
				if r := m.Header.Get(HeaderReason); r != tt.wantReason {
					t.Errorf("dead letter %s: reason %q, want %q", id, r, tt.wantReason)
				}
				if msg := m.Header.Get(HeaderError); !strings.Contains(msg, tt.wantErr) {
					t.Errorf("dead letter %s: error %q, want it to mention %q", id, msg, tt.wantErr)
				}
				if s := m.Header.Get(HeaderSubject); !strings.HasPrefix(s, wire.EventSubjectPrefix) || !strings.HasSuffix(s, "."+string(wire.EventPromoted)) {
					t.Errorf("dead letter %s: original subject %q", id, s)
				}
			}
			slices.Sort(got)
			if want := sorted(ids); !slices.Equal(got, want) {
				t.Errorf("dead-lettered ids:\n got %v\nwant %v", got, want)
			}
			rcv.mu.Lock()
			for _, id := range ids {
				if rcv.calls[id] != tt.wantAttempts {
					t.Errorf("event %s: %d webhook calls, want %d", id, rcv.calls[id], tt.wantAttempts)
				}
			}
			rcv.mu.Unlock()
			if got := testutil.ToFloat64(nt.m.deliveries.WithLabelValues(resultDeadLettered)); got != n {
				t.Errorf("deliveries_total{result=dead_lettered} = %v, want %d", got, n)
			}
		})
	}
}

func TestMalformedEventIsDeadLetteredAndDoesNotBlock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rcv := newReceiver(t, func(string, int) answer { return answerOK })
	subject := wire.EventSubject(7, wire.EventPromoted)
	e.publishRaw(subject, []byte("not json at all"), "")
	e.publishRaw(subject, []byte(`{"kind":"promoted","activity_id":7}`), "")
	ids := e.publish(wire.EventPromoted, 3)
	cfg := testConfig(rcv.URL())
	cfg.Workers = 1 // the malformed ones are first in line
	e.start(cfg, nil)

	waitFor(t, 20*time.Second, "the good events delivered", func() bool { return rcv.acceptedCount() >= len(ids) })
	e.waitDrained(defaultDurable)
	rcv.check(e, ids)

	dls := e.deadLetters()
	if len(dls) != 2 {
		t.Fatalf("dead-letter stream holds %d messages, want the 2 malformed ones", len(dls))
	}
	for i, want := range []string{"not json at all", `{"kind":"promoted","activity_id":7}`} {
		m := dls[i]
		if string(m.Data) != want {
			t.Errorf("dead letter %d: body %q, want %q", i, m.Data, want)
		}
		if r := m.Header.Get(HeaderReason); r != ReasonMalformed {
			t.Errorf("dead letter %d: reason %q, want %q", i, r, ReasonMalformed)
		}
		if a := m.Header.Get(HeaderAttempts); a != "0" {
			t.Errorf("dead letter %d: attempts %q, want 0", i, a)
		}
		if msg := m.Header.Get(HeaderError); !strings.Contains(msg, "malformed event") {
			t.Errorf("dead letter %d: error %q", i, msg)
		}
		if id := m.Header.Get(jetstream.MsgIDHeader); !strings.HasPrefix(id, wire.EventStream+":") {
			t.Errorf("dead letter %d: Nats-Msg-Id %q, want %s:<seq>", i, id, wire.EventStream)
		}
	}
}

// TestRestartMidStream stops the first notifier while events are in flight
// and starts another with the same durable name. Gracefully stopped, the
// first one finishes and acks what it sent, so nothing is sent twice; killed
// (its connection closed under it), what it sent but could not ack is sent
// again, and the receiver's dedupe by Idempotency-Key absorbs it.
func TestRestartMidStream(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"stop", "kill"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			rcv := newReceiver(t, func(string, int) answer { return answerSlowOK })
			const n = 60
			ids := e.publish(wire.EventPromoted, n)
			cfg := testConfig(rcv.URL())
			hooks := testHooks
			hooks.AckWait = time.Second // how soon the kill's unacked events come back

			first, firstConn := e.startHooks(cfg, hooks, nil)
			waitFor(t, 20*time.Second, "a third delivered", func() bool { return rcv.acceptedCount() >= n/3 })
			switch mode {
			case "stop":
				first.Stop()
			case "kill":
				firstConn.Close()
				if err := first.Wait(); !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, jetstream.ErrConnectionClosed) {
					t.Errorf("Wait after the connection closed = %v, want connection closed", err)
				}
			}
			if got := rcv.acceptedCount(); got == n {
				t.Fatalf("all %d delivered before the restart: the test proves nothing", n)
			}

			e.startHooks(cfg, hooks, nil)
			waitFor(t, 30*time.Second, "every event delivered", func() bool { return rcv.acceptedCount() >= n })
			e.waitDrained(defaultDurable)
			rcv.check(e, ids)
			rcv.mu.Lock()
			oks := rcv.oks
			rcv.mu.Unlock()
			if mode == "stop" && oks != n {
				t.Errorf("graceful restart: %d 2xx answers for %d events, want no re-sends", oks, n)
			}
			t.Logf("%s: %d 2xx answers for %d events", mode, oks, n)
		})
	}
}

func TestSurvivesBrokerRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rcv := newReceiver(t, func(string, int) answer { return answerOK })
	ids := e.publish(wire.EventPromoted, 10)
	e.start(testConfig(rcv.URL()), nil)
	waitFor(t, 20*time.Second, "first events delivered", func() bool { return rcv.acceptedCount() >= 10 })

	e.ns.Stop()
	e.ns.Start()
	ids = append(ids, e.publish(wire.EventPromoted, 10)...)
	waitFor(t, 30*time.Second, "events after the restart delivered", func() bool { return rcv.acceptedCount() >= 20 })
	e.waitDrained(defaultDurable)
	rcv.check(e, ids)
}

func TestWithoutURLEventsAreLoggedAndAcked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := e.publish(wire.EventPromoted, 15)
	e.publish(wire.EventConfirmed, 5)
	var buf syncbuf.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	nt, _ := e.start(testConfig(""), log)
	e.waitDrained(defaultDurable)

	var logged []string
	for line := range strings.SplitSeq(buf.String(), "\n") {
		if line == "" {
			continue
		}
		var rec struct {
			Msg        string `json:"msg"`
			EventID    string `json:"event_id"`
			ActivityID int64  `json:"activity_id"`
			Kind       string `json:"kind"`
			Seq        uint64 `json:"seq"`
			Index      int    `json:"index"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %s", line)
		}
		if rec.Msg != "event" {
			continue
		}
		if rec.Kind != string(wire.EventPromoted) || rec.ActivityID == 0 {
			t.Errorf("logged event without its attributes: %s", line)
		}
		// The place of the request that caused it, index included.
		var ev wire.Event
		e.mu.Lock()
		err := json.Unmarshal(e.events[rec.EventID], &ev)
		e.mu.Unlock()
		if err != nil || rec.Seq != ev.Seq || rec.Index != ev.Index {
			t.Errorf("logged event at %d#%d, published at %d#%d (%v): %s", rec.Seq, rec.Index, ev.Seq, ev.Index, err, line)
		}
		logged = append(logged, rec.EventID)
	}
	slices.Sort(logged)
	if want := sorted(ids); !slices.Equal(logged, want) {
		t.Errorf("logged events:\n got %v\nwant %v", logged, want)
	}
	if got := testutil.ToFloat64(nt.m.deliveries.WithLabelValues(resultLogged)); got != 15 {
		t.Errorf("deliveries_total{result=logged} = %v, want 15", got)
	}
}

// TestStopDuringRetryReturnsPromptly: an event waiting for its next attempt
// does not hold Stop up; it is handed back and the next notifier delivers it.
func TestStopDuringRetryReturnsPromptly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var healthy atomic.Bool
	rcv := newReceiver(t, func(string, int) answer {
		if healthy.Load() {
			return answerOK
		}
		return answer500
	})
	ids := e.publish(wire.EventPromoted, 1)
	cfg := testConfig(rcv.URL())
	cfg.MaxAttempts = 1000
	cfg.BackoffBase = time.Minute // the first retry waits up to a minute
	cfg.BackoffMax = time.Minute
	first, _ := e.start(cfg, nil)
	waitFor(t, 10*time.Second, "the first attempt", func() bool {
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		return rcv.calls[ids[0]] >= 1
	})
	start := time.Now()
	first.Stop()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Stop took %s while an event waited for a retry", d)
	}
	healthy.Store(true)
	e.start(cfg, nil)
	waitFor(t, 20*time.Second, "the event delivered by the second notifier", func() bool { return rcv.acceptedCount() == 1 })
	e.waitDrained(defaultDurable)
	rcv.check(e, ids)
}

func TestCustomFilterAndDurable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rcv := newReceiver(t, func(string, int) answer { return answerOK })
	e.publish(wire.EventPromoted, 3)
	cancelled := e.publish(wire.EventCancelled, 4)
	cfg := testConfig(rcv.URL())
	cfg.Filter = wire.EventSubjectPrefix + "*." + string(wire.EventCancelled)
	cfg.Durable = "cancellations"
	e.start(cfg, nil)
	waitFor(t, 20*time.Second, "cancellations delivered", func() bool { return rcv.acceptedCount() >= 4 })
	e.waitDrained("cancellations")
	rcv.check(e, cancelled)
}

func TestStartTwiceFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	n, _ := e.start(testConfig(""), nil)
	if err := n.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Errorf("second Start = %v, want ErrStarted", err)
	}
}

// TestConfigValidate: the defaults pass; values the notifier cannot run
// with are refused by the variable's name. (cmd/notifier's TestValidate
// covers every check.)
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := config.Defaults[Config]().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	tests := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{name: "relative url", change: func(c *Config) { c.URL = "/hook" }, want: "ALLOT_NOTIFY_URL"},
		{name: "ftp url", change: func(c *Config) { c.URL = "ftp://example.com/hook" }, want: "ALLOT_NOTIFY_URL"},
		{name: "backoff max below base", change: func(c *Config) { c.BackoffBase, c.BackoffMax = time.Second, time.Millisecond }, want: "ALLOT_NOTIFY_BACKOFF_MAX"},
		{name: "no workers", change: func(c *Config) { c.Workers = 0 }, want: "ALLOT_NOTIFY_WORKERS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Defaults[Config]()
			tt.change(&cfg)
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

// TestHoldEvents: a filter on promotions and expiries (two subjects)
// selects exactly those; held_until reaches the webhook as the allocator
// encoded it, and a lone expired filter works the same way.
func TestHoldEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	until := time.Date(2026, 12, 1, 4, 0, 2, 500_000_000, time.UTC)
	publish := func(kind wire.EventKind, user int64, held bool) string {
		ev := wire.Event{EventID: uuid.Must(uuid.NewV7()).String(), Kind: kind, ActivityID: 7, UserID: user,
			RequestID: uuid.Must(uuid.NewV7()).String(), Seq: uint64(user), At: until.Add(-2 * time.Second)}
		if held {
			ev.HeldUntil = &until
		}
		b := ev.AppendJSON(nil) // the allocator's own encoding
		e.publishRaw(wire.EventSubject(ev.ActivityID, kind), b, ev.EventID)
		e.mu.Lock()
		e.events[ev.EventID] = b
		e.mu.Unlock()
		return ev.EventID
	}
	publish(wire.EventHeld, 1, true)
	promoted := publish(wire.EventPromoted, 2, true)
	expired := publish(wire.EventExpired, 1, false)
	publish(wire.EventConfirmed, 2, false)
	publish(wire.EventCancelled, 3, false)

	both := newReceiver(t, func(string, int) answer { return answerOK })
	cfg := testConfig(both.URL())
	cfg.Filter = wire.EventSubjectPrefix + "*." + string(wire.EventPromoted) + "," + wire.EventSubjectPrefix + "*." + string(wire.EventExpired)
	cfg.Durable = "holds"
	e.start(cfg, nil)

	lone := newReceiver(t, func(string, int) answer { return answerOK })
	cfg = testConfig(lone.URL())
	cfg.Filter = wire.EventSubjectPrefix + "*." + string(wire.EventExpired)
	cfg.Durable = "expiries"
	e.start(cfg, nil)

	waitFor(t, 20*time.Second, "promotions and expiries delivered", func() bool { return both.acceptedCount() >= 2 })
	waitFor(t, 20*time.Second, "expiries delivered", func() bool { return lone.acceptedCount() >= 1 })
	e.waitDrained("holds")
	e.waitDrained("expiries")
	both.check(e, []string{promoted, expired})
	lone.check(e, []string{expired})
	// What the webhook received, not what the test published.
	both.mu.Lock()
	body := both.accepted[promoted]
	both.mu.Unlock()
	if !bytes.Contains(body, []byte(`"held_until":"2026-12-01T04:00:02.5Z"`)) {
		t.Errorf("the promoted event reached the webhook without its held_until: %s", body)
	}
	if ev, err := client.DecodeEvent(body); err != nil || ev.HeldUntil == nil || !ev.HeldUntil.Equal(until) {
		t.Errorf("the webhook's promoted event decodes to %+v, %v; want held_until %v", ev, err, until)
	}
	if info, err := e.consumerInfo("holds"); err != nil || len(info.Config.FilterSubjects) != 2 {
		t.Errorf("consumer holds: %+v, %v; want two filter subjects", info, err)
	}
}
