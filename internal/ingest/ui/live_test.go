package ui

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// fixture is one test's feed over a real MariaDB database and a real
// JetStream server, served at url+"/live/{activity}".
type fixture struct {
	t    *testing.T
	db   *dbtest.DB
	js   jetstream.JetStream
	srv  *Server
	url  string
	done chan struct{}
	once sync.Once
}

// fastConfig makes snapshots frequent so that tests wait little.
func fastConfig() Config {
	return Config{SnapshotEvery: 50 * time.Millisecond, IdleEvery: 200 * time.Millisecond}
}

func newFixture(t *testing.T, cfg Config) *fixture {
	return newFixtureServer(t, cfg, nil)
}

// newFixtureServer serves the feed with hs, or with a plain httptest server
// when hs is nil.
func newFixtureServer(t *testing.T, cfg Config, hs *http.Server) *fixture {
	t.Helper()
	f := &fixture{t: t, db: dbtest.New(t), done: make(chan struct{})}
	ns := natstest.New(t)
	_, f.js = ns.Connect(t)
	if err := bus.EnsureStreams(context.Background(), f.js, config.Defaults[bus.Config]()); err != nil {
		t.Fatal(err)
	}
	cfg.DB, cfg.JS, cfg.Done = f.db.DB, f.js, f.done
	cfg.Log = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	mux := http.NewServeMux()
	mux.HandleFunc("/live/{activity}", func(w http.ResponseWriter, r *http.Request) {
		a, err := strconv.ParseInt(r.PathValue("activity"), 10, 64)
		if err != nil {
			http.Error(w, "bad id", http.StatusBadRequest)
			return
		}
		srv.ServeLive(w, r, a)
	})
	if hs == nil {
		ts := httptest.NewServer(mux)
		t.Cleanup(ts.Close)
		f.url = ts.URL
	} else {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		hs.Handler = mux
		go hs.Serve(ln) //nolint:errcheck // ends with Close
		t.Cleanup(func() { hs.Close() })
		f.url = "http://" + ln.Addr().String()
	}
	// Registered after the server: runs before it closes, as ingest's
	// shutdown does, so that no stream holds the close.
	t.Cleanup(f.shutdown)
	return f
}

func (f *fixture) shutdown() { f.once.Do(func() { close(f.done) }) }

func (f *fixture) exec(query string, args ...any) {
	f.t.Helper()
	if _, err := f.db.ExecContext(context.Background(), query, args...); err != nil {
		f.t.Fatalf("%s: %v", query, err)
	}
}

func (f *fixture) openActivity(id, capacity, confirmed int64, nextSeq uint64) { // nextSeq: a place (wire.Place)
	f.t.Helper()
	f.exec("INSERT INTO activity (id, capacity, confirmed_count, next_seq) VALUES (?, ?, ?, ?)", id, capacity, confirmed, nextSeq)
}

func (f *fixture) addWaiter(activity, user int64) {
	f.t.Helper()
	f.exec("INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (?, ?, 'WAITING', ?)", activity, user, user)
	f.exec("UPDATE activity SET waiting_count = waiting_count + 1 WHERE id = ?", activity) // as the allocator keeps it
}

// publishEvent stores an event in ALLOT_EVENTS as the allocator's relay
// does and returns its JSON.
func (f *fixture) publishEvent(activity int64, kind wire.EventKind, user int64, seq uint64) string {
	f.t.Helper()
	ev := wire.Event{
		EventID: wire.EventID(fmt.Sprintf("req-%d-%d", activity, seq), 0), Kind: kind,
		ActivityID: activity, UserID: user, RequestID: fmt.Sprintf("req-%d-%d", activity, seq),
		Seq: seq, At: time.Now().UTC(),
	}
	data, err := json.Marshal(ev)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.js.Publish(context.Background(), wire.EventSubject(activity, kind), data); err != nil {
		f.t.Fatal(err)
	}
	return string(data)
}

// publishRequest stores a request in ALLOT_REQUESTS and returns its
// stream sequence.
func (f *fixture) publishRequest(activity int64) uint64 {
	f.t.Helper()
	ack, err := f.js.Publish(context.Background(), wire.RequestSubject(activity), []byte(`{}`))
	if err != nil {
		f.t.Fatal(err)
	}
	return ack.Sequence
}

