package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/api"
	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/stacktest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// spec is the parsed document, its model and a validator over it.
type spec struct {
	model *v3.Document
	v     validator.Validator
}

func loadSpec(t *testing.T) *spec {
	t.Helper()
	doc, err := libopenapi.NewDocument(api.OpenAPI)
	if err != nil {
		t.Fatalf("parse api/openapi.yaml: %v", err)
	}
	m, err := doc.BuildV3Model()
	if err != nil {
		t.Fatalf("build the model of api/openapi.yaml: %v", err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("validator: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("api/openapi.yaml is not a valid OpenAPI 3.1 document: %s", e.Error())
		}
		t.FailNow()
	}
	return &spec{model: &m.Model, v: v}
}

func (s *spec) schema(t *testing.T, name string) *base.Schema {
	t.Helper()
	p := s.model.Components.Schemas.GetOrZero(name)
	if p == nil {
		t.Fatalf("api/openapi.yaml has no schema %s", name)
	}
	return p.Schema()
}

// validate checks one JSON document against the named component schema.
func (s *spec) validate(t *testing.T, name string, data []byte, what string) {
	t.Helper()
	sv := schema_validation.NewSchemaValidator()
	if ok, errs := sv.ValidateSchemaBytes(s.schema(t, name), data); !ok {
		for _, e := range errs {
			t.Errorf("%s does not match schema %s: %s (%s)", what, name, e.Error(), data)
		}
	}
}

// operations lists "METHOD /path STATUS" for every response the spec
// declares: what the test must exercise.
func (s *spec) operations() []string {
	var out []string
	for path, item := range s.model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			for code := range op.Responses.Codes.KeysFromOldest() {
				out = append(out, strings.ToUpper(method)+" "+path+" "+code)
			}
		}
	}
	slices.Sort(out)
	return out
}

// conform says whether a request must match the spec.
type conform int

const (
	mustConform    conform = iota // a well-formed request
	mustNotConform                // the server refuses it: the spec must too
	either                        // the spec cannot say (a body larger than 64 KiB)
)

// exchange is one request and the status it must get.
type exchange struct {
	route  string // the spec's path, for the coverage check; "" = no route
	method string
	path   string // with the query
	header map[string]string
	body   string
	want   int
	req    conform
}

// driver sends exchanges, validates them and records what was covered.
type driver struct {
	t       *testing.T
	spec    *spec
	mu      sync.Mutex
	covered map[string]bool
}

func (d *driver) request(base string, x exchange) *http.Request {
	var body io.Reader = http.NoBody
	if x.body != "" {
		body = strings.NewReader(x.body)
	}
	req, err := http.NewRequest(x.method, base+x.path, body)
	if err != nil {
		d.t.Fatal(err)
	}
	for k, v := range x.header {
		req.Header.Set(k, v)
	}
	if x.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// do sends x to base and validates request and response; it returns the
// response body.
func (d *driver) do(base string, x exchange) []byte {
	t := d.t
	t.Helper()
	name := x.method + " " + x.path
	resp, err := http.DefaultClient.Do(d.request(base, x))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s: read the answer: %v", name, err)
	}
	if resp.StatusCode != x.want {
		t.Errorf("%s: status %d, want %d; body %s", name, resp.StatusCode, x.want, body)
		return body
	}
	d.check(x, resp, body)
	return body
}

// check validates a response already read, and the request x that got it.
func (d *driver) check(x exchange, resp *http.Response, body []byte) {
	t := d.t
	t.Helper()
	name := fmt.Sprintf("%s %s (%d)", x.method, x.path, x.want)
	req := d.request("http://localhost:8080", x)
	switch ok, errs := d.spec.v.ValidateHttpRequest(req); {
	case x.req == mustConform && !ok:
		for _, e := range errs {
			t.Errorf("%s: the request does not match the spec: %s", name, e.Error())
		}
	case x.req == mustNotConform && ok:
		t.Errorf("%s: the server refuses this request, but the spec allows it", name)
	}

	resp.Body = io.NopCloser(bytes.NewReader(body))
	if x.route == "" || x.want == http.StatusMethodNotAllowed {
		// No operation can declare these: check them against the
		// components the spec's description names.
		d.spec.validate(t, "Error", body, name)
		if x.want == http.StatusMethodNotAllowed && resp.Header.Get("Allow") == "" {
			t.Errorf("%s: no Allow header", name)
		}
	} else if ok, errs := d.spec.v.ValidateHttpResponse(d.request("http://localhost:8080", x), resp); !ok {
		for _, e := range errs {
			t.Errorf("%s: the response does not match the spec: %s; body %s", name, e.Error(), body)
		}
	}
	if x.route != "" && x.want != http.StatusMethodNotAllowed {
		d.mu.Lock()
		d.covered[x.method+" "+x.route+" "+fmt.Sprint(x.want)] = true
		d.mu.Unlock()
	}
}

