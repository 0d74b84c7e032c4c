package baseline

import (
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/allot-dev/allot/internal/wire"
)

// TestHandlerClaimRoutes: the seed claim and the floor answer the same
// steps alike; the floor without a database.
func TestHandlerClaimRoutes(t *testing.T) {
	t.Run(DesignClaim, func(t *testing.T) {
		_, db := newDB(t, 4)
		testClaimRoutes(t, DesignClaim, db)
	})
	t.Run(DesignFloor, func(t *testing.T) { testClaimRoutes(t, DesignFloor, nil) })
}

func testClaimRoutes(t *testing.T, design string, db *sql.DB) {
	h, err := Handler(design, db, "")
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

// TestFloorSellsEachItemOnce: claims from many goroutines at once get
// exactly the stock, one item per player, and the state counts them.
func TestFloorSellsEachItemOnce(t *testing.T) {
	f := NewFloor()
	if f.Set(7, 100) {
		t.Fatal("Set of a new item reports it existed")
	}
	var (
		mu       sync.Mutex
		outcomes = map[string]int{}
		wg       sync.WaitGroup
	)
	for g := range 50 {
		wg.Go(func() {
			for i := range 40 {
				o := f.Claim(7, int64(1+(g*40+i)%1500)) // 2,000 claims from 1,500 players
				mu.Lock()
				outcomes[o]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if outcomes[string(wire.OutcomeGranted)] != 100 || outcomes[string(wire.OutcomeGranted)]+outcomes[string(wire.OutcomeSoldOut)]+outcomes[string(wire.OutcomeAlreadyOwned)] != 2000 {
		t.Fatalf("outcomes %v, want 100 GRANTED of 2000", outcomes)
	}
	if st, ok := f.State(7); !ok || st.Capacity != 100 || st.Confirmed != 100 || st.Remaining != 0 {
		t.Fatalf("state %+v %v, want 100 confirmed of 100", st, ok)
	}
	if _, ok := f.State(8); ok {
		t.Fatal("an item never set up has a state")
	}
	if f.Claim(8, 1) != string(wire.OutcomeSoldOut) {
		t.Fatal("a claim of an item never set up is not SOLD_OUT")
	}
	if !f.Set(7, 1) || f.Claim(7, 1) != string(wire.OutcomeGranted) {
		t.Fatal("Set does not start the item over")
	}
}
