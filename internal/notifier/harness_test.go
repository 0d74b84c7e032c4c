package notifier

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// env is one test's JetStream server, with the event stream in place and a
// connection for publishing and inspecting.
type env struct {
	t  *testing.T
	ns *natstest.Server
	nc *nats.Conn
	js jetstream.JetStream

	mu     sync.Mutex
	events map[string][]byte // event_id → the JSON published
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, ns: natstest.New(t), events: make(map[string][]byte)}
	e.nc, e.js = e.ns.Connect(t)
	if err := bus.EnsureStreams(context.Background(), e.js, config.Defaults[bus.Config]()); err != nil {
		t.Fatal(err)
	}
	return e
}

// testConfig is fast enough for tests; each test adjusts what it exercises.
func testConfig(url string) Config {
	cfg := config.Defaults[Config]()
	cfg.URL = SecretURL(url)
	cfg.Timeout = 2 * time.Second
	cfg.MaxAttempts = 20
	cfg.BackoffBase = time.Millisecond
	cfg.BackoffMax = 20 * time.Millisecond
	return cfg
}

// testHooks are the consumer's timings of the tests.
var testHooks = TestHooks{AckWait: 2 * time.Second, PollWait: 100 * time.Millisecond}

// defaultDurable is ALLOT_NOTIFY_DURABLE's default.
var defaultDurable = config.Defaults[Config]().Durable

// start runs a notifier on a connection of its own (so a test can kill it)
// until the test ends.
func (e *env) start(cfg Config, log *slog.Logger) (*Notifier, *nats.Conn) {
	return e.startHooks(cfg, testHooks, log)
}

// startHooks is start with the given test hooks.
func (e *env) startHooks(cfg Config, hooks TestHooks, log *slog.Logger) (*Notifier, *nats.Conn) {
	e.t.Helper()
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	nc, _ := e.ns.Connect(e.t)
	n, err := New(cfg, Deps{NC: nc, Log: log, Test: hooks})
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	if err := n.Start(context.Background()); err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	e.t.Cleanup(n.Stop)
	return n, nc
}

// publish stores count events of kind, spread over activities 1..3, with
// Nats-Msg-Id = event_id as the allocator's relay does, and returns their ids.
func (e *env) publish(kind wire.EventKind, count int) []string {
	e.t.Helper()
	ids := make([]string, 0, count)
	for i := range count {
		ev := wire.Event{
			EventID:    uuid.Must(uuid.NewV7()).String(),
			Kind:       kind,
			ActivityID: int64(i%3 + 1),
			UserID:     int64(1000 + i),
			RequestID:  uuid.Must(uuid.NewV7()).String(),
			// Requests of batches: four at each stream sequence.
			Seq:   uint64(i/4 + 1),
			Index: i % 4,
			At:    time.Now().UTC(),
		}
		b, err := json.Marshal(ev)
		if err != nil {
			e.t.Fatal(err)
		}
		e.publishRaw(wire.EventSubject(ev.ActivityID, kind), b, ev.EventID)
		e.mu.Lock()
		e.events[ev.EventID] = b
		e.mu.Unlock()
		ids = append(ids, ev.EventID)
	}
	return ids
}

// publishRaw stores data on subject, retrying while the broker restarts.
func (e *env) publishRaw(subject string, data []byte, msgID string) {
	e.t.Helper()
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := e.js.Publish(ctx, subject, data, opts...)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("publish on %s: %v", subject, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) eventJSON(id string) []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.events[id]
}