func (f *fixture) eventConsumers() int {
	f.t.Helper()
	st, err := f.js.Stream(context.Background(), wire.EventStream)
	if err != nil {
		f.t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return info.State.Consumers
}

// msg is one server-sent message.
type msg struct{ name, data string }

// client reads one live stream.
type client struct {
	t      *testing.T
	resp   *http.Response
	msgs   chan msg // closed at the end of the stream
	retry  string
	cancel context.CancelFunc
}

// dial connects to activity's feed and returns once the headers are in.
func (f *fixture) dial(activity int64) *client {
	f.t.Helper()
	c, status := f.tryDial(activity)
	if status != http.StatusOK {
		f.t.Fatalf("GET live %d: status %d, want 200", activity, status)
	}
	return c
}

func (f *fixture) tryDial(activity int64) (*client, int) {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/live/"+strconv.FormatInt(activity, 10), nil)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		f.t.Fatal(err)
	}
	c := &client{t: f.t, resp: resp, msgs: make(chan msg, 4096), cancel: cancel}
	f.t.Cleanup(c.close)
	if resp.StatusCode != http.StatusOK {
		return c, resp.StatusCode
	}
	retry := make(chan string, 1)
	go c.read(retry)
	select {
	case c.retry = <-retry:
	case <-time.After(10 * time.Second):
		f.t.Fatal("no retry: line at the start of the stream")
	}
	return c, resp.StatusCode
}

func (c *client) read(retry chan<- string) {
	defer close(c.msgs)
	sc := bufio.NewScanner(c.resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var m msg
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if m.name != "" || m.data != "" {
				c.msgs <- m
			}
			m = msg{}
		case strings.HasPrefix(line, "retry: "):
			retry <- strings.TrimPrefix(line, "retry: ")
		case strings.HasPrefix(line, "event: "):
			m.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if m.data != "" {
				m.data += "\n"
			}
			m.data += strings.TrimPrefix(line, "data: ")
		}
	}
}

func (c *client) close() {
	c.cancel()
	c.resp.Body.Close()
}

// next returns the next message, failing after timeout or at the end of
// the stream.
func (c *client) next(timeout time.Duration) msg {
	c.t.Helper()
	select {
	case m, ok := <-c.msgs:
		if !ok {
			c.t.Fatal("the stream ended")
		}
		return m
	case <-time.After(timeout):
		c.t.Fatalf("no message within %s", timeout)
	}
	return msg{}
}

// state returns the next state message, skipping other messages.
func (c *client) state(timeout time.Duration) State {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m := c.next(time.Until(deadline))
		if m.name == MsgState {
			var st State
			if err := json.Unmarshal([]byte(m.data), &st); err != nil {
				c.t.Fatalf("state %q: %v", m.data, err)
			}
			return st
		}
	}
}

// stateWhere waits for a state that satisfies ok.
func (c *client) stateWhere(timeout time.Duration, what string, ok func(State) bool) State {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var last State
	for time.Now().Before(deadline) {
		select {
		case m, open := <-c.msgs:
			if !open {
				c.t.Fatalf("the stream ended before %s", what)
			}
			if m.name != MsgState {
				continue
			}
			if err := json.Unmarshal([]byte(m.data), &last); err != nil {
				c.t.Fatal(err)
			}
			if ok(last) {
				return last
			}
		case <-time.After(time.Until(deadline)):
		}
	}
	c.t.Fatalf("no state with %s within %s; last %+v", what, timeout, last)
	return last
}

func u64(v uint64) *uint64 { return &v }

func eqPtr(a, b *uint64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func waitFor(t *testing.T, timeout time.Duration, what string, ok func() bool) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, ok)
}

