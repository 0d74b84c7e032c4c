package ingest

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/store/waitlist"
	"github.com/allot-dev/allot/internal/wire"
)

func TestNATSDownAnswers503AndRecovers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { c.PublishTimeout = 2 * time.Second; d.Test.RecheckInterval = time.Hour })
	resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/1"})
	accepted(t, "before the outage", resp, body)

	h.ns.Stop()
	eventually(t, 10*time.Second, "the connection notices the outage", func() bool { return !h.nc.IsConnected() })
	for _, rq := range []req{
		{method: "POST", path: "/v1/activities/1/signups/2"},
		{method: "POST", path: "/v1/activities/1/claims/2?wait=1s"},
		{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 3}`},
		{method: "DELETE", path: "/v1/activities/1/signups/1", header: map[string]string{"Idempotency-Key": "k"}},
	} {
		what := "during the outage: " + rq.method + " " + rq.path
		resp, body := h.do(rq)
		wantStatus(t, what, resp, body, http.StatusServiceUnavailable)
		errorSentence(t, what, resp, body)
	}
	resp, body = h.do(req{method: "GET", path: "/readyz"})
	wantStatus(t, "readyz during the outage", resp, body, http.StatusServiceUnavailable)
	if msg := errorSentence(t, "readyz", resp, body); !strings.Contains(msg, "NATS") || strings.Contains(msg, "MySQL") {
		t.Errorf("readyz says %q, want NATS named as down and MySQL not", msg)
	}

	h.ns.Start()
	eventually(t, 20*time.Second, "the connection comes back", h.nc.IsConnected)
	var id string
	eventually(t, 20*time.Second, "writes are accepted again", func() bool {
		resp, body := h.do(req{method: "POST", path: "/v1/activities/1/signups/3"})
		if resp.StatusCode != http.StatusAccepted {
			return false
		}
		id = accepted(t, "after the outage", resp, body)
		return true
	})
	resp, body = h.do(req{method: "GET", path: "/readyz"})
	wantStatus(t, "readyz after the outage", resp, body, http.StatusOK)
	if n := h.subjectMsgs(wire.RequestSubject(1)); n != 2 {
		t.Fatalf("%d messages on %s, want 2 (one before, one after; none during)", n, wire.RequestSubject(1))
	}

	// The result subscription survived the reconnect.
	done := make(chan int, 1)
	go func() {
		r, err := http.Get(h.srv.URL + "/v1/requests/" + id + "?wait=10s")
		if err != nil {
			done <- 0
			return
		}
		r.Body.Close()
		done <- r.StatusCode
	}()
	eventually(t, 5*time.Second, "the poll waits", func() bool { return h.svc.results.Count() == 1 })
	res := wire.Result{RequestID: id, State: wire.StateDone, Op: wire.OpJoin, ActivityID: 1, UserID: 3,
		Outcome: wire.OutcomeConfirmed, Status: ptr(wire.StatusConfirmed), Seq: 3, AppliedAt: time.Now().UTC()}
	h.insertResult(res)
	start := time.Now()
	h.publishResults(res)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("poll after reconnect: status %d", code)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("poll after reconnect was not woken by the notification (%s)", el)
	}
}

func TestActivityAndSignupReads(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := h.db.ExecContext(context.Background(), q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("INSERT INTO activity (id, capacity, confirmed_count, next_seq) VALUES (7, 2, 2, 10), (8, 5, 1, 3)")
	// An activity with a 10m hold: user 1 holds a seat, user 2 confirmed.
	exec("INSERT INTO activity (id, capacity, confirmed_count, next_seq, hold_ns, held_count) VALUES (10, 3, 2, 6, ?, 1)", int64(10*time.Minute))
	exec(`INSERT INTO activity_signup (activity_id, user_id, status, queue_seq, held_until, hold_seq) VALUES
		(10, 1, 'HELD', 2, '2026-12-01 10:20:30.123456', 2), (10, 2, 'CONFIRMED', 3, NULL, NULL)`)
	exec(`INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES
		(7, 1, 'CONFIRMED', 1), (7, 2, 'CONFIRMED', 2), (7, 4, 'WAITING', 3),
		(7, 5, 'CANCELLED', 4), (7, 3, 'WAITING', 5), (7, 6, 'WAITING', 9),
		(8, 1, 'CONFIRMED', 2)`)
	// The counters and waitlist buckets the allocator keeps with the rows.
	for _, a := range []int64{7, 8, 10} {
		if err := waitlist.Rebuild(context.Background(), h.db.DB, a); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name, path string
		want       int
		wantBody   string
	}{
		{name: "full activity", path: "/v1/activities/7", want: 200,
			wantBody: `{"activity_id":7,"capacity":2,"confirmed":2,"held":0,"waiting":3,"remaining":0}`},
		{name: "activity with seats", path: "/v1/activities/8", want: 200,
			wantBody: `{"activity_id":8,"capacity":5,"confirmed":1,"held":0,"waiting":0,"remaining":4}`},
		{name: "activity with a hold", path: "/v1/activities/10", want: 200,
			wantBody: `{"activity_id":10,"capacity":3,"confirmed":2,"held":1,"waiting":0,"remaining":1,"hold":"10m0s"}`},
		{name: "held", path: "/v1/activities/10/signups/1", want: 200,
			wantBody: `{"activity_id":10,"user_id":1,"status":"HELD","position":null,"held_until":"2026-12-01T10:20:30.123456Z"}`},
		{name: "confirmed in an activity with a hold", path: "/v1/activities/10/signups/2", want: 200,
			wantBody: `{"activity_id":10,"user_id":2,"status":"CONFIRMED","position":null}`},
		{name: "never opened", path: "/v1/activities/9", want: 404},
		{name: "confirmed", path: "/v1/activities/7/signups/1", want: 200,
			wantBody: `{"activity_id":7,"user_id":1,"status":"CONFIRMED","position":null}`},
		{name: "head of the waitlist", path: "/v1/activities/7/signups/4", want: 200,
			wantBody: `{"activity_id":7,"user_id":4,"status":"WAITING","position":1}`},
		{name: "second, behind a cancelled seq", path: "/v1/activities/7/signups/3", want: 200,
			wantBody: `{"activity_id":7,"user_id":3,"status":"WAITING","position":2}`},
		{name: "third", path: "/v1/activities/7/signups/6", want: 200,
			wantBody: `{"activity_id":7,"user_id":6,"status":"WAITING","position":3}`},
		{name: "cancelled", path: "/v1/activities/7/signups/5", want: 200,
			wantBody: `{"activity_id":7,"user_id":5,"status":"CANCELLED","position":null}`},
		{name: "other activity", path: "/v1/activities/8/signups/1", want: 200,
			wantBody: `{"activity_id":8,"user_id":1,"status":"CONFIRMED","position":null}`},
		{name: "never signed up", path: "/v1/activities/7/signups/99", want: 404},
		{name: "activity never opened", path: "/v1/activities/9/signups/1", want: 404},
	}
	for _, tt := range tests {
		resp, body := h.do(req{method: "GET", path: tt.path})
		wantStatus(t, tt.name, resp, body, tt.want)
		if tt.want != 200 {
			errorSentence(t, tt.name, resp, body)
			continue
		}
		if got := strings.TrimSpace(string(body)); got != tt.wantBody {
			t.Errorf("%s: GET %s = %s, want %s", tt.name, tt.path, got, tt.wantBody)
		}
	}
	resp, body := h.do(req{method: "HEAD", path: "/v1/activities/7"})
	wantStatus(t, "HEAD activity", resp, body, 200)
}

func TestHealthReadinessMetrics(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, body := h.do(req{method: "GET", path: path})
		wantStatus(t, path, resp, body, http.StatusOK)
		if got := strings.TrimSpace(string(body)); got != `{"status":"ok"}` {
			t.Errorf("%s = %s, want {\"status\":\"ok\"}", path, got)
		}
	}
	h.do(req{method: "GET", path: "/nope"})
	h.do(req{method: "POST", path: "/v1/activities/1/signups/2"})
	resp, body := h.do(req{method: "GET", path: "/metrics"})
	wantStatus(t, "/metrics", resp, body, http.StatusOK)
	for _, want := range []string{
		`allot_ingest_http_requests_total{code="200",route="GET /healthz"} 1`,
		`allot_ingest_http_requests_total{code="404",route="unmatched"} 1`,
		`allot_ingest_http_requests_total{code="202",route="POST /v1/activities/{activity}/signups/{user}"} 1`,
		`allot_ingest_publish_duration_seconds_count 1`,
		`allot_ingest_waiters 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	h.ns.Stop()
	eventually(t, 10*time.Second, "the connection notices the outage", func() bool { return !h.nc.IsConnected() })
	resp, body = h.do(req{method: "GET", path: "/readyz"})
	wantStatus(t, "/readyz with NATS down", resp, body, http.StatusServiceUnavailable)
	if msg := errorSentence(t, "/readyz", resp, body); !strings.Contains(msg, "NATS") {
		t.Errorf("/readyz says %q, want NATS named", msg)
	}
	resp, body = h.do(req{method: "GET", path: "/healthz"})
	wantStatus(t, "/healthz with NATS down", resp, body, http.StatusOK)
}