// waitDrained waits until the durable has nothing pending and nothing
// unacknowledged.
func (e *env) waitDrained(durable string) {
	e.t.Helper()
	waitFor(e.t, 20*time.Second, "consumer "+durable+" drained", func() bool {
		info, err := e.consumerInfo(durable)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

func (e *env) consumerInfo(durable string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := e.js.Consumer(ctx, wire.EventStream, durable)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// deadLetters reads every message on the dead-letter stream.
func (e *env) deadLetters() []*jetstream.RawStreamMsg {
	e.t.Helper()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, DLQStream)
	if err != nil {
		e.t.Fatalf("dead-letter stream: %v", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			e.t.Fatalf("dead letter %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, cond)
}

// answer is what the receiver does with one call.
type answer int

const (
	answerOK     answer = iota
	answer500           // 500 with a body
	answer400           // a permanent rejection
	answer429           // rate limited, Retry-After: 0
	answerHang          // never answers: the notifier's timeout fires
	answerDrop          // closes the connection without an answer
	answerSlowOK        // 200 after 20ms
)

// receiver is a webhook that records every call and answers as policy says
// for the call-th call (1-based) carrying key.
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	policy func(key string, call int) answer
	quit   chan struct{}

	mu       sync.Mutex
	calls    map[string]int    // Idempotency-Key → calls
	accepted map[string][]byte // Idempotency-Key → body of its first 2xx
	oks      int               // 2xx answers, duplicates included
	problems []string          // malformed calls
}

func newReceiver(t *testing.T, policy func(key string, call int) answer) *receiver {
	t.Helper()
	r := &receiver{t: t, policy: policy, quit: make(chan struct{}),
		calls: make(map[string]int), accepted: make(map[string][]byte)}
	r.srv = httptest.NewServer(r)
	t.Cleanup(r.srv.Close)
	// Runs before srv.Close (cleanups run last-in first-out): hanging
	// handlers return, so Close does not wait for them.
	t.Cleanup(func() { close(r.quit) })
	return r
}

func (r *receiver) URL() string { return r.srv.URL }

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	key := req.Header.Get("Idempotency-Key")
	// As a webhook receiver would: the public type and decoder.
	ev, decodeErr := client.DecodeEvent(body)
	r.mu.Lock()
	switch {
	case req.Method != http.MethodPost:
		r.problems = append(r.problems, "method "+req.Method)
	case req.Header.Get("Content-Type") != "application/json":
		r.problems = append(r.problems, "content type "+req.Header.Get("Content-Type"))
	case decodeErr != nil || ev.EventID != key:
		r.problems = append(r.problems, "key "+key+" with body "+string(body))
	}
	r.calls[key]++
	a := r.policy(key, r.calls[key])
	r.mu.Unlock()

	switch a {
	case answer500:
		http.Error(w, "receiver is having a bad day", http.StatusInternalServerError)
		return
	case answer400:
		http.Error(w, "receiver does not like this event", http.StatusBadRequest)
		return
	case answer429:
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	case answerHang:
		select {
		case <-req.Context().Done():
		case <-r.quit:
		}
		return
	case answerDrop:
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	case answerSlowOK:
		select {
		case <-time.After(20 * time.Millisecond):
		case <-r.quit:
		}
	}
	r.mu.Lock()
	r.oks++
	if _, ok := r.accepted[key]; !ok {
		r.accepted[key] = body
	}
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// acceptedIDs is the sorted set of keys answered 2xx at least once.
func (r *receiver) acceptedIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.accepted))
	for id := range r.accepted {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (r *receiver) acceptedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.accepted)
}

// check asserts that the receiver accepted exactly want (after dedupe by
// Idempotency-Key), each with the body that was published, and that every
// call was well formed.
func (r *receiver) check(e *env, want []string) {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.problems {
		r.t.Errorf("malformed webhook call: %s", p)
	}
	if len(r.accepted) != len(want) {
		r.t.Errorf("receiver accepted %d distinct events, want %d", len(r.accepted), len(want))
	}
	for _, id := range want {
		body, ok := r.accepted[id]
		if !ok {
			r.t.Errorf("event %s was never delivered", id)
			continue
		}
		if !bytes.Equal(body, e.eventJSON(id)) {
			r.t.Errorf("event %s: body %s, want the published JSON %s", id, body, e.eventJSON(id))
		}
	}
}

func sorted(ids []string) []string {
	out := append([]string(nil), ids...)
	sort.Strings(out)
	return out
}
