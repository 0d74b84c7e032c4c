package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/wire"
)

// OpenLoopConfig is one open-loop run: claims for one activity arriving at
// a fixed rate, each from a distinct user, each its own POST, whatever the
// server's answers take (vegeta's attacker, which starts more workers and
// connections when the ones it has are busy).
type OpenLoopConfig struct {
	BaseURL  string        // the server, e.g. http://127.0.0.1:8080
	Activity int64         // default 9001
	Items    int64         // the activity is opened with this many items
	Rate     int           // claims per second
	Duration time.Duration // of the attack
	// Wait is the ?wait= of every claim (default 15s). A claim answered
	// before its result (202) is followed with polls after the attack.
	Wait time.Duration
	// FirstUser is the user of the first claim (default 1); claim i is
	// user FirstUser+i.
	FirstUser int64
	// Workers is how many attack workers vegeta starts with (default
	// Rate/10, at least 64); it adds more whenever all are busy.
	Workers int
	// LateAfter is how far past its slot a claim may start before it
	// counts as late (default 10ms).
	LateAfter time.Duration
	// Window, when set, is called with true just before the attack starts
	// (after the open) and with false once its last answer is in.
	Window func(start bool)
}

func (c *OpenLoopConfig) defaults() {
	c.BaseURL = strings.TrimRight(c.BaseURL, "/")
	if c.Activity == 0 {
		c.Activity = 9001
	}
	if c.Wait == 0 {
		c.Wait = 15 * time.Second
	}
	if c.FirstUser == 0 {
		c.FirstUser = 1
	}
	if c.Workers == 0 {
		c.Workers = max(64, c.Rate/10)
	}
	if c.LateAfter == 0 {
		c.LateAfter = 10 * time.Millisecond
	}
}

// OpenLoopResult is what an open-loop run measured.
type OpenLoopResult struct {
	Items   int64
	Planned int // Rate × Duration: the claims the schedule holds
	Sent    int // the claims vegeta started
	// Rate is vegeta's achieved rate of sent claims (its Metrics.Rate).
	Rate float64
	// Late counts the claims that started more than LateAfter after their
	// slot in the schedule; MaxLate is the latest one.
	Late    int
	MaxLate time.Duration
	// Latencies of every claim, from its start to its answer.
	P50, P90, P99, Max time.Duration
	// SlotP99 and SlotMax are from each claim's slot in the schedule to
	// its answer: the latency with vegeta's lateness added.
	SlotP99, SlotMax time.Duration
	// Start is the first claim's start; Elapsed is from it to the last
	// answer.
	Start   time.Time
	Elapsed time.Duration
	Codes   map[int]int // HTTP status → claims (0: no answer)
	// Failed counts the claims answered neither 200 nor 202 with a
	// request id (no answer, 429, 503 for too many in flight, ...); Codes
	// says which, FirstFailure why one failed.
	Failed       int
	FirstFailure string
	// Pending counts the claims answered before their result (202); each
	// was followed to its result after the attack. Unresolved counts
	// those whose result could not be read.
	Pending, Unresolved int
	Outcomes            map[string]int // final outcome → claims
	// Unshed counts the claims answered 200 without "shed": true, i.e.
	// by the allocator's record (allot) or by a server that does not
	// shed (the gate); UnshedP50 and UnshedP99 are their latencies.
	Unshed               int
	UnshedP50, UnshedP99 time.Duration
	// Slow describes the claims at or above P99: how many were shed, and
	// when they were scheduled, from the first claim's slot.
	Slow         SlowClaims
	Granted      int
	GrantedUsers int // distinct users among the grants
	// After is the activity as the server shows it after the run (nil if
	// it could not be read).
	After *client.ActivityState
}

// Dropped is how many scheduled claims vegeta never sent: the attack fell
// behind its schedule and ran out of time.
func (r OpenLoopResult) Dropped() int { return max(r.Planned-r.Sent, 0) }

// ErrSellOut is wrapped by SoldOut's errors.
var ErrSellOut = errors.New("sell-out wrong")