func TestLiveSendsStateThenTheActivitysEventsInOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fastConfig())
	const act, other = 42, 43
	s1 := f.publishRequest(act)
	s2 := f.publishRequest(act)
	f.publishRequest(other)
	f.openActivity(act, 10, 10, wire.Place(s1, 0)+1) // s1 applied, s2 still in the stream
	f.addWaiter(act, 101)
	f.addWaiter(act, 102)

	c := f.dial(act)
	h := c.resp.Header
	for k, want := range map[string]string{
		"Content-Type":  "text/event-stream; charset=utf-8",
		"Cache-Control": "no-cache, no-store",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if c.retry != strconv.Itoa(retryMillis) {
		t.Errorf("retry = %q, want %d", c.retry, retryMillis)
	}
	m := c.next(5 * time.Second)
	if m.name != MsgState {
		t.Fatalf("first message %q %s, want a state", m.name, m.data)
	}
	var st State
	if err := json.Unmarshal([]byte(m.data), &st); err != nil {
		t.Fatal(err)
	}
	want := State{ActivityID: act, Opened: true, Capacity: 10, Confirmed: 10, Waiting: 2, Remaining: 0,
		AppliedSeq: s1, StoredSeq: u64(s2), Lag: u64(s2 - s1)}
	if st.ActivityID != want.ActivityID || st.Opened != want.Opened || st.Capacity != want.Capacity ||
		st.Confirmed != want.Confirmed || st.Waiting != want.Waiting || st.Remaining != want.Remaining ||
		st.AppliedSeq != want.AppliedSeq || !eqPtr(st.StoredSeq, want.StoredSeq) || !eqPtr(st.Lag, want.Lag) {
		t.Fatalf("first state %s, want %+v (stored_seq %d, lag %d)", m.data, want, *want.StoredSeq, *want.Lag)
	}
	if st.At.IsZero() {
		t.Errorf("state has no time: %s", m.data)
	}

	// Events of another activity are filtered out; ours come in order and
	// exactly as the stream holds them.
	wantEvents := []string{f.publishEvent(act, wire.EventCancelled, 7, 20)}
	f.publishEvent(other, wire.EventGranted, 8, 21)
	wantEvents = append(wantEvents,
		f.publishEvent(act, wire.EventPromoted, 101, 20),
		f.publishEvent(act, wire.EventGranted, 9, 22))
	var got []string
	for len(got) < len(wantEvents) {
		m := c.next(5 * time.Second)
		if m.name == MsgEvent {
			got = append(got, m.data)
		}
	}
	for i := range wantEvents {
		if got[i] != wantEvents[i] {
			t.Errorf("event %d = %s, want %s", i, got[i], wantEvents[i])
		}
	}

	// A state follows the events; later changes show in later states.
	c.state(2 * time.Second)
	f.exec("DELETE FROM activity_signup WHERE activity_id = ? AND user_id = 101", act)
	f.exec("UPDATE activity SET waiting_count = waiting_count - 1 WHERE id = ?", act)
	f.exec("UPDATE activity SET next_seq = ? WHERE id = ?", wire.Place(s2, 0)+1, act)
	c.stateWhere(5*time.Second, "waiting 1 and lag 0", func(st State) bool {
		return st.Waiting == 1 && st.Lag != nil && *st.Lag == 0 && st.AppliedSeq == s2
	})
}

// TestLiveShowsHolds: under a hold the states carry held and the hold,
// and held, promoted and expired events reach the page exactly as stored,
// held_until included.
func TestLiveShowsHolds(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fastConfig())
	const act = 44
	f.exec("INSERT INTO activity (id, capacity, confirmed_count, held_count, hold_ns, next_seq) VALUES (?, 3, 2, 1, ?, 1)",
		act, int64(2*time.Second))
	c := f.dial(act)
	st := c.state(5 * time.Second)
	if st.Held != 1 || st.Hold != "2s" || st.Confirmed != 2 || st.Remaining != 1 {
		t.Fatalf("first state %+v, want held 1 of confirmed 2, hold 2s", st)
	}

	until := time.Date(2026, 12, 1, 4, 0, 2, 0, time.UTC)
	var want []string
	for i, kind := range []wire.EventKind{wire.EventHeld, wire.EventPromoted, wire.EventExpired} {
		ev := wire.Event{EventID: wire.EventID("hold", i), Kind: kind, ActivityID: act, UserID: int64(7 + i),
			RequestID: "hold", Seq: uint64(30 + i), At: until.Add(-2 * time.Second)}
		if kind != wire.EventExpired {
			ev.HeldUntil = &until
		}
		data := ev.AppendJSON(nil) // as the allocator stores it
		if _, err := f.js.Publish(context.Background(), wire.EventSubject(act, kind), data); err != nil {
			t.Fatal(err)
		}
		want = append(want, string(data))
	}
	var got []string
	for len(got) < len(want) {
		if m := c.next(5 * time.Second); m.name == MsgEvent {
			got = append(got, m.data)
		}
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d = %s, want %s", i, got[i], want[i])
		}
	}
	if !strings.Contains(got[0], `"held_until":"2026-12-01T04:00:02Z"`) {
		t.Errorf("the held event lost held_until: %s", got[0])
	}

	// The expiry released the seat: the next state says so.
	f.exec("UPDATE activity SET confirmed_count = 1, held_count = 0 WHERE id = ?", act)
	c.stateWhere(5*time.Second, "held 0", func(st State) bool { return st.Held == 0 && st.Confirmed == 1 && st.Hold == "2s" })
}

