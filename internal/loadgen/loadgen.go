// Package loadgen is the launch-night rehearsal: it opens an activity, fires
// a burst of claims, joins and cancels at allot's HTTP API (or at anything
// that serves the same routes, such as the baselines), waits for every final
// result, and checks the outcome against the invariants: never oversold,
// never undersold, no user granted twice, counters that add up.
//
// The engine runs in-process (Run) for tests and benchmarks and behind
// cmd/loadgen for operators. The client side is kept cheap, because on a
// rehearsal box it shares the cores with the server: a fixed set of
// workers, one shared keep-alive transport sized for them, per-worker
// buffers, and per-request figures written into preallocated slices.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// Config is a rehearsal: what cmd/loadgen's flags set (each field names its
// flag). Defaults live in the default tags only: start from
// config.Defaults[loadgen.Config](). Validate checks it once, before Run.
type Config struct {
	// BaseURL is the server, e.g. http://127.0.0.1:8080 (-url).
	BaseURL string `default:"http://127.0.0.1:8080"`
	// Activity is the activity the burst targets (-activity, required).
	Activity int64
	// Capacity is the capacity the activity is opened with (-capacity).
	Capacity int64
	// Requests is the size of the burst (-n).
	Requests int `default:"1000"`
	// Users is the number of distinct users (-users); fewer users than
	// requests means repeat taps. 0 means one per request (UserCount).
	Users int
	// Concurrency is the number of workers, each with one request in
	// flight (-c); never more than Requests (Workers).
	Concurrency int `default:"64"`
	// Mix weighs the ops (-mix).
	Mix Mix
	// Wait is the ?wait= of every write and poll (-wait; 30s, the most
	// the API honours).
	Wait time.Duration `default:"30s"`
	// OpenWait is the ?wait= of the open (-open-wait).
	OpenWait time.Duration `default:"10s"`
	// NoOpen skips the open: the activity is used as it is (-no-open).
	NoOpen bool
	// Seed fixes the users and ops of each request (-seed).
	Seed uint64 `default:"1"`
	// MaxRetries bounds the 429/503 retries of one HTTP exchange
	// (-retries).
	MaxRetries int `default:"100"`
	// Token, when set, is sent as a bearer token on the open and the state
	// reads, and on every write and poll that Deps.UserToken does not
	// cover (-token, else ALLOT_TOKEN). Against an ingest that requires
	// tokens it needs allot:admin.
	Token string

	// Hold opens the activity with this hold (-hold; 0: none): a seat
	// taken is HELD until its user confirms it, or lapses at held_until.
	// With NoOpen the activity's own hold is used.
	Hold time.Duration
	// NoShow is the fraction of users, drawn per user by Seed, who never
	// confirm a seat held for them (-no-show); every other user confirms
	// each seat as soon as loadgen sees it HELD. Only for an activity with
	// a hold.
	NoShow float64
	// SettleTimeout bounds the wait after the burst, in an activity with a
	// hold, for every hold to be confirmed or to lapse (the activity's held
	// count at 0) (-settle-timeout); 0 means 30s + 20 holds.
	SettleTimeout time.Duration
}

// UserCount is the number of distinct users: Users, or Requests when Users
// is 0.
func (c Config) UserCount() int {
	if c.Users == 0 {
		return c.Requests
	}
	return c.Users
}

// Workers is the number of workers: Concurrency, but no more than there
// are requests.
func (c Config) Workers() int { return min(c.Concurrency, c.Requests) }

// RequestTimeout bounds one HTTP exchange: Wait + 30s.
func (c Config) RequestTimeout() time.Duration { return c.Wait + 30*time.Second }

// baseURL is BaseURL without a trailing slash.
func (c Config) baseURL() string { return strings.TrimRight(c.BaseURL, "/") }

// Deps is what a rehearsal runs with besides its Config.
type Deps struct {
	// Client overrides the HTTP client; by default one is built whose
	// transport keeps Workers idle connections to the server.
	Client *http.Client
	// UserToken, when set, gives the bearer token of user's writes and
	// polls: each simulated user then spends its own rate limit, as real
	// users do.
	UserToken func(user int64) string
	// Progress, when set, is called from one goroutine with the number of
	// requests finished, every 100ms while firing and once at the end.
	Progress func(done int)
	// Window, when set, is called with true just before the burst's first
	// request is sent and with false once its workers are done (the last
	// result in), so that a caller can measure over exactly the stretch
	// the report times, without the open and the state reads around it.
	Window func(start bool)
	// Test holds the seams of the tests; the zero value is production.
	Test TestHooks
}

