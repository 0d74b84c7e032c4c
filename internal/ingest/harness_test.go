package ingest

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// harness is one test's ingest: its own database, its own JetStream server,
// a started Service behind an httptest.Server.
type harness struct {
	t   *testing.T
	db  *dbtest.DB
	ns  *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	svc *Service
	srv *httptest.Server
	reg *prometheus.Registry
	cl  *http.Client
}

func newHarness(t *testing.T, set setup) *harness {
	t.Helper()
	db := dbtest.New(t)
	return newHarnessWith(t, db, db.DB, set)
}

// setup is one test's changes to the harness's Config and Deps; nil: none.
type setup func(*Config, *Deps)

// testConfig is the configuration the harness starts from: the defaults,
// without the per-user write and read limits, which only the tests of
// those limits set.
func testConfig() Config {
	c := config.Defaults[Config]()
	c.UserRate, c.ReadRate = 0, 0
	return c
}

// newService is New with the harness's configuration changed by set.
func newService(t *testing.T, db *sql.DB, nc *nats.Conn, js jetstream.JetStream, reg *prometheus.Registry, set setup) *Service {
	t.Helper()
	cfg := testConfig()
	deps := Deps{DB: db, NATS: nc, JS: js, Registry: reg,
		Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if set != nil {
		set(&cfg, &deps)
	}
	svc, err := New(cfg, deps)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return svc
}

// newHarnessWith is newHarness with the Service reading svcDB (another
// MySQL user's pool, or one whose server is down) while h.db stays the
// test's own access to its database (nil when it has none).
func newHarnessWith(t *testing.T, db *dbtest.DB, svcDB *sql.DB, set setup) *harness {
	t.Helper()
	h := &harness{t: t, db: db, ns: natstest.New(t), reg: prometheus.NewRegistry()}
	cfg := testConfig()
	if set != nil {
		set(&cfg, &Deps{})
	}
	h.ns.Setup(t, natstest.Config(cfg.Partitions))
	h.nc, h.js = h.ns.Connect(t)
	svc := newService(t, svcDB, h.nc, h.js, h.reg, set)
	// No deadline: Start must bound its own calls.
	if err := svc.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(svc.Stop)
	h.svc = svc
	h.srv = httptest.NewServer(svc.Handler())
	t.Cleanup(h.srv.Close)
	h.cl = &http.Client{Timeout: 60 * time.Second}
	return h
}

// another is a second ingest instance on h's database and NATS server.
func (h *harness) another(t *testing.T, set setup) *harness {
	t.Helper()
	o := &harness{t: t, db: h.db, ns: h.ns, nc: h.nc, js: h.js, reg: prometheus.NewRegistry()}
	svc := newService(t, h.db.DB, h.nc, h.js, o.reg, set)
	if err := svc.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(svc.Stop)
	o.svc = svc
	o.srv = httptest.NewServer(svc.Handler())
	t.Cleanup(o.srv.Close)
	o.cl = &http.Client{Timeout: 60 * time.Second}
	return o
}

// req is one HTTP request of a test.
type req struct {
	method string
	path   string
	body   string
	header map[string]string
	reader io.Reader // when set, sent instead of body, chunked
}

// do sends rq and returns the response with its body read.
func (h *harness) do(rq req) (*http.Response, []byte) {
	h.t.Helper()
	var body io.Reader
	switch {
	case rq.reader != nil:
		body = rq.reader
	case rq.body != "":
		body = strings.NewReader(rq.body)
	}
	r, err := http.NewRequest(rq.method, h.srv.URL+rq.path, body)
	if err != nil {
		h.t.Fatalf("%s %s: %v", rq.method, rq.path, err)
	}
	for k, v := range rq.header {
		r.Header.Set(k, v)
	}
	resp, err := h.cl.Do(r)
	if err != nil {
		h.t.Fatalf("%s %s: %v", rq.method, rq.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s %s: read body: %v", rq.method, rq.path, err)
	}
	return resp, b
}

// wantStatus fails unless resp has status want.
func wantStatus(t *testing.T, what string, resp *http.Response, body []byte, want int) {
	t.Helper()
	if resp.StatusCode != want {
		t.Fatalf("%s: status = %d, want %d; body %s", what, resp.StatusCode, want, body)
	}
}

// errorSentence checks that body is exactly {"error": "<sentence.>"} and
// returns the sentence.
func errorSentence(t *testing.T, what string, resp *http.Response, body []byte) string {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type = %q, want application/json", what, ct)
	}
	var e struct {
		Error string `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("%s: body %q is not {\"error\": ...}: %v", what, body, err)
	}
	if e.Error == "" || !strings.HasSuffix(e.Error, ".") || strings.ContainsAny(e.Error, "\n") {
		t.Errorf("%s: error %q is not one sentence ending with a period", what, e.Error)
	}
	return e.Error
}

// decode decodes body into v, failing on unknown fields.
func decode[T any](t *testing.T, what string, body []byte) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: decode %s: %v", what, body, err)
	}
	return v
}

// accepted checks a 202 ack and returns its request id.
func accepted(t *testing.T, what string, resp *http.Response, body []byte) string {
	t.Helper()
	wantStatus(t, what, resp, body, http.StatusAccepted)
	ack := decode[wire.Ack](t, what, body)
	if ack.State != wire.StatePending || ack.RequestID == "" {
		t.Fatalf("%s: ack = %+v, want a request id and state pending", what, ack)
	}
	if loc := resp.Header.Get("Location"); loc != "/v1/requests/"+ack.RequestID {
		t.Fatalf("%s: Location = %q, want /v1/requests/%s", what, loc, ack.RequestID)
	}
	return ack.RequestID
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, cond)
}

// requestStream is the request stream, for reading what was stored.
func (h *harness) requestStream() jetstream.Stream {
	h.t.Helper()
	st, err := h.js.Stream(context.Background(), wire.RequestStream)
	if err != nil {
		h.t.Fatalf("stream %s: %v", wire.RequestStream, err)
	}
	return st
}

// subjectMsgs is the number of messages stored on subject in the request
// stream.
func (h *harness) subjectMsgs(subject string) uint64 {
	h.t.Helper()
	ctx := context.Background()
	st := h.requestStream()
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		h.t.Fatalf("stream info: %v", err)
	}
	return info.State.Subjects[subject]
}

// lastMsg is the last message stored on subject.
func (h *harness) lastMsg(subject string) *jetstream.RawStreamMsg {
	h.t.Helper()
	ctx := context.Background()
	st := h.requestStream()
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		h.t.Fatalf("last message on %s: %v", subject, err)
	}
	return m
}

var seqs atomic.Uint64

// insertResult records r in processed_request as the allocator would.
func (h *harness) insertResult(r wire.Result) {
	h.t.Helper()
	if r.Seq == 0 {
		r.Seq = seqs.Add(1)
	}
	var promoted any
	if r.PromotedUserID != nil {
		promoted = "[" + jsonInt(*r.PromotedUserID) + "]"
	}
	_, err := h.db.ExecContext(context.Background(),
		"INSERT INTO processed_request (request_id, seq, op, activity_id, user_id, outcome, status, `position`, promoted_user_ids, capacity, applied_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
		r.RequestID, r.Seq, r.Op, r.ActivityID, r.UserID, r.Outcome, r.Status, r.Position, promoted, r.Capacity, r.AppliedAt)
	if err != nil {
		h.t.Fatalf("insert processed_request: %v", err)
	}
}

// publishResults announces results on wire.ResultSubject as the allocator
// does after a commit.
func (h *harness) publishResults(rs ...wire.Result) {
	h.t.Helper()
	b, err := json.Marshal(wire.ResultBatch{Results: rs})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.nc.Publish(wire.ResultSubject, b); err != nil {
		h.t.Fatalf("publish results: %v", err)
	}
	if err := h.nc.Flush(); err != nil {
		h.t.Fatalf("flush: %v", err)
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

func ptr[T any](v T) *T { return &v }

// statusOf sends method url, with a bearer token when tok is set, and
// returns the status and headers of the answer, or 0 when none came (the
// server is not listening yet, or any more).
func statusOf(method, url, tok string) (int, http.Header) {
	r, err := http.NewRequest(method, url, nil)
	if err != nil {
		return 0, nil
	}
	if tok != "" {
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return 0, nil
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}