func TestLiveWatchesAnActivityBeforeItOpens(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fastConfig())
	c := f.dial(7)
	st := c.state(5 * time.Second)
	if st.Opened || st.Capacity != 0 || st.Lag != nil || st.StoredSeq == nil || *st.StoredSeq != 0 {
		t.Fatalf("state of a never-opened activity: %+v, want opened false, lag null, stored_seq 0", st)
	}
	seq := f.publishRequest(7)
	f.openActivity(7, 5, 0, wire.Place(seq, 0)+1)
	opened := f.publishEvent(7, wire.EventOpened, 0, seq)
	for {
		m := c.next(5 * time.Second)
		if m.name == MsgEvent {
			if m.data != opened {
				t.Fatalf("event %s, want %s", m.data, opened)
			}
			break
		}
	}
	c.stateWhere(5*time.Second, "opened, capacity 5", func(st State) bool {
		return st.Opened && st.Capacity == 5 && st.Remaining == 5 && st.Lag != nil && *st.Lag == 0
	})
}

func TestLiveBoundsItsClients(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.MaxClients = 2
	f := newFixture(t, cfg)
	a := f.dial(1)
	f.dial(1)
	c, status := f.tryDial(1)
	if status != http.StatusServiceUnavailable {
		t.Fatalf("third client: status %d, want 503", status)
	}
	body, _ := io.ReadAll(c.resp.Body)
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error != msgTooMany {
		t.Errorf("third client: body %q, want {\"error\": %q}", body, msgTooMany)
	}
	if got := c.resp.Header.Get("Retry-After"); got == "" {
		t.Error("503 without Retry-After")
	}
	a.close()
	waitFor(t, 5*time.Second, "the first client's slot is freed", func() bool { return f.srv.Clients() == 1 })
	f.dial(1).state(5 * time.Second)
}

func TestLiveCleansUpWhenTheClientLeaves(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fastConfig())
	c := f.dial(5)
	c.state(5 * time.Second)
	if n := f.eventConsumers(); n != 1 {
		t.Fatalf("%d consumers on %s while one page watches, want 1", n, wire.EventStream)
	}
	c.close()
	waitFor(t, 5*time.Second, "the handler returns", func() bool { return f.srv.Clients() == 0 })
	waitFor(t, 5*time.Second, "the consumer is deleted", func() bool { return f.eventConsumers() == 0 })
	f.srv.snaps.mu.Lock()
	n := len(f.srv.snaps.m)
	f.srv.snaps.mu.Unlock()
	if n != 0 {
		t.Errorf("%d snapshot entries left after the last client, want 0", n)
	}
}

func TestLiveSaysByeOnShutdown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fastConfig())
	c := f.dial(5)
	c.state(5 * time.Second)
	f.shutdown()
	for {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				t.Fatal("the stream ended without a bye")
			}
			if m.name != MsgBye {
				continue
			}
			if !strings.Contains(m.data, `"reason"`) {
				t.Errorf("bye %s has no reason", m.data)
			}
			select {
			case _, ok := <-c.msgs:
				if ok {
					t.Fatal("a message after bye")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the stream did not end after bye")
			}
			waitFor(t, 5*time.Second, "the handler returns", func() bool { return f.srv.Clients() == 0 })
			return
		case <-time.After(5 * time.Second):
			t.Fatal("no bye within 5s of the shutdown")
		}
	}
}