// TestHooks are loadgen's test seams.
type TestHooks struct {
	// ProgressEvery, when set, replaces the 100ms period of Progress.
	ProgressEvery time.Duration
}

func (h TestHooks) progressEvery() time.Duration {
	if h.ProgressEvery > 0 {
		return h.ProgressEvery
	}
	return 100 * time.Millisecond
}

// ErrConfig is wrapped by the errors of an invalid Config: a usage error.
var ErrConfig = errors.New("invalid loadgen configuration")

// MaxRequests bounds one burst; the per-request figures are kept in memory.
const MaxRequests = 50_000_000

// Validate reports the first invalid value, wrapping ErrConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if c.Activity == 0 {
		return bad("-activity is required: the rehearsal opens (resets the capacity of) that activity")
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return bad("-url must be an http(s) URL such as http://127.0.0.1:8080, got %q", c.BaseURL)
	}
	switch {
	case c.Activity < 1:
		return bad("-activity must be from 1 to 9223372036854775807, got %d", c.Activity)
	case c.Capacity < 0 || c.Capacity > wire.MaxCapacity:
		return bad("-capacity must be from 0 to %d, got %d", wire.MaxCapacity, c.Capacity)
	case c.Requests < 1 || c.Requests > MaxRequests:
		return bad("-n must be from 1 to %d, got %d", MaxRequests, c.Requests)
	case c.Users < 0:
		return bad("-users must be at least 1, got %d", c.Users)
	case c.Concurrency < 1 || c.Concurrency > 100_000:
		return bad("-c must be from 1 to 100000, got %d", c.Concurrency)
	case !c.Mix.valid():
		return bad("the mix %s has a negative weight or only zero weights", c.Mix)
	case c.Wait <= 0 || c.OpenWait <= 0:
		return bad("-wait and -open-wait must be positive")
	case c.MaxRetries < 0:
		return bad("-retries must not be negative")
	case c.Hold < 0 || c.Hold > wire.MaxHold:
		return bad("-hold must be from 0 to %s, got %s", wire.MaxHold, c.Hold)
	case !(c.NoShow >= 0 && c.NoShow <= 1):
		return bad("-no-show must be a fraction from 0 to 1, got %v", c.NoShow)
	case c.NoShow > 0 && c.Mix.Confirm > 0 && c.Mix.Claim+c.Mix.Join+c.Mix.Cancel == 0:
		return bad("-no-show needs an op other than confirm in the mix: no-shows never confirm")
	case c.SettleTimeout < 0:
		return bad("-settle-timeout must not be negative")
	case c.Hold != 0 && c.NoOpen:
		return bad("-hold is the hold loadgen opens the activity with; with -no-open the activity's own hold is used")
	case c.NoShow != 0 && c.Hold == 0 && !c.NoOpen:
		return bad("-no-show needs -hold (or -no-open on an activity with a hold)")
	}
	return nil
}

// NewClient returns an HTTP client for conc workers: keep-alive connections,
// as many idle ones kept per host as there are workers, so that the burst
// does not pay a TCP handshake per request, and no compression.
func NewClient(conc int, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conc,
		MaxIdleConnsPerHost: conc,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}

// ErrOpen is returned by Run when the activity could not be opened.
var ErrOpen = errors.New("open the activity")

