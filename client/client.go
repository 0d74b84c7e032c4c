// Package client is the Go client of allot's HTTP API (api/openapi.yaml):
// open (with an optional hold), join, cancel, claim and confirm with an
// idempotency key per logical attempt, waiting for the final result (the
// server's ?wait= first, then polling with backoff that honours
// Retry-After), reading state, and decoding the events the allocator
// publishes and the notifier delivers.
//
// A write is safe to retry: every attempt of one call carries the same
// Idempotency-Key, so the request is stored and applied once however often
// the network or the server makes the client send it again.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client talks to one ingest endpoint. It is safe for concurrent use.
type Client struct {
	base       string
	hc         *http.Client
	token      string
	wait       time.Duration
	maxRetries int
	netRetries int
	noKeys     bool
	minBackoff time.Duration
	maxBackoff time.Duration
	observe    func(Exchange)
	// sleep waits out a Retry-After or a backoff (ctxSleep; tests record
	// the delays instead).
	sleep func(context.Context, time.Duration) error
}

// Exchange describes one HTTP round trip, for WithObserver.
type Exchange struct {
	Method string
	Path   string
	// Status is the HTTP status, 0 when the round trip failed (Err).
	Status int
	Err    error
	// Retry is true when the client will send the request again.
	Retry bool
	// Elapsed is the round trip's duration.
	Elapsed time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (default: a new http.Client).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithToken sends Authorization: Bearer token with every request.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithWait sets the ?wait= of writes and polls, how long the server holds
// an answer for the result (default 10s; the server caps it at 30s).
func WithWait(d time.Duration) Option { return func(c *Client) { c.wait = d } }

// WithRetries bounds the attempts of one call after a 429, a 5xx or a
// transport error (default 10); each waits Retry-After or a jittered
// exponential backoff between min and max (default 50ms and 5s).
func WithRetries(n int, min, max time.Duration) Option {
	return func(c *Client) { c.maxRetries, c.minBackoff, c.maxBackoff = n, min, max }
}

// WithNetRetries bounds the attempts of one call after a transport error
// (connection refused or reset, timeout), within WithRetries' bound
// (default 3). The same key makes a resend safe whether or not the first
// attempt reached the server.
func WithNetRetries(n int) Option { return func(c *Client) { c.netRetries = n } }

// WithoutKeys sends writes without an Idempotency-Key unless Write.Key
// is set. Retrying a 429 or 503 stays safe (nothing was stored), but a
// write resent after a transport error may be applied twice, so use it
// with WithNetRetries(0): it is for load tests of the unkeyed path (a keyed
// claim is never shed).
func WithoutKeys() Option { return func(c *Client) { c.noKeys = true } }

// WithObserver calls f after every HTTP round trip, from the calling
// goroutine: for metrics and load reports.
func WithObserver(f func(Exchange)) Option { return func(c *Client) { c.observe = f } }

// New returns a client of the ingest API at baseURL (e.g.
// http://localhost:8080).
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q is not an http(s) URL", baseURL)
	}
	c := &Client{
		base:       strings.TrimRight(baseURL, "/"),
		hc:         &http.Client{},
		wait:       10 * time.Second,
		maxRetries: 10,
		netRetries: 3,
		minBackoff: 50 * time.Millisecond,
		maxBackoff: 5 * time.Second,
		sleep:      ctxSleep,
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// ErrNotFound is matched (errors.Is) by the APIError of a 404: no such
// activity, signup or request.
var ErrNotFound = errors.New("not found")

// APIError is an answer the server gave that is not a success: the status
// and the server's one sentence.
type APIError struct {
	Method, Path string
	Status       int
	Message      string
	// RetryAfter is the Retry-After of a 429 or 503, 0 if none.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.Method, e.Path, e.Status, e.Message)
}

// Is makes a 404 match ErrNotFound.
func (e *APIError) Is(target error) bool {
	return target == ErrNotFound && e.Status == http.StatusNotFound
}

// temporary reports whether the same request may succeed later: nothing
// was stored (429, 503) or the server failed (5xx).
func (e *APIError) temporary() bool {
	return e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// NewKey returns a fresh idempotency key: 128 random bits in hex. Use one
// per logical attempt (one user's tap), and send it again on each retry.
func NewKey() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Write is one write request.
type Write struct {
	Op       Op
	Activity int64
	User     int64 // not for OpOpen
	Capacity int64 // OpOpen only
	// Hold is how long seats taken from now on are held before they must
	// be confirmed (OpOpen only; 0: no holds, also on a resize of an
	// activity that had one; at most 168h).
	Hold time.Duration
	// Key is the Idempotency-Key; empty means a fresh NewKey.
	Key string
}

func (w Write) route() (method, path string, body []byte, err error) {
	if w.Activity < 1 {
		return "", "", nil, fmt.Errorf("client: activity id %d is not positive", w.Activity)
	}
	a := "/v1/activities/" + strconv.FormatInt(w.Activity, 10)
	if w.Op == OpOpen {
		body := `{"capacity":` + strconv.FormatInt(w.Capacity, 10)
		if w.Hold != 0 {
			body += `,"hold":"` + w.Hold.String() + `"`
		}
		return http.MethodPut, a, []byte(body + `}`), nil
	}
	if w.User < 1 {
		return "", "", nil, fmt.Errorf("client: user id %d is not positive", w.User)
	}
	u := strconv.FormatInt(w.User, 10)
	switch w.Op {
	case OpJoin:
		return http.MethodPost, a + "/signups/" + u, nil, nil
	case OpCancel:
		return http.MethodDelete, a + "/signups/" + u, nil, nil
	case OpClaim:
		return http.MethodPost, a + "/claims/" + u, nil, nil
	case OpConfirm:
		return http.MethodPost, a + "/signups/" + u + "/confirm", nil, nil
	}
	return "", "", nil, fmt.Errorf("client: unknown op %q", w.Op)
}

// Open opens activity with capacity seats, or resizes it, and waits for the
// result (OPENED, RESIZED or REJECTED).
func (c *Client) Open(ctx context.Context, activity, capacity int64) (*Result, error) {
	return c.Do(ctx, Write{Op: OpOpen, Activity: activity, Capacity: capacity})
}

// OpenWithHold opens activity with capacity seats, or resizes it, holding
// each seat taken from now on for hold (at most 168h) until its user
// confirms it (Confirm); a seat not confirmed in time goes back to the
// waitlist's head or to the pool. It waits for the result.
func (c *Client) OpenWithHold(ctx context.Context, activity, capacity int64, hold time.Duration) (*Result, error) {
	return c.Do(ctx, Write{Op: OpOpen, Activity: activity, Capacity: capacity, Hold: hold})
}

// Join signs user up for activity and waits for the result (CONFIRMED,
// or HELD with HeldUntil in an activity with a hold; WAITING with a
// position, ALREADY_CONFIRMED, ALREADY_WAITING or NO_SUCH_ACTIVITY).
func (c *Client) Join(ctx context.Context, activity, user int64) (*Result, error) {
	return c.Do(ctx, Write{Op: OpJoin, Activity: activity, User: user})
}

// Cancel cancels user's signup for activity and waits for the result
// (CANCELLED, with the promoted waiter if any, or NOT_SIGNED_UP).
func (c *Client) Cancel(ctx context.Context, activity, user int64) (*Result, error) {
	return c.Do(ctx, Write{Op: OpCancel, Activity: activity, User: user})
}

// Claim claims a seat of activity for user and waits for the result
// (GRANTED, or HELD with HeldUntil in an activity with a hold; SOLD_OUT,
// ALREADY_OWNED, ALREADY_WAITING or NO_SUCH_ACTIVITY).
func (c *Client) Claim(ctx context.Context, activity, user int64) (*Result, error) {
	return c.Do(ctx, Write{Op: OpClaim, Activity: activity, User: user})
}

// Confirm confirms the seat user holds in activity under its hold and
// waits for the result (CONFIRMED; ALREADY_CONFIRMED, NOT_HELD, or
// HOLD_EXPIRED when the confirm was received after the hold's end, which
// releases the seat; NO_SUCH_ACTIVITY).
func (c *Client) Confirm(ctx context.Context, activity, user int64) (*Result, error) {
	return c.Do(ctx, Write{Op: OpConfirm, Activity: activity, User: user})
}

// Do submits w and waits for its final result.
func (c *Client) Do(ctx context.Context, w Write) (*Result, error) {
	res, ack, err := c.Submit(ctx, w)
	if err != nil {
		return nil, err
	}
	if res != nil {
		return res, nil
	}
	return c.Wait(ctx, ack.RequestID)
}

// Submit sends w once logically (retrying with the same key as needed) and
// returns the result when the server saw it applied within the wait, else
// the ack of the stored request, whose result Wait follows.
func (c *Client) Submit(ctx context.Context, w Write) (*Result, Ack, error) {
	method, path, body, err := w.route()
	if err != nil {
		return nil, Ack{}, err
	}
	if w.Key == "" && !c.noKeys {
		w.Key = NewKey()
	}
	var res Result
	status, err := c.call(ctx, method, path+c.waitQuery(), w.Key, body, &res)
	if err != nil {
		return nil, Ack{}, err
	}
	if status == http.StatusOK && res.Done() {
		return &res, Ack{RequestID: res.RequestID, State: res.State}, nil
	}
	if res.RequestID == "" {
		return nil, Ack{}, fmt.Errorf("client: %s %s: HTTP %d without a request_id", method, path, status)
	}
	return nil, Ack{RequestID: res.RequestID, State: StatePending}, nil
}

// Poll reads the state of request id once, holding the answer up to wait
// for the result. The Result is pending (Done false) or final.
func (c *Client) Poll(ctx context.Context, id string, wait time.Duration) (*Result, error) {
	q := ""
	if wait > 0 {
		q = "?wait=" + wait.String()
	}
	var res Result
	if _, err := c.call(ctx, http.MethodGet, "/v1/requests/"+url.PathEscape(id)+q, "", nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Wait follows request id until its result is final or ctx ends: each poll
// is held by the server up to the client's wait; a poll answered pending
// early (a server with a shorter wait) is followed after a backoff.
func (c *Client) Wait(ctx context.Context, id string) (*Result, error) {
	for attempt := 0; ; attempt++ {
		start := time.Now()
		res, err := c.Poll(ctx, id, c.wait)
		if err != nil {
			return nil, err
		}
		if res.Done() {
			return res, nil
		}
		if time.Since(start) < c.wait/2 {
			if err := c.sleep(ctx, c.backoff(attempt)); err != nil {
				return nil, err
			}
		} else {
			attempt = -1 // the server held the poll: no backoff needed
		}
	}
}

// Activity reads activity's state; an activity never opened is an error
// matching ErrNotFound.
func (c *Client) Activity(ctx context.Context, activity int64) (*ActivityState, error) {
	var st ActivityState
	if _, err := c.call(ctx, http.MethodGet, "/v1/activities/"+strconv.FormatInt(activity, 10), "", nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// Signup reads user's signup in activity; a user who never signed up is an
// error matching ErrNotFound.
func (c *Client) Signup(ctx context.Context, activity, user int64) (*SignupState, error) {
	var st SignupState
	path := "/v1/activities/" + strconv.FormatInt(activity, 10) + "/signups/" + strconv.FormatInt(user, 10)
	if _, err := c.call(ctx, http.MethodGet, path, "", nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

func (c *Client) waitQuery() string {
	if c.wait <= 0 {
		return ""
	}
	return "?wait=" + c.wait.String()
}

// call makes one logical request: it retries transport errors, 429 and 5xx
// with the same key and body, honouring Retry-After, and decodes a 2xx
// body into out.
func (c *Client) call(ctx context.Context, method, path, key string, body []byte, out any) (int, error) {
	netErrs := 0
	for attempt := 0; ; attempt++ {
		start := time.Now()
		status, data, retryAfter, err := c.roundTrip(ctx, method, path, key, body)
		elapsed := time.Since(start)
		retry := attempt < c.maxRetries && ctx.Err() == nil
		var apiErr *APIError
		switch {
		case err != nil:
			// Sent or not, the same key makes a resend safe.
			netErrs++
			retry = retry && netErrs <= c.netRetries
		case status >= 200 && status < 300:
			c.report(Exchange{method, path, status, nil, false, elapsed})
			if err := json.Unmarshal(data, out); err != nil {
				return status, fmt.Errorf("client: %s %s: HTTP %d with a body that is not the expected JSON: %w", method, path, status, err)
			}
			return status, nil
		default:
			apiErr = &APIError{Method: method, Path: path, Status: status, Message: message(data), RetryAfter: retryAfter}
			err = apiErr
			retry = retry && apiErr.temporary()
		}
		c.report(Exchange{method, path, status, err, retry, elapsed})
		if !retry {
			return status, err
		}
		d := c.backoff(attempt)
		if retryAfter > 0 {
			d = retryAfter
		}
		if err := c.sleep(ctx, d); err != nil {
			return 0, err
		}
	}
}

func (c *Client) report(x Exchange) {
	if c.observe != nil {
		c.observe(x)
	}
}

func (c *Client) roundTrip(ctx context.Context, method, path, key string, body []byte) (int, []byte, time.Duration, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, 0, fmt.Errorf("client: %s %s: read the answer: %w", method, path, err)
	}
	return resp.StatusCode, data, retryAfter(resp.Header.Get("Retry-After")), nil
}

// retryAfter reads Retry-After in seconds (the form ingest sends) or as an
// HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

func message(data []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		return e.Error
	}
	s := strings.TrimSpace(string(data))
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// backoff is the attempt-th wait: exponential from minBackoff, capped at
// maxBackoff, with full jitter over its upper half.
func (c *Client) backoff(attempt int) time.Duration {
	d := float64(c.minBackoff) * math.Pow(2, float64(min(attempt, 30)))
	d = min(d, float64(c.maxBackoff))
	return time.Duration(d/2 + mrand.Float64()*d/2)
}

// ctxSleep waits d or until ctx ends, whichever is first.
func ctxSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