// TestLiveOutlivesTheServersTimeouts serves the feed from a server whose
// read and write timeouts are far shorter than the stream: the handler
// must push its deadlines forward, or the stream would die at 300ms.
func TestLiveOutlivesTheServersTimeouts(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.IdleEvery = 100 * time.Millisecond
	cfg.WriteTimeout = time.Second
	f := newFixtureServer(t, cfg, &http.Server{ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	f.openActivity(3, 1, 0, 1)
	c := f.dial(3)
	// Idle states come one every 100ms, never faster, so eight of them
	// span more than twice the server's 300ms timeouts: counting them, not
	// the clock, proves the stream outlived those timeouts (next fails the
	// test when the stream ends).
	states := 0
	for states < 8 {
		if m := c.next(2 * time.Second); m.name == MsgState {
			states++
		}
	}
	ev := f.publishEvent(3, wire.EventGranted, 1, 9)
	for {
		if m := c.next(2 * time.Second); m.name == MsgEvent {
			if m.data != ev {
				t.Fatalf("event %s, want %s", m.data, ev)
			}
			return
		}
	}
}

func TestLiveHeadAnswersHeadersOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fastConfig())
	resp, err := http.Head(f.url + "/live/1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
		t.Fatalf("HEAD: %d %q, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if n := f.eventConsumers(); n != 0 {
		t.Errorf("HEAD left %d consumers, want 0", n)
	}
}

func TestStreamEventKeepsOneLineOfJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		data string
		want string
	}{
		{name: "compact", data: `{"kind":"granted","seq":1}`, want: "event: event\ndata: {\"kind\":\"granted\",\"seq\":1}\n\n"},
		{name: "indented", data: "{\n  \"kind\": \"granted\",\r\n  \"seq\": 1\n}", want: "event: event\ndata: {\"kind\":\"granted\",\"seq\":1}\n\n"},
		{name: "not JSON", data: "granted\nseq 1", want: ""},
		{name: "not JSON on one line", data: "granted", want: ""},
	}
	for _, tt := range tests {
		var o stream
		o.event([]byte(tt.data))
		if got := o.buf.String(); got != tt.want {
			t.Errorf("%s: wrote %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestLiveShowsTheShards: with shards, a state names the activity's shard
// and lists every shard with whether it answers; a stream of an activity
// whose shard does not answer is refused with a 503 naming the shard.
func TestLiveShowsTheShards(t *testing.T) {
	t.Parallel()
	away, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/allot?timeout=1s") // nothing listens on port 1
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { away.Close() })
	var live atomic.Pointer[sql.DB]
	cfg := fastConfig()
	cfg.Route = func(activity int64) (Shard, error) {
		if activity == 2 {
			return Shard{Name: "s1", DB: away}, nil
		}
		return Shard{Name: "s0", DB: live.Load()}, nil
	}
	cfg.Shards = func(context.Context) []ShardState { return []ShardState{{Name: "s0", Up: true}, {Name: "s1"}} }
	f := newFixture(t, cfg)
	live.Store(f.db.DB)
	f.openActivity(1, 10, 0, 0)
	st := f.dial(1).state(5 * time.Second)
	if st.Shard != "s0" || len(st.Shards) != 2 || st.Shards[0] != (ShardState{"s0", true}) || st.Shards[1] != (ShardState{"s1", false}) {
		t.Fatalf("state's shard %q and shards %+v, want s0 and [s0 up, s1 down]", st.Shard, st.Shards)
	}
	c, status := f.tryDial(2)
	if status != http.StatusServiceUnavailable {
		t.Fatalf("live of an activity on a shard away: status %d, want 503", status)
	}
	body, _ := io.ReadAll(c.resp.Body)
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || !strings.Contains(e.Error, "shard s1 ") {
		t.Errorf("live of an activity on a shard away: body %q, want a sentence naming s1", body)
	}
	if c.resp.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
}