// SoldOut checks the sell-out: exactly Items claims granted, to as many
// distinct users, and the activity showing every item taken.
func (r OpenLoopResult) SoldOut() error {
	var errs []error
	if int64(r.Granted) != r.Items {
		errs = append(errs, fmt.Errorf("%w: %d GRANTED, want exactly %d", ErrSellOut, r.Granted, r.Items))
	}
	if r.GrantedUsers != r.Granted {
		errs = append(errs, fmt.Errorf("%w: %d grants to %d distinct users", ErrSellOut, r.Granted, r.GrantedUsers))
	}
	switch a := r.After; {
	case a == nil:
		errs = append(errs, fmt.Errorf("%w: the activity could not be read afterwards", ErrSellOut))
	case a.Confirmed != r.Items || a.Remaining != 0:
		errs = append(errs, fmt.Errorf("%w: the activity shows %d taken, %d remaining, want %d and 0", ErrSellOut, a.Confirmed, a.Remaining, r.Items))
	}
	return errors.Join(errs...)
}

// Check is SoldOut, plus no claim refused by a rate limit (429: the
// server under test was not configured for the attack) and none answered
// 202 left without a result. Claims the server refused for overload (503)
// are a measured result, counted in Failed and Codes, not a failure here.
func (r OpenLoopResult) Check() error {
	errs := []error{r.SoldOut()}
	if n := r.Codes[http.StatusTooManyRequests]; n > 0 {
		errs = append(errs, fmt.Errorf("%d claims refused by a rate limit (429)", n))
	}
	if r.Unresolved > 0 {
		errs = append(errs, fmt.Errorf("%d claims answered 202 never got a result", r.Unresolved))
	}
	return errors.Join(errs...)
}

// answer is what OpenLoop keeps of one claim's result.
type answer struct {
	seq     uint64
	start   time.Time
	latency time.Duration
	code    int
	err     string
	id      string
	done    bool
	outcome string
	user    int64
	shed    bool
}

// SlowClaims is where the slowest claims of a run (those at or above its
// p99) came from: how many were shed, how many granted (which no server
// answers before it has decided them).
type SlowClaims struct {
	N, Shed, Granted int
	// First, Median and Last are their slots, from the first claim's.
	First, Median, Last time.Duration
}