func requestID(t *testing.T, body []byte) string {
	t.Helper()
	var a struct {
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(body, &a); err != nil || a.RequestID == "" {
		t.Fatalf("no request_id in %s", body)
	}
	return a.RequestID
}

// startIngest runs one more ingest instance, its configuration changed by set, on the stack's
// database (its own pool) and on the NATS server ns.
func startIngest(t *testing.T, dsn string, ns *natstest.Server, set func(*ingest.Config, *ingest.Deps)) (string, func()) {
	t.Helper()
	db, err := store.Open(context.Background(), dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	nc, js := ns.Connect(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := stacktest.IngestConfig()
	deps := ingest.Deps{DB: db, NATS: nc, JS: js, Log: log, Registry: prometheus.NewRegistry()}
	set(&cfg, &deps)
	svc, err := ingest.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(func() { srv.Close(); svc.Stop(); db.Close() })
	return srv.URL, func() { db.Close() }
}

const (
	routeActivity = "/v1/activities/{activity}"
	routeSignup   = "/v1/activities/{activity}/signups/{user}"
	routeClaim    = "/v1/activities/{activity}/claims/{user}"
	routeRequest  = "/v1/requests/{request_id}"
	routeLive     = "/v1/activities/{activity}/live"
	routeConfirm  = "/v1/activities/{activity}/signups/{user}/confirm"
)

// TestSpecMatchesTheRouter drives the real ingest router (with an allocator
// behind it) through every route and every status the spec declares, and
// validates each request and each response against api/openapi.yaml.
func TestSpecMatchesTheRouter(t *testing.T) {
	sp := loadSpec(t)
	st := stacktest.Start(t, config.Defaults[allocator.Config](), stacktest.IngestConfig(), ingest.Deps{})

	// Everything the allocator says after a commit, for the message check.
	rnc, _ := st.NS.Connect(t)
	var resultsMu sync.Mutex
	var results [][]byte
	sub, err := rnc.Subscribe(wire.ResultSubject, func(m *nats.Msg) {
		resultsMu.Lock()
		results = append(results, m.Data)
		resultsMu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := rnc.Flush(); err != nil {
		t.Fatal(err)
	}

	d := &driver{t: t, spec: sp, covered: map[string]bool{}}
	u := st.URL
	cap1 := `{"capacity": 1}`
	big := `{"capacity": 1, "pad": "` + strings.Repeat("x", 70<<10) + `"}`
	key := map[string]string{"Idempotency-Key": "tap-123"}

	// Writes that land.
	d.do(u, exchange{routeActivity, "PUT", "/v1/activities/9001?wait=5s", nil, cap1, 200, mustConform})
	ack := d.do(u, exchange{routeActivity, "PUT", "/v1/activities/9002", nil, cap1, 202, mustConform})
	d.do(u, exchange{routeRequest, "GET", "/v1/requests/" + requestID(t, ack) + "?wait=5s", nil, "", 200, mustConform})
	d.do(u, exchange{routeActivity, "PUT", "/v1/activities/9003?wait=5s", nil, `{"capacity": 5}`, 200, mustConform})
	d.do(u, exchange{routeActivity, "PUT", "/v1/activities/9003?wait=5s", nil, `{"capacity": 0}`, 200, mustConform}) // RESIZED
	d.do(u, exchange{routeActivity, "PUT", "/v1/activities/9003?wait=5s", nil, `{"capacity": 5}`, 200, mustConform}) // RESIZED
	d.do(u, exchange{routeSignup, "POST", "/v1/activities/9001/signups/1?wait=5s", nil, "", 200, mustConform})       // CONFIRMED
	d.do(u, exchange{routeSignup, "POST", "/v1/activities/9001/signups/2?wait=5s", nil, "", 200, mustConform})       // WAITING
	d.do(u, exchange{routeSignup, "POST", "/v1/activities/9001/signups/2?wait=5s", nil, "", 200, mustConform})       // ALREADY_WAITING
	d.do(u, exchange{routeSignup, "GET", "/v1/activities/9001/signups/2", nil, "", 200, mustConform})                // WAITING, position 1
	d.do(u, exchange{routeClaim, "POST", "/v1/activities/9001/claims/2?wait=5s", nil, "", 200, mustConform})         // ALREADY_WAITING
	d.do(u, exchange{routeSignup, "DELETE", "/v1/activities/9001/signups/1?wait=5s", nil, "", 200, mustConform})     // CANCELLED, promotes 2
	d.do(u, exchange{routeSignup, "DELETE", "/v1/activities/9001/signups/1", nil, "", 202, mustConform})             // NOT_SIGNED_UP, later
	d.do(u, exchange{routeSignup, "GET", "/v1/activities/9001/signups/1", nil, "", 200, mustConform})                // CANCELLED
	d.do(u, exchange{routeActivity, "GET", "/v1/activities/9001", nil, "", 200, mustConform})                        //
	d.do(u, exchange{routeClaim, "POST", "/v1/activities/9002/claims/5?wait=5s", nil, "", 200, mustConform})         // GRANTED
	d.do(u, exchange{routeClaim, "POST", "/v1/activities/9002/claims/5?wait=5s", nil, "", 200, mustConform})         // ALREADY_OWNED
	d.do(u, exchange{routeClaim, "POST", "/v1/activities/9002/claims/6?wait=5s", nil, "", 200, mustConform})         // SOLD_OUT (maybe shed)
	d.do(u, exchange{routeClaim, "POST", "/v1/activities/9003/claims/7", nil, "", 202, mustConform})                 //
	d.do(u, exchange{routeClaim, "POST", "/v1/activities/4242/claims/7?wait=5s", nil, "", 200, mustConform})         // NO_SUCH_ACTIVITY
	d.do(u, exchange{routeSignup, "POST", "/v1/activities/9003/signups/5?wait=5s", key, "", 200, mustConform})       // keyed
	d.do(u, exchange{routeSignup, "POST", "/v1/activities/9003/signups/5?wait=5s", key, "", 200, mustConform})       // the same request_id
	d.do(u, exchange{routeSignup, "DELETE", "/v1/activities/9003/signups/5", key, "", 422, mustConform})             // key bound elsewhere
	d.do(u, exchange{routeClaim, "POST", "/v1/activities/9003/claims/5", key, "", 422, mustConform})                 //
	d.do(u, exchange{routeActivity, "PUT", "/v1/activities/9003", key, cap1, 422, mustConform})
	key2 := map[string]string{"Idempotency-Key": "tap-456"}
	d.do(u, exchange{routeSignup, "DELETE", "/v1/activities/9003/signups/8", key2, "", 202, mustConform})
	d.do(u, exchange{routeSignup, "POST", "/v1/activities/9003/signups/8", key2, "", 422, mustConform})
	d.do(u, exchange{routeSignup, "POST", "/v1/activities/9003/signups/9", nil, "", 202, mustConform})               //
	d.do(u, exchange{routeActivity, "PUT", "/v1/activities/9001?wait=5s", nil, `{"capacity": 0}`, 200, mustConform}) // REJECTED: below confirmed
	d.do(u, exchange{routeRequest, "GET", "/v1/requests/" + requestID(t, ack), nil, "", 200, mustConform})           // done
	d.do(u, exchange{routeActivity, "GET", "/v1/activities/9003", nil, "", 200, mustConform})                        //
	bearer := map[string]string{"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI1In0.c2ln"}
	d.do(u, exchange{routeSignup, "GET", "/v1/activities/9003/signups/5", bearer, "", 200, mustConform}) // optional Authorization

	// Holds: a seat HELD, read, confirmed; a confirm after held_until.
	d.do(u, exchange{routeActivity, "PUT", "/v1/activities/9010?wait=5s", nil, `{"capacity": 1, "hold": "1h"}`, 200, mustConform})
	d.do(u, exchange{routeSignup, "POST", "/v1/activities/9010/signups/1?wait=5s", nil, "", 200, mustConform})          // HELD
	d.do(u, exchange{routeSignup, "GET", "/v1/activities/9010/signups/1", nil, "", 200, mustConform})                   // HELD, held_until
	d.do(u, exchange{routeActivity, "GET", "/v1/activities/9010", nil, "", 200, mustConform})                           // held 1, hold
	d.do(u, exchange{routeClaim, "POST", "/v1/activities/9010/claims/1?wait=5s", nil, "", 200, mustConform})            // ALREADY_OWNED, HELD
	d.do(u, exchange{routeConfirm, "POST", "/v1/activities/9010/signups/1/confirm?wait=5s", nil, "", 200, mustConform}) // CONFIRMED
	d.do(u, exchange{routeConfirm, "POST", "/v1/activities/9010/signups/1/confirm", nil, "", 202, mustConform})         // ALREADY_CONFIRMED, later
	d.do(u, exchange{routeConfirm, "POST", "/v1/activities/9010/signups/2/confirm?wait=5s", nil, "", 200, mustConform}) // NOT_HELD
	d.do(u, exchange{routeConfirm, "POST", "/v1/activities/9003/signups/5/confirm", key, "", 422, mustConform})         // key bound to a join
	d.do(u, exchange{routeActivity, "PUT", "/v1/activities/9011?wait=5s", nil, `{"capacity": 1, "hold": "100ms"}`, 200, mustConform})
	var heldJoin struct {
		HeldUntil time.Time `json:"held_until"`
	}
	if err := json.Unmarshal(d.do(u, exchange{routeSignup, "POST", "/v1/activities/9011/signups/1?wait=5s", nil, "", 200, mustConform}), &heldJoin); err != nil || heldJoin.HeldUntil.IsZero() {
		t.Fatalf("a join under a hold answered no held_until (%v)", err)
	}
	time.Sleep(time.Until(heldJoin.HeldUntil.Add(10 * time.Millisecond)))
	d.do(u, exchange{routeConfirm, "POST", "/v1/activities/9011/signups/1/confirm?wait=5s", nil, "", 200, mustConform}) // HOLD_EXPIRED: an expired event
	d.do(u, exchange{"/healthz", "GET", "/healthz", nil, "", 200, mustConform})                                         //
	d.do(u, exchange{"/readyz", "GET", "/readyz", nil, "", 200, mustConform})                                           //
	d.do(u, exchange{"/metrics", "GET", "/metrics", nil, "", 200, mustConform})                                         //

	// Bad input: 400, and the spec refuses the request as well.
	for _, x := range []exchange{
		{routeActivity, "PUT", "/v1/activities/0", nil, cap1, 400, mustNotConform},
		{routeActivity, "PUT", "/v1/activities/1", nil, `{"capacity": -5}`, 400, mustNotConform},
		{routeActivity, "PUT", "/v1/activities/1", nil, `{"capacity": 10000001}`, 400, mustNotConform},
		{routeActivity, "PUT", "/v1/activities/1", nil, `{"capacity": 1, "extra": 2}`, 400, mustNotConform},
		{routeActivity, "PUT", "/v1/activities/1", nil, `{"capacity": 1.5}`, 400, mustNotConform},
		{routeActivity, "PUT", "/v1/activities/1?wait=-1s", nil, cap1, 400, mustNotConform},
		{routeActivity, "PUT", "/v1/activities/1", nil, `{"capacity": 1, "hold": "-1s"}`, 400, mustNotConform},
		{routeActivity, "PUT", "/v1/activities/1", nil, `{"capacity": 1, "hold": "ten minutes"}`, 400, mustNotConform},
		{routeActivity, "PUT", "/v1/activities/1", nil, `{"capacity": 1, "hold": 600}`, 400, mustNotConform},
		{routeActivity, "PUT", "/v1/activities/1", nil, `{"capacity": 1, "hold": "200h"}`, 400, either}, // above 168h: the spec says so in words
		{routeConfirm, "POST", "/v1/activities/1/signups/0/confirm", nil, "", 400, mustNotConform},
		{routeConfirm, "POST", "/v1/activities/1/signups/1/confirm?wait=x", nil, "", 400, mustNotConform},
		{routeActivity, "GET", "/v1/activities/abc", nil, "", 400, mustNotConform},
		{routeSignup, "POST", "/v1/activities/1/signups/0", nil, "", 400, mustNotConform},
		{routeSignup, "POST", "/v1/activities/1/signups/1?wait=soon", nil, "", 400, mustNotConform},
		{routeSignup, "DELETE", "/v1/activities/x/signups/1", nil, "", 400, mustNotConform},
		{routeSignup, "GET", "/v1/activities/1/signups/-1", nil, "", 400, mustNotConform},
		{routeClaim, "POST", "/v1/activities/1/claims/1", map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, "", 400, mustNotConform},
		{routeRequest, "GET", "/v1/requests/not-a-uuid", nil, "", 400, mustNotConform},
		{routeRequest, "GET", "/v1/requests/" + uuid.NewString() + "?wait=x", nil, "", 400, mustNotConform},
		{routeLive, "GET", "/v1/activities/0/live", nil, "", 400, mustNotConform},
		// Unknown and wrong: 404 and 405.
		{routeActivity, "GET", "/v1/activities/424242", nil, "", 404, mustConform},
		{routeSignup, "GET", "/v1/activities/9001/signups/99", nil, "", 404, mustConform},
		{routeRequest, "GET", "/v1/requests/" + uuid.NewString(), nil, "", 404, mustConform},
		{"", "GET", "/v1/nothing-here", nil, "", 404, mustNotConform},
		{routeActivity, "PATCH", "/v1/activities/1", nil, cap1, 405, mustNotConform},
		{routeClaim, "DELETE", "/v1/activities/1/claims/1", nil, "", 405, mustNotConform},
		{routeConfirm, "GET", "/v1/activities/1/signups/1/confirm", nil, "", 405, mustNotConform},
		{routeRequest, "POST", "/v1/requests/" + uuid.NewString(), nil, "", 405, mustNotConform},
		// Too large.
		{routeActivity, "PUT", "/v1/activities/1", nil, big, 413, either},
		{routeSignup, "POST", "/v1/activities/1/signups/1", nil, big, 413, either},
		{routeSignup, "DELETE", "/v1/activities/1/signups/1", nil, big, 413, either},
		{routeClaim, "POST", "/v1/activities/1/claims/1", nil, big, 413, either},
		{routeConfirm, "POST", "/v1/activities/1/signups/1/confirm", nil, big, 413, either},
	} {
		d.do(u, x)
	}

	// The live feed: its headers, then hang up.
	func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		x := exchange{routeLive, "GET", "/v1/activities/9001/live", nil, "", 200, mustConform}
		req := d.request(u, x).WithContext(ctx)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("live feed: status %d", resp.StatusCode)
		}
		d.check(x, resp, nil)
	}()

	// An instance with a write rate of (nearly) zero: one write, then 429s.
	limited, _ := startIngest(t, st.DB.DSN, st.NS, func(c *ingest.Config, d *ingest.Deps) { c.RateLimit = 0.001 })
	d.do(limited, exchange{routeActivity, "PUT", "/v1/activities/777", nil, cap1, 202, mustConform})
	d.do(limited, exchange{routeActivity, "PUT", "/v1/activities/777", nil, cap1, 429, mustConform})
	d.do(limited, exchange{routeSignup, "POST", "/v1/activities/777/signups/1", nil, "", 429, mustConform})
	d.do(limited, exchange{routeSignup, "DELETE", "/v1/activities/777/signups/1", nil, "", 429, mustConform})
	d.do(limited, exchange{routeClaim, "POST", "/v1/activities/777/claims/1", nil, "", 429, mustConform})
	d.do(limited, exchange{routeConfirm, "POST", "/v1/activities/777/signups/1/confirm", nil, "", 429, mustConform})

	// An instance on a NATS server no allocator reads: its requests stay
	// pending; then that server stops (503 on writes and /readyz) and its
	// database handle closes (503 on reads).
	lonelyNS := natstest.New(t)
	lonelyNS.Setup(t, config.Defaults[bus.Config]())
	lonely, closeDB := startIngest(t, st.DB.DSN, lonelyNS, func(c *ingest.Config, d *ingest.Deps) { c.PublishTimeout = 500 * time.Millisecond; c.Shed = false })
	pending := d.do(lonely, exchange{routeActivity, "PUT", "/v1/activities/8001", nil, cap1, 202, mustConform})
	pid := requestID(t, pending)
	d.do(lonely, exchange{routeRequest, "GET", "/v1/requests/" + pid, nil, "", 200, mustConform})
	d.do(lonely, exchange{routeRequest, "GET", "/v1/requests/" + pid + "?wait=100ms", nil, "", 200, mustConform})
	lonelyNS.Stop()
	testenv.WaitFor(t, 10*time.Second, "/readyz answers 503 after NATS stopped", func() bool {
		resp, err := http.Get(lonely + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	d.do(lonely, exchange{"/readyz", "GET", "/readyz", nil, "", 503, mustConform})
	d.do(lonely, exchange{routeActivity, "PUT", "/v1/activities/8001", nil, cap1, 503, mustConform})
	d.do(lonely, exchange{routeSignup, "POST", "/v1/activities/8001/signups/1", nil, "", 503, mustConform})
	d.do(lonely, exchange{routeSignup, "DELETE", "/v1/activities/8001/signups/1", nil, "", 503, mustConform})
	d.do(lonely, exchange{routeClaim, "POST", "/v1/activities/8001/claims/1", nil, "", 503, mustConform})
	d.do(lonely, exchange{routeConfirm, "POST", "/v1/activities/8001/signups/1/confirm", nil, "", 503, mustConform})
	closeDB()
	d.do(lonely, exchange{routeActivity, "GET", "/v1/activities/9001", nil, "", 503, mustConform})
	d.do(lonely, exchange{routeSignup, "GET", "/v1/activities/9001/signups/2", nil, "", 503, mustConform})
	d.do(lonely, exchange{routeRequest, "GET", "/v1/requests/" + pid, nil, "", 503, mustConform})

	// An instance that requires bearer tokens: 401 without one, 403 with
	// one that may not do the thing; the right token passes.
	const hsKey = "openapi-test-hs256-key-0123456789abcdef"
	v, err := auth.New(auth.Config{HS256Key: []byte(hsKey)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	secured, _ := startIngest(t, st.DB.DSN, st.NS, func(c *ingest.Config, d *ingest.Deps) { d.Verifier = v; c.BadAuthRate = -1 })
	token := func(sub string, scopes ...string) map[string]string {
		tok, err := auth.MintHS256([]byte(hsKey), auth.Claims{Subject: sub, Scopes: scopes})
		if err != nil {
			t.Fatal(err)
		}
		return map[string]string{"Authorization": "Bearer " + tok}
	}
	user3 := token("3")
	for _, x := range []exchange{
		{routeActivity, "PUT", "/v1/activities/9005", nil, cap1, 401, mustConform},
		{routeActivity, "PUT", "/v1/activities/9005", user3, cap1, 403, mustConform},
		{routeActivity, "GET", "/v1/activities/9001", nil, "", 401, mustConform},
		{routeActivity, "GET", "/v1/activities/9001", user3, "", 200, mustConform},
		{routeSignup, "POST", "/v1/activities/9001/signups/4", nil, "", 401, mustConform},
		{routeSignup, "POST", "/v1/activities/9001/signups/4", user3, "", 403, mustConform},
		{routeSignup, "DELETE", "/v1/activities/9001/signups/4", nil, "", 401, mustConform},
		{routeSignup, "DELETE", "/v1/activities/9001/signups/4", user3, "", 403, mustConform},
		{routeSignup, "GET", "/v1/activities/9001/signups/2", nil, "", 401, mustConform},
		{routeSignup, "GET", "/v1/activities/9001/signups/2", user3, "", 403, mustConform},
		{routeSignup, "GET", "/v1/activities/9001/signups/2", token("2"), "", 200, mustConform},
		{routeClaim, "POST", "/v1/activities/9001/claims/4", nil, "", 401, mustConform},
		{routeClaim, "POST", "/v1/activities/9001/claims/4", user3, "", 403, mustConform},
		{routeConfirm, "POST", "/v1/activities/9001/signups/4/confirm", nil, "", 401, mustConform},
		{routeConfirm, "POST", "/v1/activities/9001/signups/4/confirm", user3, "", 403, mustConform},
		{routeRequest, "GET", "/v1/requests/" + requestID(t, ack), nil, "", 401, mustConform},
		{routeRequest, "GET", "/v1/requests/" + requestID(t, ack), user3, "", 404, mustConform}, // an admin's open
		{routeRequest, "GET", "/v1/requests/" + requestID(t, ack), token("1", "allot:admin"), "", 200, mustConform},
		{routeLive, "GET", "/v1/activities/9001/live", nil, "", 401, mustConform},
		{routeLive, "GET", "/v1/activities/9001/live?access_token=x", nil, "", 401, mustConform},
		{routeLive, "GET", "/v1/activities/9001/live", user3, "", 403, mustConform},
		{"/metrics", "GET", "/metrics", nil, "", 401, mustConform},
		{"/metrics", "GET", "/metrics", user3, "", 403, mustConform},
		{"/metrics", "GET", "/metrics", token("ops", "allot:operator"), "", 200, mustConform},
		{"/healthz", "GET", "/healthz", nil, "", 200, mustConform},
		{"/readyz", "GET", "/readyz", nil, "", 200, mustConform},
	} {
		d.do(secured, x)
	}
	// An instance with a read rate of (nearly) zero per caller: one read,
	// then 429s.
	slowReads, _ := startIngest(t, st.DB.DSN, st.NS, func(c *ingest.Config, d *ingest.Deps) { d.Verifier = v; c.BadAuthRate = -1; c.ReadRate = 0.001 })
	user2 := token("2")
	d.do(slowReads, exchange{routeActivity, "GET", "/v1/activities/9001", user2, "", 200, mustConform})
	d.do(slowReads, exchange{routeActivity, "GET", "/v1/activities/9001", user2, "", 429, mustConform})
	d.do(slowReads, exchange{routeSignup, "GET", "/v1/activities/9001/signups/2", user2, "", 429, mustConform})

	// Every declared response was seen, but the one a test cannot bring
	// about cheaply.
	notExercised := map[string]string{
		"GET " + routeLive + " 503": "needs ui.Config's limit of open feeds reached",
	}
	for _, op := range sp.operations() {
		if !d.covered[op] && notExercised[op] == "" {
			t.Errorf("the spec declares %s, but the test never saw it", op)
		}
	}

	// The messages the allocator published along the way.
	checkEvents(t, sp, st.JS)
	resultsMu.Lock()
	defer resultsMu.Unlock()
	n := 0
	for _, data := range results {
		var b struct {
			Results []json.RawMessage `json:"results"`
		}
		if err := json.Unmarshal(data, &b); err != nil {
			t.Fatalf("%s: %v", wire.ResultSubject, err)
		}
		for _, r := range b.Results {
			sp.validate(t, "Result", r, "a result on "+wire.ResultSubject)
			n++
		}
	}
	if n == 0 {
		t.Error("no result was published on " + wire.ResultSubject)
	}
}

// checkEvents validates every message in ALLOT_EVENTS against the Event
// schema, and that every event kind the spec names was seen.
func checkEvents(t *testing.T, sp *spec, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, wire.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("event %d: %v", seq, err)
		}
		sp.validate(t, "Event", m.Data, "event on "+m.Subject)
		var e wire.Event
		if err := json.Unmarshal(m.Data, &e); err != nil {
			t.Fatal(err)
		}
		if m.Header.Get("Nats-Msg-Id") != e.EventID {
			t.Errorf("event %s: Nats-Msg-Id %q", e.EventID, m.Header.Get("Nats-Msg-Id"))
		}
		kinds[string(e.Kind)] = true
	}
	for _, k := range sp.schema(t, "EventKind").Enum {
		if !kinds[k.Value] {
			t.Errorf("no %q event was published, so its shape was not checked", k.Value)
		}
	}
}
