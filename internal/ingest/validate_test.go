package ingest

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

func TestBadInputIsRejectedAndNeverPublished(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)

	const (
		okUUID = "0190f5e2-7c4a-7b3e-8f00-3c1d2e4f5a6b"
		open   = `{"capacity": 10}`
	)
	big := strings.Repeat("x", 64<<10+1)
	bigJSON := `{"capacity": 1` + strings.Repeat(" ", 64<<10) + `}`
	badIDs := []string{"0", "-1", "abc", "9223372036854775808", "1.5", "+1", "1e3", "%20", "99999999999999999999999"}

	type tc struct {
		name      string
		req       req
		want      int
		wantAllow string
	}
	var tests []tc
	for _, id := range badIDs {
		tests = append(tests,
			tc{name: "open bad activity " + id, req: req{method: "PUT", path: "/v1/activities/" + id, body: open}, want: 400},
			tc{name: "state bad activity " + id, req: req{method: "GET", path: "/v1/activities/" + id}, want: 400},
			tc{name: "join bad activity " + id, req: req{method: "POST", path: "/v1/activities/" + id + "/signups/1"}, want: 400},
			tc{name: "join bad user " + id, req: req{method: "POST", path: "/v1/activities/1/signups/" + id}, want: 400},
			tc{name: "cancel bad activity " + id, req: req{method: "DELETE", path: "/v1/activities/" + id + "/signups/1"}, want: 400},
			tc{name: "cancel bad user " + id, req: req{method: "DELETE", path: "/v1/activities/1/signups/" + id}, want: 400},
			tc{name: "signup bad activity " + id, req: req{method: "GET", path: "/v1/activities/" + id + "/signups/1"}, want: 400},
			tc{name: "signup bad user " + id, req: req{method: "GET", path: "/v1/activities/1/signups/" + id}, want: 400},
			tc{name: "claim bad activity " + id, req: req{method: "POST", path: "/v1/activities/" + id + "/claims/1"}, want: 400},
			tc{name: "claim bad user " + id, req: req{method: "POST", path: "/v1/activities/1/claims/" + id}, want: 400},
			tc{name: "confirm bad activity " + id, req: req{method: "POST", path: "/v1/activities/" + id + "/signups/1/confirm"}, want: 400},
			tc{name: "confirm bad user " + id, req: req{method: "POST", path: "/v1/activities/1/signups/" + id + "/confirm"}, want: 400},
		)
	}
	tests = append(tests, []tc{
		// capacity
		{name: "negative capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": -1}`}, want: 400},
		{name: "capacity above max", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 10000001}`}, want: 400},
		{name: "huge capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 99999999999999999999999}`}, want: 400},
		{name: "fractional capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 1.5}`}, want: 400},
		{name: "integral float capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 1.0}`}, want: 400},
		{name: "exponent capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 1e3}`}, want: 400},
		{name: "string capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": "5"}`}, want: 400},
		{name: "boolean capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": true}`}, want: 400},
		{name: "null capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": null}`}, want: 400},
		{name: "missing capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{}`}, want: 400},
		{name: "unknown field", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5, "colour": "red"}`}, want: 400},
		{name: "bad JSON", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": `}, want: 400},
		{name: "empty body", req: req{method: "PUT", path: "/v1/activities/1"}, want: 400},
		{name: "array body", req: req{method: "PUT", path: "/v1/activities/1", body: `[10]`}, want: 400},
		{name: "trailing data", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5} {"capacity": 6}`}, want: 400},
		// hold
		{name: "negative hold", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5, "hold": "-1s"}`}, want: 400},
		{name: "hold above max", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5, "hold": "168h0m1s"}`}, want: 400},
		{name: "hold of a year", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5, "hold": "8760h"}`}, want: 400},
		{name: "unparsable hold", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5, "hold": "ten minutes"}`}, want: 400},
		{name: "hold without unit", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5, "hold": "600"}`}, want: 400},
		{name: "empty hold", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5, "hold": ""}`}, want: 400},
		{name: "numeric hold", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5, "hold": 600}`}, want: 400},
		{name: "null hold", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5, "hold": null}`}, want: 400},
		{name: "object hold", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 5, "hold": {"m": 10}}`}, want: 400},
		{name: "hold without capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{"hold": "10m"}`}, want: 400},
		{name: "good hold, bad capacity", req: req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": -1, "hold": "10m"}`}, want: 400},
		// body size
		{name: "oversize open", req: req{method: "PUT", path: "/v1/activities/1", body: bigJSON}, want: 413},
		{name: "oversize join", req: req{method: "POST", path: "/v1/activities/1/signups/2", body: big}, want: 413},
		{name: "oversize cancel", req: req{method: "DELETE", path: "/v1/activities/1/signups/2", body: big}, want: 413},
		{name: "oversize claim", req: req{method: "POST", path: "/v1/activities/1/claims/2", body: big}, want: 413},
		{name: "oversize confirm", req: req{method: "POST", path: "/v1/activities/1/signups/2/confirm", body: big}, want: 413},
		{name: "oversize chunked join", req: req{method: "POST", path: "/v1/activities/1/signups/2", reader: io.MultiReader(strings.NewReader(big))}, want: 413},
		{name: "oversize chunked open", req: req{method: "PUT", path: "/v1/activities/1", reader: io.MultiReader(strings.NewReader(bigJSON))}, want: 413},
		// routes
		{name: "root", req: req{method: "GET", path: "/"}, want: 404},
		{name: "unknown prefix", req: req{method: "GET", path: "/v2/activities/1"}, want: 404},
		{name: "activities list", req: req{method: "GET", path: "/v1/activities/"}, want: 404},
		{name: "activities no slash", req: req{method: "GET", path: "/v1/activities"}, want: 404},
		{name: "signups list", req: req{method: "GET", path: "/v1/activities/1/signups"}, want: 404},
		{name: "signups empty user", req: req{method: "POST", path: "/v1/activities/1/signups/"}, want: 404},
		{name: "unknown kind", req: req{method: "POST", path: "/v1/activities/1/tickets/2"}, want: 404},
		{name: "too deep", req: req{method: "POST", path: "/v1/activities/1/signups/2/x"}, want: 404},
		{name: "below confirm", req: req{method: "POST", path: "/v1/activities/1/signups/2/confirm/x"}, want: 404},
		{name: "confirm of a claim", req: req{method: "POST", path: "/v1/activities/1/claims/2/confirm"}, want: 404},
		{name: "requests list", req: req{method: "GET", path: "/v1/requests/"}, want: 404},
		{name: "unclean path", req: req{method: "GET", path: "//v1/activities/1"}, want: 404},
		// methods
		{name: "POST activity", req: req{method: "POST", path: "/v1/activities/1", body: open}, want: 405, wantAllow: "PUT, GET, HEAD"},
		{name: "DELETE activity", req: req{method: "DELETE", path: "/v1/activities/1"}, want: 405, wantAllow: "PUT, GET, HEAD"},
		{name: "PATCH signup", req: req{method: "PATCH", path: "/v1/activities/1/signups/2"}, want: 405, wantAllow: "POST, DELETE, GET, HEAD"},
		{name: "PUT signup", req: req{method: "PUT", path: "/v1/activities/1/signups/2"}, want: 405, wantAllow: "POST, DELETE, GET, HEAD"},
		{name: "GET claim", req: req{method: "GET", path: "/v1/activities/1/claims/2"}, want: 405, wantAllow: "POST"},
		{name: "DELETE claim", req: req{method: "DELETE", path: "/v1/activities/1/claims/2"}, want: 405, wantAllow: "POST"},
		{name: "GET confirm", req: req{method: "GET", path: "/v1/activities/1/signups/2/confirm"}, want: 405, wantAllow: "POST"},
		{name: "PUT confirm", req: req{method: "PUT", path: "/v1/activities/1/signups/2/confirm"}, want: 405, wantAllow: "POST"},
		{name: "DELETE confirm", req: req{method: "DELETE", path: "/v1/activities/1/signups/2/confirm"}, want: 405, wantAllow: "POST"},
		{name: "POST request", req: req{method: "POST", path: "/v1/requests/" + okUUID}, want: 405, wantAllow: "GET, HEAD"},
		{name: "POST healthz", req: req{method: "POST", path: "/healthz"}, want: 405, wantAllow: "GET, HEAD"},
		{name: "PUT readyz", req: req{method: "PUT", path: "/readyz"}, want: 405, wantAllow: "GET, HEAD"},
		{name: "DELETE metrics", req: req{method: "DELETE", path: "/metrics"}, want: 405, wantAllow: "GET, HEAD"},
		// wait
		{name: "join negative wait", req: req{method: "POST", path: "/v1/activities/1/signups/2?wait=-1s"}, want: 400},
		{name: "join unparsable wait", req: req{method: "POST", path: "/v1/activities/1/signups/2?wait=abc"}, want: 400},
		{name: "join wait without unit", req: req{method: "POST", path: "/v1/activities/1/signups/2?wait=5"}, want: 400},
		{name: "join empty wait", req: req{method: "POST", path: "/v1/activities/1/signups/2?wait="}, want: 400},
		{name: "cancel bad wait", req: req{method: "DELETE", path: "/v1/activities/1/signups/2?wait=abc"}, want: 400},
		{name: "claim bad wait", req: req{method: "POST", path: "/v1/activities/1/claims/2?wait=-1s"}, want: 400},
		{name: "confirm bad wait", req: req{method: "POST", path: "/v1/activities/1/signups/2/confirm?wait=soon"}, want: 400},
		{name: "open bad wait", req: req{method: "PUT", path: "/v1/activities/1?wait=abc", body: open}, want: 400},
		{name: "poll negative wait", req: req{method: "GET", path: "/v1/requests/" + okUUID + "?wait=-1s"}, want: 400},
		{name: "poll unparsable wait", req: req{method: "GET", path: "/v1/requests/" + okUUID + "?wait=abc"}, want: 400},
		{name: "bad query string", req: req{method: "POST", path: "/v1/activities/1/signups/2?wait=%zz"}, want: 400},
		// request ids
		{name: "poll not a uuid", req: req{method: "GET", path: "/v1/requests/not-a-uuid"}, want: 400},
		{name: "poll 36 chars not a uuid", req: req{method: "GET", path: "/v1/requests/zzzzzzzz-7c4a-7b3e-8f00-3c1d2e4f5a6b"}, want: 400},
		{name: "poll uuid without dashes", req: req{method: "GET", path: "/v1/requests/0190f5e27c4a7b3e8f003c1d2e4f5a6b"}, want: 400},
		// idempotency keys
		{name: "key too long", req: req{method: "POST", path: "/v1/activities/1/signups/2", header: map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}}, want: 400},
		{name: "key with a tab", req: req{method: "POST", path: "/v1/activities/1/claims/2", header: map[string]string{"Idempotency-Key": "a\tb"}}, want: 400},
		{name: "confirm key too long", req: req{method: "POST", path: "/v1/activities/1/signups/2/confirm", header: map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}}, want: 400},
		{name: "key not ASCII", req: req{method: "PUT", path: "/v1/activities/1", body: open, header: map[string]string{"Idempotency-Key": "clé"}}, want: 400},
	}...)

	for _, tt := range tests {
		resp, body := h.do(tt.req)
		what := tt.name + " (" + tt.req.method + " " + tt.req.path + ")"
		if len(what) > 120 {
			what = what[:120]
		}
		wantStatus(t, what, resp, body, tt.want)
		errorSentence(t, what, resp, body)
		if got := resp.Header.Get("Allow"); got != tt.wantAllow {
			t.Errorf("%s: Allow = %q, want %q", what, got, tt.wantAllow)
		}
	}

	// An empty Idempotency-Key header is present but invalid; net/http's
	// client drops empty headers, so send it raw.
	r, _ := http.NewRequest("POST", h.srv.URL+"/v1/activities/1/signups/2", nil)
	r.Header["Idempotency-Key"] = []string{""}
	resp, err := h.cl.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantStatus(t, "empty Idempotency-Key", resp, body, 400)
	errorSentence(t, "empty Idempotency-Key", resp, body)

	if n := natstest.StreamMsgs(t, h.js, wire.RequestStream); n != 0 {
		t.Fatalf("%s holds %d messages after only bad input, want 0", wire.RequestStream, n)
	}
}

