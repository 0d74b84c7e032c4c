package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// activity is one pool the traffic targets.
type activity struct {
	id       int64
	capacity int
}

// defaultActivities: small pools, so that waitlists, promotions, sold-out
// claims and shedding all happen within a few hundred users.
var defaultActivities = []activity{{101, 20}, {102, 30}, {103, 50}}

// request is one HTTP write of a burst.
type request struct {
	method, path, body string
	// wait, when set, is the ?wait= of the write.
	wait string
}

// answer is what ingest answered to one request.
type answer struct {
	code    int
	id      string // request_id of a 202 or 200
	state   string
	outcome string
	seq     uint64
	shed    bool
	// full marks a 503 for a full in-flight queue (it alone carries
	// Retry-After), as opposed to a broker that is down.
	full bool
	// maybe marks a 503 that carries a request_id: a copy left ingest and
	// got no PubAck, so the request may be stored (and is then applied
	// once); the client polls id to know.
	maybe bool
	body  string // of an unexpected answer
	err   error  // transport error: the request's fate is unknown
}

// accepted reports whether the answer promises that the request is (or
// will be) applied exactly once: a 202, or a 200 with a stored result.
func (a answer) accepted() bool {
	return a.err == nil && a.id != "" &&
		(a.code == http.StatusAccepted || a.code == http.StatusOK && a.state == "done")
}

// trafficConfig shapes a burst.
type trafficConfig struct {
	seed       uint64
	requests   int
	users      int
	clients    int
	perSecond  float64 // 0: as fast as the clients go
	activities []activity
}

// plan draws a burst: joins, cancels and claims (and a few resizes) of
// random users on random activities; a fifth of the writes wait for their
// result (?wait=2s).
func plan(c trafficConfig) []request {
	r := rand.New(rand.NewPCG(c.seed, c.seed^0x9e3779b97f4a7c15))
	reqs := make([]request, c.requests)
	for i := range reqs {
		a := c.activities[r.IntN(len(c.activities))]
		u := 1 + r.IntN(c.users)
		var q request
		switch n := r.IntN(100); {
		case n < 40:
			q = request{method: http.MethodPost, path: fmt.Sprintf("/v1/activities/%d/signups/%d", a.id, u)}
		case n < 65:
			q = request{method: http.MethodDelete, path: fmt.Sprintf("/v1/activities/%d/signups/%d", a.id, u)}
		case n < 98:
			q = request{method: http.MethodPost, path: fmt.Sprintf("/v1/activities/%d/claims/%d", a.id, u)}
		default:
			q = request{method: http.MethodPut, path: fmt.Sprintf("/v1/activities/%d", a.id),
				body: fmt.Sprintf(`{"capacity": %d}`, a.capacity/2+r.IntN(a.capacity))}
		}
		if r.IntN(5) == 0 {
			q.wait = "2s"
		}
		reqs[i] = q
	}
	return reqs
}

// burst is a running (or finished) burst of requests.
type burst struct {
	reqs    []request
	answers []answer
	done    atomic.Int64
	started time.Time
	took    time.Duration
}

// reached waits until frac of the burst has been answered, or the burst
// ended; it returns false when the burst ended first.
func (b *burst) reached(frac float64) bool {
	want := int64(frac * float64(len(b.reqs)))
	for b.done.Load() < want {
		if b.done.Load() >= int64(len(b.reqs)) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// fire sends reqs with c.clients concurrent clients, paced at c.perSecond
// in total, and returns when every request has an answer. The burst is
// visible (b) before it starts, so that a fault can watch its progress.
func (s *stack) fire(b *burst, c trafficConfig) {
	b.answers = make([]answer, len(b.reqs))
	var lim *rate.Limiter
	if c.perSecond > 0 {
		lim = rate.NewLimiter(rate.Limit(c.perSecond), max(1, int(c.perSecond/50)))
	}
	next := make(chan int)
	var wg sync.WaitGroup
	ctx := context.Background()
	b.started = time.Now()
	for range c.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				b.answers[i] = s.send(ctx, b.reqs[i])
				b.done.Add(1)
			}
		}()
	}
	for i := range b.reqs {
		if lim != nil {
			lim.Wait(ctx) //nolint:errcheck // the context never ends
		}
		next <- i
	}
	close(next)
	wg.Wait()
	b.took = time.Since(b.started)
}

// send makes one request and reads its answer.
func (s *stack) send(ctx context.Context, q request) answer {
	url := s.ingestURL + q.path
	if q.wait != "" {
		url += "?wait=" + q.wait
	}
	var body io.Reader
	if q.body != "" {
		body = strings.NewReader(q.body)
	}
	req, err := http.NewRequestWithContext(ctx, q.method, url, body)
	if err != nil {
		return answer{err: err}
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{code: resp.StatusCode, err: err}
	}
	a := answer{code: resp.StatusCode}
	switch resp.StatusCode {
	case http.StatusAccepted, http.StatusOK:
		var m struct {
			RequestID string `json:"request_id"`
			State     string `json:"state"`
			Outcome   string `json:"outcome"`
			Seq       uint64 `json:"seq"`
			Shed      bool   `json:"shed"`
		}
		if err := json.Unmarshal(raw, &m); err != nil || m.RequestID == "" {
			a.body = string(raw)
			a.err = fmt.Errorf("%s %s: %d answer without a request_id: %q", q.method, q.path, resp.StatusCode, raw)
			return a
		}
		a.id, a.state, a.outcome, a.seq, a.shed = m.RequestID, m.State, m.Outcome, m.Seq, m.Shed
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		// Final: nothing was stored, unless a 503 names the request (it
		// may be stored: the client is to poll it).
		a.full = resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != ""
		var m struct {
			RequestID string `json:"request_id"`
		}
		if strings.Contains(string(raw), "request_id") {
			if resp.StatusCode == http.StatusServiceUnavailable && json.Unmarshal(raw, &m) == nil && m.RequestID != "" &&
				resp.Header.Get("Location") == "/v1/requests/"+m.RequestID {
				a.id, a.maybe = m.RequestID, true
			} else {
				a.body = string(raw)
			}
		}
	default:
		a.body = string(raw)
	}
	return a
}

// tally counts a burst's answers.
type tally struct {
	sent, accepted, done, shed, r503, r429, unexpected, errs int
	// maybe counts the 503s that named their request (it may be stored).
	maybe int
	// r503full counts the 503s of a full in-flight queue, among r503.
	r503full        int
	firstUnexpected string
}

func count(answers []answer) tally {
	var t tally
	for _, a := range answers {
		t.sent++
		switch {
		case a.err != nil:
			t.errs++
			if t.firstUnexpected == "" {
				t.firstUnexpected = a.err.Error()
			}
		case a.accepted():
			t.accepted++
			if a.code == http.StatusOK {
				t.done++
			}
			if a.shed {
				t.shed++ // shed: stored and applied like the rest
			}
		case a.maybe:
			t.maybe++
		case a.code == http.StatusServiceUnavailable && a.body == "":
			t.r503++
			if a.full {
				t.r503full++
			}
		case a.code == http.StatusTooManyRequests && a.body == "":
			t.r429++
		default:
			t.unexpected++
			if t.firstUnexpected == "" {
				t.firstUnexpected = fmt.Sprintf("%d %+v", a.code, a)
			}
		}
	}
	return t
}
