package loadgen

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// Report is everything a rehearsal measured.
type Report struct {
	URL         string
	Activity    int64
	Capacity    int64
	Requests    int
	Users       int
	Concurrency int
	Mix         Mix
	Seed        uint64

	// OpenOutcome is OPENED or RESIZED; empty with NoOpen.
	OpenOutcome string
	// Before and After are the activity right before and after the burst
	// (nil when it does not exist).
	Before, After *State

	// Accepted counts writes answered 200 or 202.
	Accepted int
	// FiringWindow runs from the first request to the last 200/202 answer
	// of a write.
	FiringWindow time.Duration
	// AcceptedPerSec is Accepted over FiringWindow.
	AcceptedPerSec float64
	// ToLastResult runs from the first request to the last final result.
	ToLastResult time.Duration
	// Results counts requests that reached a final (done) result.
	Results int
	// P50 … Max are the time to result: from a request's first send to its
	// final result, 429/503 retries and polls included.
	P50, P90, P99, Max time.Duration

	// Outcomes counts final results by outcome word.
	Outcomes map[string]int
	// Statuses counts every HTTP answer, polls and retried ones included.
	Statuses map[int]int
	// Retries counts 429 and 503 answers that were retried.
	Retries int
	// Polls counts GET /v1/requests/{id} sent after a 202.
	Polls int
	// Errors counts requests that ended without a final result.
	Errors int
	// ErrorSamples are the first few errors, for the operator.
	ErrorSamples []string
	// Promotions counts results that promoted a waiter.
	Promotions int

	// UsersWithSeat counts users who took a seat in this burst (GRANTED or
	// CONFIRMED) and still hold one by the results.
	UsersWithSeat int
	// DoubleGrantUsers counts users who, by the results, held two seats at
	// once; DoubleGrants lists the first of them.
	DoubleGrantUsers int
	DoubleGrants     []int64

	// Holds is how the holds went, in an activity with a hold; nil
	// without. There a seat is HELD first, and the seats and double grants
	// above count confirmed seats, read from every user's signup at the end.
	Holds *HoldReport
}

// maxDoubleGrants bounds Report.DoubleGrants.
const maxDoubleGrants = 20

// report merges the workers' tallies into rep.
func (r *runner) report(rep *Report) {
	rep.Outcomes = make(map[string]int)
	rep.Statuses = make(map[int]int)
	rep.ErrorSamples = r.samples
	var lastAccept, lastFinal time.Duration
	var promoted []int64
	workers := r.workers
	if r.holds != nil {
		workers = append(slices.Clip(workers), r.holds.workers...)
	}
	for _, w := range workers {
		for c, n := range w.outcomes {
			if n > 0 {
				rep.Outcomes[string(outcomeNames[c])] += n
			}
		}
		for k, n := range w.other {
			rep.Outcomes[k] += n
		}
		for k, n := range w.statuses {
			rep.Statuses[k] += n
		}
		rep.Accepted += w.accepted
		rep.Retries += w.retries
		rep.Polls += w.polls
		rep.Errors += w.errors
		promoted = append(promoted, w.promoted...)
		lastAccept = max(lastAccept, w.lastAccept)
		lastFinal = max(lastFinal, w.lastFinal)
	}
	rep.Promotions = len(promoted)
	rep.FiringWindow, rep.ToLastResult = lastAccept, lastFinal
	if lastAccept > 0 {
		rep.AcceptedPerSec = float64(rep.Accepted) / lastAccept.Seconds()
	}
	// Requests that never started (the burst was cut short) count neither
	// as results nor as errors.
	got := make([]time.Duration, 0, len(r.slots.lat))
	for i, c := range r.slots.outc {
		if c != codeNone {
			got = append(got, r.slots.lat[i])
		}
	}
	rep.Results = len(got)
	slices.Sort(got)
	rep.P50, rep.P90, rep.P99 = quantile(got, 0.50), quantile(got, 0.90), quantile(got, 0.99)
	if len(got) > 0 {
		rep.Max = got[len(got)-1]
	}
	if r.holds == nil {
		r.seats(rep, promoted)
		return
	}
	// Under a hold, lapsed holds release seats without a result loadgen
	// sees, so the count from the results does not apply; holds.check
	// proved double seats from confirmed seats instead.
	h := r.holds.report
	rep.Holds = &h
	rep.UsersWithSeat = h.ConfirmedSignups
	slices.Sort(r.holdDoubles)
	rep.DoubleGrantUsers = len(r.holdDoubles)
	rep.DoubleGrants = r.holdDoubles[:min(len(r.holdDoubles), maxDoubleGrants)]
}

