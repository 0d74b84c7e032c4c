package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// answer is the part of a result, ack or error body the load generator
// reads; one per worker, reset before each decode.
type answer struct {
	RequestID      string `json:"request_id"`
	State          string `json:"state"`
	Outcome        string `json:"outcome"`
	PromotedUserID *int64 `json:"promoted_user_id"`
	Error          string `json:"error"`
}

// worker fires requests one at a time and keeps its own tallies, merged
// after the burst, so that the hot path shares nothing but two counters.
type worker struct {
	r   *runner
	rng *rand.Rand // backoff jitter

	body bytes.Buffer // response body, reused
	url  []byte       // request URL, reused
	ans  answer
	// token is the bearer token of the exchanges in progress.
	token string

	statuses   map[int]int
	outcomes   [len(outcomeNames)]int
	other      map[string]int
	promoted   []int64
	accepted   int
	retries    int
	polls      int
	errors     int
	lastAccept time.Duration // since t0: the end of the firing window
	lastFinal  time.Duration // since t0: the last final result
}

func (r *runner) newWorker(id uint64) *worker {
	return &worker{
		r:        r,
		rng:      rand.New(rand.NewPCG(r.cfg.Seed, id)),
		url:      make([]byte, 0, 128),
		statuses: make(map[int]int, 4),
		token:    r.cfg.Token,
	}
}

func (w *worker) loop(ctx context.Context) {
	n := int64(len(w.r.lat))
	for ctx.Err() == nil {
		i := w.r.next.Add(1) - 1
		if i >= n {
			return
		}
		w.do(ctx, int(i))
		w.r.finished.Add(1)
	}
}

// errStatus is an answer the load generator does not expect.
type errStatus struct {
	code int
	msg  string
}

func (e *errStatus) Error() string {
	if e.msg == "" {
		return "HTTP " + strconv.Itoa(e.code)
	}
	return "HTTP " + strconv.Itoa(e.code) + ": " + e.msg
}

// do sends request i and follows it to its final result.
func (w *worker) do(ctx context.Context, i int) {
	r := w.r
	op, user := r.plan.ops[i], r.plan.users[i]
	w.token = r.cfg.Token
	if r.cfg.UserToken != nil {
		w.token = r.cfg.UserToken(user)
	}
	defer func() { w.token = r.cfg.Token }()
	w.url = append(w.url[:0], r.prefix[op]...)
	w.url = strconv.AppendInt(w.url, user, 10)
	w.url = append(w.url, r.writeQuery...)

	start := time.Now()
	code, err := w.send(ctx, r.method[op], string(w.url), nil)
	if err != nil {
		w.fail(err)
		return
	}
	if code != http.StatusOK && code != http.StatusAccepted {
		w.fail(&errStatus{code, w.ans.Error})
		return
	}
	w.accepted++
	w.lastAccept = max(w.lastAccept, time.Since(r.t0))
	if code == http.StatusAccepted || w.ans.State != wire.StateDone {
		if err := w.poll(ctx); err != nil {
			w.fail(err)
			return
		}
	}
	end := time.Now()
	r.lat[i] = end.Sub(start)
	w.lastFinal = max(w.lastFinal, end.Sub(r.t0))
	r.outc[i] = w.record()
}

// poll follows the request of the last answer until it is done.
func (w *worker) poll(ctx context.Context) error {
	id := w.ans.RequestID
	if id == "" {
		return errors.New("a 202 without a request_id")
	}
	u := w.r.pollURL + id + w.r.pollQuery
	for {
		w.polls++
		code, err := w.send(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return &errStatus{code, w.ans.Error}
		}
		if w.ans.State == wire.StateDone {
			return nil
		}
	}
}

// record counts the final answer's outcome and returns its code.
func (w *worker) record() uint8 {
	if p := w.ans.PromotedUserID; p != nil {
		w.promoted = append(w.promoted, *p)
	}
	code := outcomeCode(w.ans.Outcome)
	if code == codeOther {
		if w.other == nil {
			w.other = make(map[string]int)
		}
		w.other[w.ans.Outcome]++
		return code
	}
	w.outcomes[code]++
	return code
}

func (w *worker) fail(err error) {
	w.errors++
	w.r.sample(err.Error())
}