func TestParseOpenAcceptsTheRange(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		body     string
		want     int64
		wantHold time.Duration
	}{
		{name: "zero", body: `{"capacity":0}`, want: 0},
		{name: "max", body: `{"capacity":10000000}`, want: 10_000_000},
		{name: "spaces", body: " {\n \"capacity\" : 42 }\n", want: 42},
		{name: "hold", body: `{"capacity": 3, "hold": "10m"}`, want: 3, wantHold: 10 * time.Minute},
		{name: "hold first", body: `{"hold": "1h30m", "capacity": 3}`, want: 3, wantHold: 90 * time.Minute},
		{name: "zero hold", body: `{"capacity": 3, "hold": "0"}`, want: 3},
		{name: "zero hold with a unit", body: `{"capacity": 3, "hold": "0s"}`, want: 3},
		{name: "max hold", body: `{"capacity": 3, "hold": "168h"}`, want: 3, wantHold: wire.MaxHold},
		{name: "tiny hold", body: `{"capacity": 3, "hold": "1ms"}`, want: 3, wantHold: time.Millisecond},
	}
	for _, tt := range tests {
		got, hold, err := parseOpen([]byte(tt.body))
		if err != nil || got != tt.want || hold != tt.wantHold {
			t.Errorf("%s: parseOpen(%s) = %d, %s, %v; want %d, %s", tt.name, tt.body, got, hold, err, tt.want, tt.wantHold)
		}
	}
}

func TestParseWait(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		query   string
		want    string
		wantErr bool
	}{
		{name: "absent", query: "", want: "0s"},
		{name: "other parameter", query: "x=1", want: "0s"},
		{name: "zero", query: "wait=0", want: "0s"},
		{name: "two seconds", query: "wait=2s", want: "2s"},
		{name: "capped", query: "wait=1h", want: "30s"},
		{name: "exactly max", query: "wait=30s", want: "30s"},
		{name: "negative", query: "wait=-1ms", wantErr: true},
		{name: "unparsable", query: "wait=soon", wantErr: true},
		{name: "twice", query: "wait=1s&wait=2s", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseWait(tt.query, MaxWait)
		if (err != nil) != tt.wantErr || (!tt.wantErr && got.String() != tt.want) {
			t.Errorf("%s: parseWait(%q) = %s, %v; want %s, error %t", tt.name, tt.query, got, err, tt.want, tt.wantErr)
		}
	}
}