// seats finds users who held two seats at once. A user's seat takes are
// their GRANTED and CONFIRMED results and their promotions; a take is
// legitimate only after a CANCELLED of their own gave the previous seat
// back, so takes − cancels > 1 proves a double grant whatever the order.
// (The converse does not hold: a cancel from the waitlist hides nothing
// here, it can only make the check miss one.)
func (r *runner) seats(rep *Report, promoted []int64) {
	users := r.cfg.UserCount()
	net := make([]int32, users+1)
	for i, c := range r.slots.outc {
		u := r.plan.users[i]
		switch c {
		case codeGranted, codeConfirmed:
			net[u]++
		case codeCancelled:
			net[u]--
		}
	}
	for _, p := range promoted {
		if p >= 1 && p <= int64(users) {
			net[p]++
		}
	}
	for u, n := range net {
		if n >= 1 {
			rep.UsersWithSeat++
		}
		if n > 1 {
			rep.DoubleGrantUsers++
			if len(rep.DoubleGrants) < maxDoubleGrants {
				rep.DoubleGrants = append(rep.DoubleGrants, int64(u))
			}
		}
	}
}

// quantile is the nearest-rank q-quantile of sorted.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(len(sorted))*q)) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Verdict failures; Verdict joins one error per failed check, each wrapping
// one of these, so errors.Is tells which checks failed.
var (
	// ErrIncomplete: some requests got no final result, so the counts
	// below them are not the whole story.
	ErrIncomplete = errors.New("incomplete")
	// ErrOversold: more seats were taken than the capacity.
	ErrOversold = errors.New("oversold")
	// ErrUndersold: seats stayed free that the burst should have taken.
	ErrUndersold = errors.New("undersold")
	// ErrDoubleGrant: a user held two seats at once.
	ErrDoubleGrant = errors.New("double grant")
	// ErrAccounting: the activity's counters do not add up with the
	// results.
	ErrAccounting = errors.New("accounting mismatch")
	// ErrHolds: in an activity with a hold, a held seat did not end
	// confirmed or back in line: a hold never settled, a no-show was
	// confirmed, a confirmer lost a hold or a seat silently.
	ErrHolds = errors.New("holds")
)

// Verdict checks the invariants and returns nil when they all hold:
//   - every request reached a final result;
//   - no user held two seats at once;
//   - never oversold: confirmed ≤ capacity afterwards and, without
//     cancels, the burst's GRANTED+CONFIRMED fit in the seats that were free;
//   - never undersold: a pure claim burst on an empty activity grants
//     exactly min(capacity, distinct users), i.e. exactly the capacity when
//     requests ≥ capacity and users ≥ capacity; no one waits afterwards
//     while a seat is free;
//   - where the results determine it (nobody waited, nobody was
//     promoted), confirmed afterwards = confirmed before + GRANTED +
//     CONFIRMED − CANCELLED, and remaining = capacity − confirmed.
//
// In an activity with a hold (Report.Holds), seats recycle as holds lapse,
// so the counts from the results give way to the signups read at the end,
// after every hold was confirmed or lapsed: held = 0, confirmed = the
// CONFIRMED signups (on an activity empty before), no user with two
// confirmed seats, no no-show CONFIRMED, and every confirmer seen HELD
// ends CONFIRMED or heard HOLD_EXPIRED (or NOT_HELD: the expiry came
// first).
func (r Report) Verdict() error {
	var errs []error
	fail := func(sentinel error, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...)))
	}
	complete := r.Results == r.Requests
	if !complete {
		fail(ErrIncomplete, "%d of %d requests got no final result (%d errors)", r.Requests-r.Results, r.Requests, r.Errors)
	}
	if r.DoubleGrantUsers > 0 {
		fail(ErrDoubleGrant, "%d users held two seats at once, e.g. %v", r.DoubleGrantUsers, r.DoubleGrants)
	}

	capacity, base := r.Capacity, int64(0)
	if r.Before != nil {
		capacity, base = r.Before.Capacity, r.Before.Confirmed
	}
	granted := int64(r.Outcomes[string(wire.OutcomeGranted)])
	taken := granted + int64(r.Outcomes[string(wire.OutcomeConfirmed)])
	if r.Holds != nil {
		taken += int64(r.Holds.Confirms[string(wire.OutcomeConfirmed)])
	}
	cancelled := int64(r.Outcomes[string(wire.OutcomeCancelled)])
	waited := int64(r.Outcomes[string(wire.OutcomeWaiting)])

	if a := r.After; a != nil && a.Confirmed > a.Capacity {
		fail(ErrOversold, "confirmed %d > capacity %d afterwards", a.Confirmed, a.Capacity)
	}
	if r.Mix.Cancel == 0 && base+taken > capacity {
		fail(ErrOversold, "%d seats granted on top of %d confirmed, capacity %d", taken, base, capacity)
	}
	if r.Mix.PureClaim() && base == 0 && complete && r.Holds == nil {
		distinct := int64(min(r.Requests, r.Users))
		// A REJECTED claim (e.g. a request id voided because it was never
		// stored) took nothing: its user may be left without a seat.
		distinct = max(distinct-int64(r.Outcomes[string(wire.OutcomeRejected)]), 0)
		if want := min(capacity, distinct); granted < want {
			fail(ErrUndersold, "GRANTED %d, want exactly %d (capacity %d, %d distinct users)", granted, want, capacity, distinct)
		}
	}
	if a := r.After; a != nil && a.Waiting > 0 && a.Confirmed < a.Capacity {
		fail(ErrUndersold, "%d users wait while %d seats are free", a.Waiting, a.Capacity-a.Confirmed)
	}

	if r.Holds != nil {
		errs = append(errs, r.holdVerdict(complete)...)
		return errors.Join(errs...)
	}
	if a, b := r.After, r.Before; a != nil && b != nil && complete {
		if a.Remaining != a.Capacity-a.Confirmed {
			fail(ErrAccounting, "remaining %d ≠ capacity %d − confirmed %d", a.Remaining, a.Capacity, a.Confirmed)
		}
		if b.Waiting == 0 && waited == 0 && r.Promotions == 0 {
			if want := b.Confirmed + taken - cancelled; a.Confirmed != want {
				fail(ErrAccounting, "confirmed %d afterwards, want %d = %d before + %d GRANTED + %d CONFIRMED − %d CANCELLED",
					a.Confirmed, want, b.Confirmed, granted, taken-granted, cancelled)
			}
		}
		if r.Mix.Cancel == 0 && a.Waiting != b.Waiting+waited {
			fail(ErrAccounting, "waiting %d afterwards, want %d = %d before + %d WAITING", a.Waiting, b.Waiting+waited, b.Waiting, waited)
		}
	}
	return errors.Join(errs...)
}

