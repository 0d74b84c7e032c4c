package baseline

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/wire"
)

func TestHandlerClaimRoutes(t *testing.T) {
	_, db := newDB(t, 4)
	h, err := Handler(DesignClaim, db, "")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	do := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatalf("%s %s: answer is not JSON: %s", method, path, data)
		}
		return resp.StatusCode, m
	}
	steps := []struct {
		method, path, body string
		status             int
		outcome            string
	}{
		{"PUT", "/v1/activities/3?wait=10s", `{"capacity": 2}`, 200, string(wire.OutcomeOpened)},
		{"PUT", "/v1/activities/3", `{"capacity": 2}`, 200, string(wire.OutcomeResized)},
		{"POST", "/v1/activities/3/claims/1?wait=30s", "", 200, string(wire.OutcomeGranted)},
		{"POST", "/v1/activities/3/claims/1", "", 200, string(wire.OutcomeAlreadyOwned)},
		{"POST", "/v1/activities/3/claims/2", "", 200, string(wire.OutcomeGranted)},
		{"POST", "/v1/activities/3/claims/3", "", 200, string(wire.OutcomeSoldOut)},
		{"POST", "/v1/activities/x/claims/2", "", 400, ""},
		{"PUT", "/v1/activities/3", `{"capacity": -1}`, 400, ""},
		{"POST", "/v1/activities/3/signups/2", "", 404, ""},
		{"GET", "/v1/activities/4", "", 404, ""},
	}
	for _, s := range steps {
		code, m := do(s.method, s.path, s.body)
		if code != s.status || (s.outcome != "" && m["outcome"] != s.outcome) {
			t.Fatalf("%s %s = %d %v, want %d %s", s.method, s.path, code, m, s.status, s.outcome)
		}
		if code == 200 && (m["state"] != wire.StateDone || m["request_id"] == "") {
			t.Fatalf("%s %s: %v is not a done result", s.method, s.path, m)
		}
		if code != 200 && m["error"] == nil {
			t.Fatalf("%s %s: %v has no error sentence", s.method, s.path, m)
		}
	}
	code, m := do("GET", "/v1/activities/3", "")
	if code != 200 || m["capacity"] != 2.0 || m["confirmed"] != 2.0 || m["remaining"] != 0.0 || m["waiting"] != 0.0 {
		t.Fatalf("GET state = %d %v, want capacity 2, confirmed 2, remaining 0, waiting 0", code, m)
	}
}

func TestHandlerUnknownDesign(t *testing.T) {
	if _, err := Handler("queue", nil, ""); !errors.Is(err, ErrUnknownDesign) {
		t.Fatalf("Handler(queue) = %v, want ErrUnknownDesign", err)
	}
}
