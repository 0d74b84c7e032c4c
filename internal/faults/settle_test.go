package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/ingest/publish"
	"github.com/allot-dev/allot/internal/wire"
)

// settleWindow is the request stream's duplicate window in these tests:
// short, so that the bound (window + margin) passes quickly.
const settleWindow = 4 * time.Second

// TestScenario13LostPubAckSettles: the broker is frozen (SIGSTOP), a join
// without an Idempotency-Key is posted (503 with a request id: it may be
// stored), the broker is killed (kill -9) before it stored it and started
// again on the same store. The id reads done, REJECTED "never stored" (or
// the applied result, had the broker stored it), on both ingests, within
// the bound publish.VoidAfter(window) after the broker is back, and the
// invariants hold and the audit is clean. In the second variant the ingest
// that issued the id is killed too, and the other ingest's poll settles it;
// in the third the broker stays down past the window, so the issuer's
// republishing gives up and a void is published (the issuer's or a
// poller's, whichever the broker stores first: they are one message).
// A copy the client library buffered before it saw the connection drop
// may still be stored after the restart, ahead of the void: either final
// answer is right, as long as there is one.
func TestScenario13LostPubAckSettles(t *testing.T) {
	for _, v := range []struct {
		name       string
		killIssuer bool
		// downFor keeps the broker down after the kill: past the window,
		// the issuer's republishing gives up and voids the id.
		downFor time.Duration
	}{
		{"issuer-alive", false, 0},
		{"issuer-killed", true, 0},
		{"broker-down-past-the-window", false, settleWindow},
	} {
		killIssuer := v.killIssuer
		t.Run(v.name, func(t *testing.T) {
			s := newStack(t, stackConfig{ingestEnv: []string{"ALLOT_INGEST_PUBLISH_TIMEOUT=1s"}})
			ctx := context.Background()
			s.openActivities([]activity{{id: 1, capacity: 10}})

			// A short duplicate window (an operator's setting the binaries
			// keep), read by the ingests at start.
			st, err := s.js.Stream(ctx, wire.RequestStream)
			s.must(err)
			cfg := st.CachedInfo().Config
			cfg.Duplicates = settleWindow
			_, err = s.js.UpdateStream(ctx, cfg)
			s.must(err)
			s.must(s.ingest.stop(30 * time.Second))
			s.must(s.startIngest())
			other := s.secondIngest()

			s.must(s.natsd.signal(syscall.SIGSTOP))
			code, id, body := s.post(s.ingestURL, "/v1/activities/1/signups/42")
			if code != http.StatusServiceUnavailable || id == "" {
				s.natsd.signal(syscall.SIGCONT) //nolint:errcheck
				t.Fatalf("join while the broker is frozen: %d %s, want 503 with a request_id", code, body)
			}
			if killIssuer {
				s.must(s.ingest.kill())
				s.killedForGood[s.ingest] = true
			}
			s.must(s.natsd.kill()) // SIGKILL ends a stopped process too
			time.Sleep(v.downFor)
			s.must(s.startNATS())
			back := time.Now()

			bound := publish.VoidAfter(settleWindow)
			urls := []string{other}
			if !killIssuer {
				urls = append(urls, s.ingestURL)
			}
			var final map[string]any
			for _, u := range urls {
				// The bound runs from the id's time; the broker's restart
				// and the ingests' reconnection come on top.
				r := s.pollDone(u, id, bound+30*time.Second)
				if final == nil {
					final = r
				} else if !sameResult(final, r) {
					t.Errorf("%s answers %v, another ingest %v", u, r, final)
				}
			}
			t.Logf("id %s done %s after the broker came back: %v", id, time.Since(back).Round(10*time.Millisecond), final)
			if final["outcome"] == string(wire.OutcomeRejected) {
				if final["reason"] != wire.ReasonNeverStored || final["op"] != string(wire.OpVoid) {
					t.Errorf("REJECTED without the void's reason: %v", final)
				}
			} else if final["op"] != string(wire.OpJoin) || final["outcome"] != string(wire.OutcomeConfirmed) {
				t.Errorf("final result %v, want REJECTED %q or the join's CONFIRMED", final, wire.ReasonNeverStored)
			}

			s.db.CheckInvariants(t)
			s.db.CheckEffects(t)
			rep, err := audit.Run(ctx, audit.Config{}, audit.Deps{DB: s.db.DB, JS: s.js})
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range rep.Divergences {
				t.Errorf("audit divergence: %+v", d)
			}
			if n := s.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", id); n != 1 {
				t.Errorf("%d results for the id, want 1", n)
			}
			s.shutdown()
		})
	}
}

// secondIngest starts another ingest on the stack's database and broker
// and returns its URL.
func (s *stack) secondIngest() string {
	s.t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(s.t))
	env := slices.Clone(s.ingest.env[len(baseEnv()):])
	for i, e := range env {
		if strings.HasPrefix(e, "ALLOT_HTTP_ADDR=") {
			env[i] = "ALLOT_HTTP_ADDR=" + addr
		}
	}
	p := newProc(s.t, "ingest-2", "ingest", env)
	if _, err := p.start(); err != nil {
		s.t.Fatal(err)
	}
	s.must(poll(startTimeout, "second ingest ready", httpReady(p, "http://"+addr+"/readyz")))
	s.t.Cleanup(func() { p.stop(30 * time.Second) }) //nolint:errcheck
	return "http://" + addr
}

// post sends a write to base and returns its status and request id.
func (s *stack) post(base, path string) (int, string, string) {
	s.t.Helper()
	resp, err := s.http.Post(base+path, "application/json", nil)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m struct {
		RequestID string `json:"request_id"`
	}
	json.Unmarshal(b, &m) //nolint:errcheck // an answer without an id says so below
	return resp.StatusCode, m.RequestID, string(b)
}

// pollDone polls id on base until it reads done, at most within.
func (s *stack) pollDone(base, id string, within time.Duration) map[string]any {
	s.t.Helper()
	var last string
	err := poll(within, "request "+id+" done on "+base, func() (bool, error) {
		resp, err := s.http.Get(base + "/v1/requests/" + id + "?wait=1s")
		if err != nil {
			last = err.Error()
			return false, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		if resp.StatusCode != http.StatusOK {
			return false, nil
		}
		var r map[string]any
		if err := json.Unmarshal(b, &r); err != nil {
			return false, err
		}
		return r["state"] == wire.StateDone, nil
	})
	if err != nil {
		s.t.Fatalf("%v (last answer: %s)", err, last)
	}
	resp, err := s.http.Get(base + "/v1/requests/" + id)
	s.must(err)
	defer resp.Body.Close()
	var r map[string]any
	s.must(json.NewDecoder(resp.Body).Decode(&r))
	return r
}

// sameResult compares two poll answers but for applied_at's form.
func sameResult(x, y map[string]any) bool {
	for _, k := range []string{"request_id", "state", "op", "outcome", "reason", "seq", "user_id", "activity_id"} {
		if fmt.Sprint(x[k]) != fmt.Sprint(y[k]) {
			return false
		}
	}
	return true
}
