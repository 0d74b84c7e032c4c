package tracing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/notifier"
	"github.com/allot-dev/allot/internal/stacktest"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/tracing"
	"github.com/allot-dev/allot/internal/wire"
)

// The tests of this package switch the global tracer provider: none runs
// in parallel.

// traced installs a tracer provider recording into an in-memory exporter
// until t ends.
func traced(t *testing.T) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	restore := tracing.Use(tp)
	t.Cleanup(func() {
		restore()
		tp.Shutdown(context.Background()) //nolint:errcheck
	})
	return exp
}

// post sends a write with ?wait and returns the decoded final result.
func post(t *testing.T, method, url string) map[string]any {
	t.Helper()
	req, err := http.NewRequest(method, url+"?wait=10s", strings.NewReader(`{"capacity": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || resp.StatusCode != http.StatusOK || m["state"] != wire.StateDone {
		t.Fatalf("%s %s: %d %s, want 200 done", method, url, resp.StatusCode, b)
	}
	return m
}

// requestHeaders returns the headers of the request message at seq.
func requestHeaders(t *testing.T, st *stacktest.Stack, seq uint64) map[string][]string {
	t.Helper()
	s, err := st.JS.Stream(context.Background(), wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	return m.Header
}

// webhooks is a webhook receiver recording the traceparent of each call.
type webhooks struct {
	mu      sync.Mutex
	parents []string
}

func (w *webhooks) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body) //nolint:errcheck
	w.mu.Lock()
	w.parents = append(w.parents, r.Header.Get("traceparent"))
	w.mu.Unlock()
	rw.WriteHeader(http.StatusNoContent)
}

func (w *webhooks) got(traceID string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.parents {
		if strings.Contains(p, "-"+traceID+"-") {
			return true
		}
	}
	return false
}

// TestOneJoinIsOneTrace follows a join through HTTP: ingest's request
// span, its publish, the allocator's batch, transaction, commit and
// decision, the relay's publish of the event and the notifier's webhook
// call are all in one trace, each under the span that caused it.
func TestOneJoinIsOneTrace(t *testing.T) {
	exp := traced(t)
	st := stacktest.Start(t, config.Defaults[allocator.Config](), stacktest.IngestConfig(), ingest.Deps{})
	hooks := &webhooks{}
	hook := httptest.NewServer(hooks)
	t.Cleanup(hook.Close)
	nc, _ := st.NS.Connect(t)
	ncfg := config.Defaults[notifier.Config]()
	ncfg.URL, ncfg.Filter = notifier.SecretURL(hook.URL), wire.EventSubjectPrefix+">"
	n, err := notifier.New(ncfg, notifier.Deps{NC: nc, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop(); n.Wait() }) //nolint:errcheck

	post(t, http.MethodPut, st.URL+"/v1/activities/7")
	res := post(t, http.MethodPost, st.URL+"/v1/activities/7/signups/1")
	if res["outcome"] != string(wire.OutcomeConfirmed) {
		t.Fatalf("join: %v", res)
	}

	const route = "POST /v1/activities/{activity}/signups/{user}"
	var root tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == route && s.SpanKind == trace.SpanKindServer {
			root = s
		}
	}
	if !root.SpanContext.IsValid() {
		t.Fatalf("no server span named %q among %v", route, names(exp.GetSpans()))
	}
	tid := root.SpanContext.TraceID()
	if tp := requestHeaders(t, st, uint64(res["seq"].(float64)))["traceparent"]; len(tp) != 1 || !strings.Contains(tp[0], tid.String()) {
		t.Fatalf("request message traceparent %q, want one of trace %s", tp, tid)
	}

	// The chain, each span the child of the one before it is listed with.
	chain := []struct{ name, parent string }{
		{"publish " + wire.RequestStream, route},
		{"allocator batch", "publish " + wire.RequestStream},
		{"allocator transaction", "allocator batch"},
		{"mysql commit", "allocator transaction"},
		{"allocator decide", "publish " + wire.RequestStream},
		{"publish " + wire.EventStream, "allocator decide"},
		{"deliver " + wire.EventSubject(7, wire.EventConfirmed), "publish " + wire.EventStream},
		{"webhook POST", "deliver " + wire.EventSubject(7, wire.EventConfirmed)},
	}
	deliver := "deliver " + wire.EventSubject(7, wire.EventConfirmed)
	var inTrace []tracetest.SpanStub
	testenv.WaitFor(t, 10*time.Second, "the notifier's delivery span", func() bool {
		inTrace = inTrace[:0]
		found := false
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID() == tid {
				inTrace = append(inTrace, s)
				found = found || s.Name == deliver // it ends last, after the webhook call
			}
		}
		return found
	})
	byID := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range inTrace {
		byID[s.SpanContext.SpanID()] = s
	}
	for _, c := range chain {
		ok := false
		for _, s := range inTrace {
			ok = ok || (s.Name == c.name && byID[s.Parent.SpanID()].Name == c.parent)
		}
		if !ok {
			t.Errorf("trace %s has no span %q under a span %q", tid, c.name, c.parent)
		}
	}
	for _, s := range inTrace {
		if s.Name != "allocator decide" {
			continue
		}
		if len(s.Links) != 1 || byID[s.Links[0].SpanContext.SpanID()].Name != "allocator transaction" {
			t.Errorf("decision links %v, want the transaction's span", s.Links)
		}
	}
	if t.Failed() {
		for _, s := range inTrace {
			t.Logf("%s %s under %s", s.Name, s.SpanContext.SpanID(), s.Parent.SpanID())
		}
	}
	if !hooks.got(tid.String()) {
		t.Errorf("the webhook call carried no traceparent of trace %s", tid)
	}
}

// TestOffInjectsNothing: with tracing off, the request message carries no
// trace context.
func TestOffInjectsNothing(t *testing.T) {
	if tracing.Enabled() {
		t.Fatal("tracing is on before the test")
	}
	st := stacktest.Start(t, config.Defaults[allocator.Config](), stacktest.IngestConfig(), ingest.Deps{})
	post(t, http.MethodPut, st.URL+"/v1/activities/7")
	req, _ := http.NewRequest(http.MethodPost, st.URL+"/v1/activities/7/signups/1?wait=10s", nil)
	// A caller's own trace context is not taken up either.
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var res map[string]any
	json.NewDecoder(resp.Body).Decode(&res) //nolint:errcheck
	resp.Body.Close()
	seq, ok := res["seq"].(float64)
	if !ok {
		t.Fatalf("join: %v", res)
	}
	h := requestHeaders(t, st, uint64(seq))
	for k := range h {
		if strings.EqualFold(k, "traceparent") || strings.EqualFold(k, "tracestate") {
			t.Errorf("request message has header %s=%q with tracing off", k, h[k])
		}
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, fmt.Sprintf("%s(%s)", s.Name, s.SpanContext.TraceID()))
	}
	return out
}
