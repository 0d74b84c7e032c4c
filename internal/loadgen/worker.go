package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/wire"
)

// worker fires requests one at a time through its own client (they share
// the transport) and keeps its own tallies, merged after the burst, so that
// the hot path shares nothing but two counters.
type worker struct {
	r   *runner
	api workerClients

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

// workerClients are a worker's API clients.
type workerClients struct {
	c *client.Client // writes and polls with ?wait=cfg.Wait
	o *client.Client // the open, with ?wait=cfg.OpenWait
	// opts make c; users are its copies with each user's own token
	// (Config.UserToken).
	opts  []client.Option
	users map[int64]*client.Client
}

func (r *runner) newWorker(uint64) *worker {
	w := &worker{r: r, statuses: make(map[int]int, 4)}
	observe := client.WithObserver(w.observe)
	// 429 and 5xx are retried (nothing was stored); a transport error is
	// reported at once, as a failure of the burst.
	retries := client.WithRetries(r.cfg.MaxRetries, 5*time.Millisecond, time.Second)
	// No Idempotency-Key: the burst measures the path most clients take,
	// where a claim for a full activity can be answered at once.
	noNetRetry, noKeys := client.WithNetRetries(0), client.WithoutKeys()
	hc := client.WithHTTPClient(r.client)
	w.api.opts = []client.Option{hc, retries, noNetRetry, noKeys, observe, client.WithWait(r.cfg.Wait)}
	token := client.WithToken(r.cfg.Token)
	// The URL was validated by Config.Validate.
	w.api.c, _ = client.New(r.cfg.baseURL(), append(w.api.opts, token)...)
	w.api.o, _ = client.New(r.cfg.baseURL(), hc, retries, noNetRetry, noKeys, observe, client.WithWait(r.cfg.OpenWait), token)
	return w
}

// clientFor is the client of user's writes and polls: with
// Config.UserToken, one per user (made on first use) carrying the user's
// own token, so that each simulated user spends its own rate limit.
func (w *worker) clientFor(user int64) *client.Client {
	if w.r.deps.UserToken == nil {
		return w.api.c
	}
	if c, ok := w.api.users[user]; ok {
		return c
	}
	if w.api.users == nil {
		w.api.users = make(map[int64]*client.Client)
	}
	c, _ := client.New(w.r.cfg.baseURL(), append(w.api.opts, client.WithToken(w.r.deps.UserToken(user)))...)
	w.api.users[user] = c
	return c
}

// observe counts one HTTP exchange of this worker's clients.
func (w *worker) observe(x client.Exchange) {
	if x.Status != 0 {
		w.statuses[x.Status]++
	}
	if x.Retry {
		w.retries++
	}
	if x.Method == http.MethodGet && strings.HasPrefix(x.Path, "/v1/requests/") {
		w.polls++
	}
}

func (w *worker) loop(ctx context.Context) {
	n := int64(len(w.r.slots.lat))
	for ctx.Err() == nil {
		i := w.r.slots.next.Add(1) - 1
		if i >= n {
			return
		}
		w.do(ctx, int(i))
		w.r.slots.finished.Add(1)
	}
}

// ops maps the plan's op codes to the client's.
var ops = [4]client.Op{opClaim: client.OpClaim, opJoin: client.OpJoin, opCancel: client.OpCancel, opConfirm: client.OpConfirm}

// do sends request i and follows it to its final result.
func (w *worker) do(ctx context.Context, i int) {
	r := w.r
	start := time.Now()
	c := w.clientFor(r.plan.users[i])
	res, ack, err := c.Submit(ctx, client.Write{Op: ops[r.plan.ops[i]], Activity: r.cfg.Activity, User: r.plan.users[i]})
	if err != nil {
		w.fail(err)
		return
	}
	w.accepted++
	w.lastAccept = max(w.lastAccept, time.Since(r.t0))
	if res == nil {
		if res, err = c.Wait(ctx, ack.RequestID); err != nil {
			w.fail(err)
			return
		}
	}
	end := time.Now()
	r.slots.lat[i] = end.Sub(start)
	w.lastFinal = max(w.lastFinal, end.Sub(r.t0))
	r.slots.outc[i] = w.record(res)
	if r.holds != nil {
		r.holds.observe(r.plan.users[i], res)
	}
}

// record counts a final result's outcome and returns its code.
func (w *worker) record(res *client.Result) uint8 {
	if p := res.PromotedUserID; p != nil {
		w.promoted = append(w.promoted, *p)
	}
	code := outcomeCode(string(res.Outcome))
	if code == codeOther {
		if w.other == nil {
			w.other = make(map[string]int)
		}
		w.other[string(res.Outcome)]++
		return code
	}
	w.outcomes[code]++
	return code
}

func (w *worker) fail(err error) {
	w.errors++
	w.r.sample(err.Error())
}

// open opens the activity with its capacity and requires a done OPENED or
// RESIZED.
func (w *worker) open(ctx context.Context) (string, error) {
	res, err := w.api.o.OpenWithHold(ctx, w.r.cfg.Activity, w.r.cfg.Capacity, w.r.cfg.Hold)
	if err != nil {
		return "", err
	}
	switch out := string(res.Outcome); out {
	case string(wire.OutcomeOpened), string(wire.OutcomeResized):
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
	// Held counts the seats held, not yet confirmed (they are in
	// Confirmed too); Hold is the activity's hold, "" without.
	Held int64  `json:"held,omitempty"`
	Hold string `json:"hold,omitempty"`
}

// state reads the activity; nil when it does not exist (404).
func (w *worker) state(ctx context.Context) (*State, error) {
	a, err := w.api.c.Activity(ctx, w.r.cfg.Activity)
	if errors.Is(err, client.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &State{Capacity: a.Capacity, Confirmed: a.Confirmed, Waiting: a.Waiting, Remaining: a.Remaining,
		Held: a.Held, Hold: a.Hold}, nil
}

// outcomeNames are the outcomes counted without a map; index = code.
var outcomeNames = [...]wire.Outcome{
	"", // no result
	wire.OutcomeGranted, wire.OutcomeSoldOut, wire.OutcomeAlreadyOwned,
	wire.OutcomeConfirmed, wire.OutcomeWaiting, wire.OutcomeAlreadyConfirmed, wire.OutcomeAlreadyWaiting,
	wire.OutcomeCancelled, wire.OutcomeNotSignedUp, wire.OutcomeNoSuchActivity,
	wire.OutcomeOpened, wire.OutcomeResized, wire.OutcomeRejected,
	wire.OutcomeHeld, wire.OutcomeNotHeld, wire.OutcomeHoldExpired,
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
		if string(outcomeNames[i]) == s {
			return uint8(i)
		}
	}
	return codeOther
}