// Run opens the activity, fires the burst, waits for every final result and
// returns the figures. An error means the rehearsal could not run (bad
// config, open refused, server unreachable) or was cut short by ctx; in the
// second case the report holds what was measured. Whether the outcome is
// right is Report.Verdict's business.
func Run(ctx context.Context, cfg Config, deps Deps) (Report, error) {
	client := deps.Client
	if client == nil {
		client = NewClient(cfg.Workers(), cfg.RequestTimeout())
		defer client.CloseIdleConnections()
	}
	r := newRunner(cfg, deps, client)
	rep := Report{
		URL: cfg.baseURL(), Activity: cfg.Activity, Capacity: cfg.Capacity, Requests: cfg.Requests,
		Users: cfg.UserCount(), Concurrency: cfg.Workers(), Mix: cfg.Mix, Seed: cfg.Seed,
	}
	setup := r.newWorker(0)
	if !cfg.NoOpen {
		out, err := setup.open(ctx)
		if err != nil {
			return rep, fmt.Errorf("%w %d: %w", ErrOpen, cfg.Activity, err)
		}
		rep.OpenOutcome = out
	}
	before, err := setup.state(ctx)
	if err != nil {
		return rep, fmt.Errorf("read the activity before the burst: %w", err)
	}
	rep.Before = before
	if before != nil && cfg.NoOpen {
		rep.Capacity = before.Capacity
	}
	if hold := holdOf(cfg, before); hold > 0 {
		r.holds = newHolds(r, hold)
	}

	fireErr := r.fire(ctx)
	if r.holds != nil {
		timeout := cfg.SettleTimeout
		if timeout == 0 {
			// Lapsed holds promote the next in line, held in turn: a seat
			// settles after a run of no-shows, rarely more than a few.
			timeout = 30*time.Second + 20*r.holds.set.hold
		}
		r.holds.settle(ctx, timeout, setup.state)
	}
	r.report(&rep)

	// The final state is read even after a cut-short burst, on a fresh
	// context, because it is what the operator most needs to see then.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	after, err := setup.state(sctx)
	if err != nil {
		return rep, errors.Join(fireErr, fmt.Errorf("read the activity after the burst: %w", err))
	}
	rep.After = after
	return rep, fireErr
}

// holdOf is the hold of the burst's activity: the one it reports, else the
// one loadgen opened it with.
func holdOf(cfg Config, st *State) time.Duration {
	if st != nil && st.Hold != "" {
		if d, err := time.ParseDuration(st.Hold); err == nil {
			return d
		}
	}
	if cfg.NoOpen {
		return 0
	}
	return cfg.Hold
}

// runner is one burst in flight.
type runner struct {
	cfg    Config
	deps   Deps
	client *http.Client // shared by the workers' API clients
	plan   plan

	slots slots
	t0    time.Time

	mu      sync.Mutex
	samples []string
	workers []*worker

	// holds follows the seats of an activity with a hold; nil without.
	holds *holds
	// holdDoubles are the users the holds' final check found with two
	// seats.
	holdDoubles []int64
}

// slots are the burst's requests, one slot each: a worker takes the next
// one, fills it in when its final result is in, and counts it finished.
type slots struct {
	lat  []time.Duration // send → final result, per request
	outc []uint8         // outcome code per request, 0 = no result

	next     atomic.Int64
	finished atomic.Int64
}

func newRunner(cfg Config, deps Deps, client *http.Client) *runner {
	return &runner{cfg: cfg, deps: deps, client: client}
}

// maxSamples bounds the error messages a report keeps.
const maxSamples = 5

func (r *runner) sample(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.samples) < maxSamples {
		r.samples = append(r.samples, msg)
	}
}

// fire runs the burst over the workers.
func (r *runner) fire(ctx context.Context) error {
	n := r.cfg.Requests
	r.plan = makePlan(n, r.cfg.UserCount(), r.cfg.Mix, r.cfg.Seed)
	r.plan.dropNoShowConfirms(r.cfg.Mix, r.cfg.Seed, r.cfg.NoShow)
	r.slots.lat = make([]time.Duration, n)
	r.slots.outc = make([]uint8, n)
	r.workers = make([]*worker, r.cfg.Workers())
	for i := range r.workers {
		r.workers[i] = r.newWorker(uint64(i) + 1)
	}

	if r.holds != nil {
		r.holds.start(ctx)
	}
	stopProgress := r.startProgress()
	var wg sync.WaitGroup
	if r.deps.Window != nil {
		r.deps.Window(true)
	}
	r.t0 = time.Now()
	for _, w := range r.workers {
		wg.Go(func() { w.loop(ctx) })
	}
	wg.Wait()
	if r.deps.Window != nil {
		r.deps.Window(false)
	}
	stopProgress()
	return ctx.Err()
}

func (r *runner) startProgress() (stop func()) {
	if r.deps.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.deps.Test.progressEvery())
		defer t.Stop()
		for {
			select {
			case <-done:
				r.deps.Progress(int(r.slots.finished.Load()))
				return
			case <-t.C:
				r.deps.Progress(int(r.slots.finished.Load()))
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