// TestReadinessIsNATSAndMySQL: /readyz is "NATS+MySQL" (api/openapi.yaml):
// ready while both answer, 503 naming MySQL once it stops answering (within
// the second a probe's answer is kept). Writes never touch MySQL, so they
// are still accepted then, while a read that needs it answers 503.
func TestReadinessIsNATSAndMySQL(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	resp, body := h.do(req{method: "GET", path: "/readyz"})
	wantStatus(t, "/readyz with NATS and MySQL up", resp, body, http.StatusOK)
	h.db.Close() // a closed pool fails every query
	eventually(t, 10*time.Second, "/readyz 503 with MySQL closed", func() bool {
		resp, _ := h.do(req{method: "GET", path: "/readyz"})
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	resp, body = h.do(req{method: "GET", path: "/readyz"})
	wantStatus(t, "/readyz with MySQL closed", resp, body, http.StatusServiceUnavailable)
	if msg := errorSentence(t, "/readyz with MySQL closed", resp, body); !strings.Contains(msg, "MySQL") {
		t.Errorf("/readyz says %q, want MySQL named", msg)
	}
	resp, body = h.do(req{method: "GET", path: "/healthz"})
	wantStatus(t, "/healthz with MySQL closed", resp, body, http.StatusOK)
	resp, body = h.do(req{method: "GET", path: "/v1/activities/1"})
	wantStatus(t, "read with MySQL closed", resp, body, http.StatusServiceUnavailable)
	errorSentence(t, "read with MySQL closed", resp, body)
	resp, body = h.do(req{method: "POST", path: "/v1/activities/1/claims/2"})
	accepted(t, "write with MySQL closed", resp, body)
}

func TestPanicIsA500(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	rt := h.svc.Handler().(*router)
	rt.mux.HandleFunc("GET /boom", func(http.ResponseWriter, *http.Request) { panic("boom") })
	rec := httptest.NewRecorder()
	rt.ServeHTTP(rec, httptest.NewRequest("GET", "/boom", nil))
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", rec.Code)
	}
	var e struct{ Error string }
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || !strings.HasSuffix(e.Error, ".") {
		t.Fatalf("body %s is not a JSON error sentence", rec.Body.Bytes())
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ns := natstest.New(t)
	ns.Setup(t, config.Defaults[bus.Config]())
	nc, _ := ns.Connect(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() {
		cfg := testConfig()
		cfg.ShutdownTimeout = 5 * time.Second
		ran <- Run(ctx, cfg, Deps{DB: db.DB, NATS: nc, Listener: ln, Registry: prometheus.NewRegistry(),
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	base := "http://" + ln.Addr().String()
	eventually(t, 20*time.Second, "Run serves /readyz", func() bool {
		r, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})

	// A waiting request in flight answers at shutdown instead of holding it.
	r, err := http.Post(base+"/v1/activities/1/signups/1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var ack wire.Ack
	json.NewDecoder(r.Body).Decode(&ack) //nolint:errcheck
	r.Body.Close()
	waited := make(chan int, 1)
	go func() {
		r, err := http.Get(base + "/v1/requests/" + ack.RequestID + "?wait=30s")
		if err != nil {
			waited <- 0
			return
		}
		r.Body.Close()
		waited <- r.StatusCode
	}()
	eventually(t, 5*time.Second, "the poll waits", func() bool {
		r, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return strings.Contains(string(b), "\nallot_ingest_waiters 1\n")
	})
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run returned %v, want nil after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of cancel")
	}
	if code := <-waited; code != http.StatusOK {
		t.Fatalf("the waiting poll answered %d at shutdown, want 200 pending", code)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("Run still serves after returning")
	}
}

// TestConfigRejectsBadValues: the defaults validate (on a loopback
// address, where no key is needed), and a bad value is refused; New
// refuses to register its metrics twice.
func TestConfigRejectsBadValues(t *testing.T) {
	t.Parallel()
	good := config.Defaults[Config]()
	good.HTTPAddr = "127.0.0.1:8080"
	if err := good.Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
	for _, set := range []func(*Config){
		func(c *Config) { c.PublishTimeout = -time.Second },
		func(c *Config) { c.RateLimit = -1 },
		func(c *Config) { c.MaxInFlight = 0 },
		func(c *Config) { c.CommitMinBatch = 0 },
		func(c *Config) { c.BatchMax = 0 },
		func(c *Config) { c.BatchMax = wire.MaxBatch + 1 },
	} {
		c := good
		set(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("Validate accepted %+v", c)
		}
	}
	db := dbtest.New(t)
	ns := natstest.New(t)
	ns.Setup(t, config.Defaults[bus.Config]())
	nc, js := ns.Connect(t)
	reg := prometheus.NewRegistry()
	deps := Deps{DB: db.DB, NATS: nc, JS: js, Registry: reg}
	if _, err := New(good, deps); err != nil {
		t.Fatal(err)
	}
	if _, err := New(good, deps); err == nil {
		t.Error("New registered the same metrics twice without an error")
	}
}