// OpenLoop opens the activity with cfg.Items items, then fires claims at
// cfg.Rate for cfg.Duration with vegeta, follows every claim answered 202
// to its result, and reads the activity. An error means the run could not
// be made (the open failed, ctx ended); whether it sold out right is the
// result's SoldOut and Check.
func OpenLoop(ctx context.Context, cfg OpenLoopConfig) (OpenLoopResult, error) {
	cfg.defaults()
	if cfg.Rate < 1 || cfg.Duration <= 0 || cfg.Items < 0 {
		return OpenLoopResult{}, fmt.Errorf("open loop: rate %d/s for %s with %d items", cfg.Rate, cfg.Duration, cfg.Items)
	}
	c, err := client.New(cfg.BaseURL, client.WithWait(cfg.Wait), client.WithoutKeys())
	if err != nil {
		return OpenLoopResult{}, err
	}
	if res, err := c.Open(ctx, cfg.Activity, cfg.Items); err != nil {
		return OpenLoopResult{}, fmt.Errorf("open activity %d: %w", cfg.Activity, err)
	} else if res.Outcome != client.Outcome(wire.OutcomeOpened) && res.Outcome != client.Outcome(wire.OutcomeResized) {
		return OpenLoopResult{}, fmt.Errorf("open activity %d: %s", cfg.Activity, res.Outcome)
	}

	planned := int(int64(cfg.Rate) * int64(cfg.Duration) / int64(time.Second))
	prefix := cfg.BaseURL + "/v1/activities/" + strconv.FormatInt(cfg.Activity, 10) + "/claims/"
	suffix := "?wait=" + cfg.Wait.String()
	var next atomic.Int64
	targeter := func(t *vegeta.Target) error {
		u := cfg.FirstUser + next.Add(1) - 1
		t.Method, t.URL = http.MethodPost, prefix+strconv.FormatInt(u, 10)+suffix
		return nil
	}
	// One transport of keep-alive connections, without a cap (open loop),
	// keeping idle as many as a slow server makes vegeta open, so that a
	// slow answer does not make every later claim a new connection.
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: max(cfg.Workers, 10000),
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	atk := vegeta.NewAttacker(
		vegeta.Client(&http.Client{Transport: tr, Timeout: cfg.Wait + 30*time.Second}),
		vegeta.Workers(uint64(cfg.Workers)),
		vegeta.MaxBody(64<<10),
		vegeta.Redirects(vegeta.NoFollow),
	)
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	var m vegeta.Metrics
	answers := make([]answer, 0, planned)
	if cfg.Window != nil {
		cfg.Window(true)
	}
	for res := range atk.Attack(targeter, vegeta.ConstantPacer{Freq: cfg.Rate, Per: time.Second}, cfg.Duration, "claims") {
		m.Add(res)
		a := answer{seq: res.Seq, start: res.Timestamp, latency: res.Latency, code: int(res.Code), err: res.Error}
		var body struct {
			RequestID string `json:"request_id"`
			State     string `json:"state"`
			Outcome   string `json:"outcome"`
			UserID    int64  `json:"user_id"`
			Shed      bool   `json:"shed"`
		}
		if (a.code == http.StatusOK || a.code == http.StatusAccepted) && json.Unmarshal(res.Body, &body) == nil {
			a.id, a.outcome, a.user, a.shed = body.RequestID, body.Outcome, body.UserID, body.Shed
			a.done = a.code == http.StatusOK && body.State == string(wire.StateDone)
		}
		answers = append(answers, a)
	}
	if cfg.Window != nil {
		cfg.Window(false)
	}
	m.Close()
	if err := ctx.Err(); err != nil {
		return OpenLoopResult{}, err
	}

	r := OpenLoopResult{Items: cfg.Items, Planned: planned, Sent: len(answers), Rate: m.Rate,
		Codes: map[int]int{}, Outcomes: map[string]int{}}
	if len(answers) == 0 {
		return r, fmt.Errorf("open loop: vegeta sent nothing")
	}
	// Claim seq's slot is the first claim's start plus seq periods.
	slices.SortFunc(answers, func(a, b answer) int { return int(a.seq) - int(b.seq) })
	first := answers[0].start
	r.Start = first
	period := time.Second / time.Duration(cfg.Rate)
	lat := make([]time.Duration, 0, len(answers))
	fromSlot := make([]time.Duration, 0, len(answers))
	var end time.Time
	granted := map[int64]bool{}
	for i := range answers {
		a := &answers[i]
		late := a.start.Sub(first.Add(time.Duration(a.seq) * period))
		if late > cfg.LateAfter {
			r.Late++
			r.MaxLate = max(r.MaxLate, late)
		}
		lat = append(lat, a.latency)
		fromSlot = append(fromSlot, max(late, 0)+a.latency)
		if e := a.start.Add(a.latency); e.After(end) {
			end = e
		}
		r.Codes[a.code]++
		switch {
		case a.done:
		case a.id != "":
			// Answered before its result: follow it.
			r.Pending++
			res, err := c.Wait(ctx, a.id)
			if err != nil {
				r.Unresolved++
				continue
			}
			a.outcome, a.user = string(res.Outcome), res.UserID
		default:
			r.Failed++
			if r.FirstFailure == "" {
				r.FirstFailure = fmt.Sprintf("HTTP %d %s", a.code, a.err)
			}
			continue
		}
		r.Outcomes[a.outcome]++
		if a.outcome == string(wire.OutcomeGranted) {
			r.Granted++
			granted[a.user] = true
		}
	}
	r.GrantedUsers = len(granted)
	r.Elapsed = end.Sub(first)
	r.P50, r.P90, r.P99, r.Max = Percentile(lat, 0.50), Percentile(lat, 0.90), Percentile(lat, 0.99), slices.Max(lat)
	r.SlotP99, r.SlotMax = Percentile(fromSlot, 0.99), slices.Max(fromSlot)
	var unshed []time.Duration
	var slots []time.Duration
	for _, a := range answers {
		if a.done && !a.shed {
			unshed = append(unshed, a.latency)
		}
		if a.latency >= r.P99 {
			r.Slow.N++
			if a.shed {
				r.Slow.Shed++
			}
			if a.outcome == string(wire.OutcomeGranted) {
				r.Slow.Granted++
			}
			slots = append(slots, time.Duration(a.seq)*period)
		}
	}
	if r.Unshed = len(unshed); r.Unshed > 0 {
		r.UnshedP50, r.UnshedP99 = Percentile(unshed, 0.50), Percentile(unshed, 0.99)
	}
	if len(slots) > 0 {
		slices.Sort(slots)
		r.Slow.First, r.Slow.Median, r.Slow.Last = slots[0], slots[len(slots)/2], slots[len(slots)-1]
	}
	if st, err := c.Activity(ctx, cfg.Activity); err == nil {
		r.After = st
	}
	return r, nil
}