// send makes one HTTP exchange, retrying 429 and 503 (nothing was stored)
// with a short jittered backoff, and decodes the body into w.ans.
func (w *worker) send(ctx context.Context, method, url string, body []byte) (int, error) {
	backoff := 5 * time.Millisecond
	for attempt := 0; ; attempt++ {
		code, err := w.exchange(ctx, method, url, body)
		if err != nil {
			return 0, err
		}
		w.statuses[code]++
		if code != http.StatusTooManyRequests && code != http.StatusServiceUnavailable {
			return code, nil
		}
		if attempt >= w.r.cfg.MaxRetries {
			return code, fmt.Errorf("HTTP %d still after %d retries: %s", code, attempt, w.ans.Error)
		}
		w.retries++
		t := time.NewTimer(backoff/2 + rand.N(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, time.Second)
	}
}

func (w *worker) exchange(ctx context.Context, method, url string, body []byte) (int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if w.token != "" {
		req.Header.Set("Authorization", "Bearer "+w.token)
	}
	resp, err := w.r.client.Do(req)
	if err != nil {
		return 0, err
	}
	w.body.Reset()
	_, err = w.body.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, fmt.Errorf("%s %s: read the answer: %w", method, url, err)
	}
	w.ans = answer{}
	if w.body.Len() > 0 {
		if err := json.Unmarshal(w.body.Bytes(), &w.ans); err != nil {
			if resp.StatusCode < 300 {
				return 0, fmt.Errorf("%s %s: HTTP %d with a body that is not the expected JSON: %w", method, url, resp.StatusCode, err)
			}
			// An error page from something that is not the API (a proxy,
			// a mux): keep its start for the report.
			b := w.body.Bytes()
			w.ans.Error = string(bytes.TrimSpace(b[:min(len(b), 120)]))
		}
	}
	return resp.StatusCode, nil
}

// open sends PUT /v1/activities/{a} {"capacity": N} and requires a done
// OPENED or RESIZED.
func (w *worker) open(ctx context.Context) (string, error) {
	r := w.r
	u := r.cfg.BaseURL + "/v1/activities/" + strconv.FormatInt(r.cfg.Activity, 10) + "?wait=" + r.cfg.OpenWait.String()
	body := []byte(`{"capacity":` + strconv.FormatInt(r.cfg.Capacity, 10) + `}`)
	code, err := w.send(ctx, http.MethodPut, u, body)
	if err != nil {
		return "", err
	}
	if code != http.StatusOK && code != http.StatusAccepted {
		return "", &errStatus{code, w.ans.Error}
	}
	if code == http.StatusAccepted || w.ans.State != wire.StateDone {
		if err := w.poll(ctx); err != nil {
			return "", err
		}
	}
	switch out := w.ans.Outcome; out {
	case wire.OutcomeOpened, wire.OutcomeResized:
		return out, nil
	default:
		return out, fmt.Errorf("the open answered %s, want OPENED or RESIZED", out)
	}
}

// State is the activity as GET /v1/activities/{a} shows it.
type State struct {
	Capacity  int64 `json:"capacity"`
	Confirmed int64 `json:"confirmed"`
	Waiting   int64 `json:"waiting"`
	Remaining int64 `json:"remaining"`
}

// state reads the activity; nil when it does not exist (404).
func (w *worker) state(ctx context.Context) (*State, error) {
	u := w.r.cfg.BaseURL + "/v1/activities/" + strconv.FormatInt(w.r.cfg.Activity, 10)
	code, err := w.send(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	switch code {
	case http.StatusOK:
		var s State
		if err := json.Unmarshal(w.body.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("GET %s: %w", u, err)
		}
		return &s, nil
	case http.StatusNotFound:
		return nil, nil
	default:
		return nil, &errStatus{code, w.ans.Error}
	}
}

// outcomeNames are the outcomes counted without a map; index = code.
var outcomeNames = [...]string{
	"", // no result
	wire.OutcomeGranted, wire.OutcomeSoldOut, wire.OutcomeAlreadyOwned,
	wire.OutcomeConfirmed, wire.OutcomeWaiting, wire.OutcomeAlreadyConfirmed, wire.OutcomeAlreadyWaiting,
	wire.OutcomeCancelled, wire.OutcomeNotSignedUp, wire.OutcomeNoSuchActivity,
	wire.OutcomeOpened, wire.OutcomeResized, wire.OutcomeRejected,
}

const (
	codeNone      uint8 = 0
	codeGranted   uint8 = 1
	codeConfirmed uint8 = 4
	codeCancelled uint8 = 8
	codeOther     uint8 = 255
)

func outcomeCode(s string) uint8 {
	for i := 1; i < len(outcomeNames); i++ {
		if outcomeNames[i] == s {
			return uint8(i)
		}
	}
	return codeOther
}