// holdVerdict is the part of Verdict for an activity with a hold.
func (r Report) holdVerdict(complete bool) []error {
	var errs []error
	fail := func(sentinel error, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...)))
	}
	h := r.Holds
	a, b := r.After, r.Before
	if !h.Settled {
		held := "unknown"
		if a != nil {
			held = strconv.FormatInt(a.Held, 10)
		}
		fail(ErrHolds, "the holds did not settle within %s after the burst (held %s)", h.Settle.Round(time.Millisecond), held)
	} else if a != nil && a.Held != 0 {
		fail(ErrHolds, "held %d afterwards, want 0", a.Held)
	}
	if h.ConfirmErrors > 0 {
		fail(ErrHolds, "%d confirms or signup reads got no answer", h.ConfirmErrors)
	}
	if h.StillHeld > 0 {
		fail(ErrHolds, "%d users still HELD at the end", h.StillHeld)
	}
	if h.NoShowsConfirmed > 0 {
		fail(ErrHolds, "%d no-shows end CONFIRMED", h.NoShowsConfirmed)
	}
	if h.LostHolds > 0 {
		fail(ErrHolds, "%d confirmers lost a hold without HOLD_EXPIRED or NOT_HELD", h.LostHolds)
	}
	if h.LostSeats > 0 {
		fail(ErrHolds, "%d users lost a confirmed seat they never cancelled", h.LostSeats)
	}
	if len(errs) > 0 && len(h.Examples) > 0 {
		errs = append(errs, fmt.Errorf("%w: e.g. %s", ErrHolds, strings.Join(h.Examples, "; ")))
	}
	if a != nil && complete {
		if a.Remaining != a.Capacity-a.Confirmed {
			fail(ErrAccounting, "remaining %d ≠ capacity %d − confirmed %d", a.Remaining, a.Capacity, a.Confirmed)
		}
		if b != nil && b.Confirmed == 0 && b.Waiting == 0 && b.Held == 0 && h.Settled && a.Confirmed != int64(h.ConfirmedSignups) {
			fail(ErrAccounting, "confirmed %d afterwards, want %d = the CONFIRMED signups", a.Confirmed, h.ConfirmedSignups)
		}
	}
	return errs
}

// WriteText writes the report for a person, verdict last.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	ms := func(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }
	fmt.Fprintf(&b, "loadgen: %d requests (%s) from %d users over %d workers → %s activity %d, capacity %d\n",
		r.Requests, r.Mix, r.Users, r.Concurrency, r.URL, r.Activity, r.Capacity)
	if r.OpenOutcome != "" {
		fmt.Fprintf(&b, "  open:                 %s\n", r.OpenOutcome)
	}
	fmt.Fprintf(&b, "  accepted:             %d in %s = %.1f/s\n", r.Accepted, ms(r.FiringWindow), r.AcceptedPerSec)
	fmt.Fprintf(&b, "  first → last result:  %s (%d results, %d polls)\n", ms(r.ToLastResult), r.Results, r.Polls)
	fmt.Fprintf(&b, "  time to result:       p50 %s  p90 %s  p99 %s  max %s\n", ms(r.P50), ms(r.P90), ms(r.P99), ms(r.Max))
	fmt.Fprintf(&b, "  outcomes:            ")
	for _, k := range slices.Sorted(maps.Keys(r.Outcomes)) {
		fmt.Fprintf(&b, " %s %d", k, r.Outcomes[k])
	}
	fmt.Fprintf(&b, "\n  http statuses:       ")
	for _, k := range slices.Sorted(maps.Keys(r.Statuses)) {
		fmt.Fprintf(&b, " %d×%d", k, r.Statuses[k])
	}
	fmt.Fprintf(&b, "\n  retried 429/503:      %d\n  errors:               %d\n", r.Retries, r.Errors)
	for _, s := range r.ErrorSamples {
		fmt.Fprintf(&b, "    e.g. %s\n", s)
	}
	fmt.Fprintf(&b, "  users with a seat:    %d (double grants: %d)\n", r.UsersWithSeat, r.DoubleGrantUsers)
	if h := r.Holds; h != nil {
		fmt.Fprintf(&b, "  holds:                hold %s, no-show %g: %d users held (%d no-shows), settled %t in %s\n",
			h.Hold, h.NoShow, h.HeldUsers, h.NoShowsHeld, h.Settled, ms(h.Settle))
		fmt.Fprintf(&b, "  confirms after HELD: ")
		for _, k := range slices.Sorted(maps.Keys(h.Confirms)) {
			fmt.Fprintf(&b, " %s %d", k, h.Confirms[k])
		}
		fmt.Fprintf(&b, " (errors %d, signup reads %d)\n", h.ConfirmErrors, h.SignupReads)
		fmt.Fprintf(&b, "  signups at the end:   %d read, %d CONFIRMED, %d HELD; no-shows CONFIRMED %d, lost holds %d, lost seats %d\n",
			h.Checked, h.ConfirmedSignups, h.StillHeld, h.NoShowsConfirmed, h.LostHolds, h.LostSeats)
	}
	for _, x := range []struct {
		name string
		s    *State
	}{{"before", r.Before}, {"after", r.After}} {
		if x.s == nil {
			fmt.Fprintf(&b, "  activity %-6s       (none)\n", x.name)
			continue
		}
		held := ""
		if r.Holds != nil {
			held = fmt.Sprintf(" (held %d)", x.s.Held)
		}
		fmt.Fprintf(&b, "  activity %-6s       capacity %d, confirmed %d%s, waiting %d, remaining %d\n",
			x.name, x.s.Capacity, x.s.Confirmed, held, x.s.Waiting, x.s.Remaining)
	}
	if err := r.Verdict(); err != nil {
		fmt.Fprintf(&b, "  verdict:              FAIL\n")
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(&b, "    - %s\n", line)
		}
	} else {
		fmt.Fprintf(&b, "  verdict:              PASS\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// reportJSON is the -json form: durations in milliseconds, the verdict
// spelled out.
type reportJSON struct {
	URL              string         `json:"url"`
	Activity         int64          `json:"activity"`
	Capacity         int64          `json:"capacity"`
	Requests         int            `json:"requests"`
	Users            int            `json:"users"`
	Concurrency      int            `json:"concurrency"`
	Mix              Mix            `json:"mix"`
	Seed             uint64         `json:"seed"`
	OpenOutcome      string         `json:"open_outcome,omitempty"`
	Before           *State         `json:"before"`
	After            *State         `json:"after"`
	Accepted         int            `json:"accepted"`
	FiringWindowMs   float64        `json:"firing_window_ms"`
	AcceptedPerSec   float64        `json:"accepted_per_sec"`
	ToLastResultMs   float64        `json:"first_to_last_result_ms"`
	Results          int            `json:"results"`
	P50Ms            float64        `json:"p50_ms"`
	P90Ms            float64        `json:"p90_ms"`
	P99Ms            float64        `json:"p99_ms"`
	MaxMs            float64        `json:"max_ms"`
	Outcomes         map[string]int `json:"outcomes"`
	Statuses         map[string]int `json:"http_statuses"`
	Retries          int            `json:"retries"`
	Polls            int            `json:"polls"`
	Errors           int            `json:"errors"`
	ErrorSamples     []string       `json:"error_samples"`
	Promotions       int            `json:"promotions"`
	UsersWithSeat    int            `json:"users_with_seat"`
	DoubleGrantUsers int            `json:"double_grant_users"`
	DoubleGrants     []int64        `json:"double_grants"`
	Holds            *holdJSON      `json:"holds,omitempty"`
	Pass             bool           `json:"pass"`
	Failures         []string       `json:"failures"`
}

// holdJSON is Report.Holds in the -json form.
type holdJSON struct {
	Hold             string         `json:"hold"`
	NoShow           float64        `json:"no_show"`
	HeldUsers        int            `json:"held_users"`
	NoShowsHeld      int            `json:"no_shows_held"`
	Confirms         map[string]int `json:"confirms"`
	ConfirmErrors    int            `json:"confirm_errors"`
	SignupReads      int            `json:"signup_reads"`
	Settled          bool           `json:"settled"`
	SettleMs         float64        `json:"settle_ms"`
	Checked          int            `json:"signups_checked"`
	ConfirmedSignups int            `json:"confirmed_signups"`
	StillHeld        int            `json:"still_held"`
	NoShowsConfirmed int            `json:"no_shows_confirmed"`
	LostHolds        int            `json:"lost_holds"`
	LostSeats        int            `json:"lost_seats"`
	Examples         []string       `json:"examples"`
}

// MarshalJSON encodes the report with every figure and the verdict.
func (r Report) MarshalJSON() ([]byte, error) {
	msf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	j := reportJSON{
		URL: r.URL, Activity: r.Activity, Capacity: r.Capacity, Requests: r.Requests, Users: r.Users,
		Concurrency: r.Concurrency, Mix: r.Mix, Seed: r.Seed, OpenOutcome: r.OpenOutcome,
		Before: r.Before, After: r.After, Accepted: r.Accepted,
		FiringWindowMs: msf(r.FiringWindow), AcceptedPerSec: r.AcceptedPerSec, ToLastResultMs: msf(r.ToLastResult),
		Results: r.Results, P50Ms: msf(r.P50), P90Ms: msf(r.P90), P99Ms: msf(r.P99), MaxMs: msf(r.Max),
		Outcomes: r.Outcomes, Statuses: make(map[string]int, len(r.Statuses)),
		Retries: r.Retries, Polls: r.Polls, Errors: r.Errors, ErrorSamples: r.ErrorSamples,
		Promotions: r.Promotions, UsersWithSeat: r.UsersWithSeat,
		DoubleGrantUsers: r.DoubleGrantUsers, DoubleGrants: r.DoubleGrants,
		Failures: []string{},
	}
	if j.Outcomes == nil {
		j.Outcomes = map[string]int{}
	}
	if j.ErrorSamples == nil {
		j.ErrorSamples = []string{}
	}
	if j.DoubleGrants == nil {
		j.DoubleGrants = []int64{}
	}
	for k, v := range r.Statuses {
		j.Statuses[strconv.Itoa(k)] = v
	}
	if h := r.Holds; h != nil {
		j.Holds = &holdJSON{Hold: h.Hold.String(), NoShow: h.NoShow, HeldUsers: h.HeldUsers, NoShowsHeld: h.NoShowsHeld,
			Confirms: h.Confirms, ConfirmErrors: h.ConfirmErrors, SignupReads: h.SignupReads,
			Settled: h.Settled, SettleMs: msf(h.Settle), Checked: h.Checked, ConfirmedSignups: h.ConfirmedSignups,
			StillHeld: h.StillHeld, NoShowsConfirmed: h.NoShowsConfirmed, LostHolds: h.LostHolds, LostSeats: h.LostSeats,
			Examples: h.Examples}
		if j.Holds.Confirms == nil {
			j.Holds.Confirms = map[string]int{}
		}
		if j.Holds.Examples == nil {
			j.Holds.Examples = []string{}
		}
	}
	err := r.Verdict()
	j.Pass = err == nil
	if err != nil {
		j.Failures = strings.Split(err.Error(), "\n")
	}
	return json.Marshal(j)
}
