package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/wire"
)

// burst is the default Config with a burst's size.
func burst(capacity int64, requests, users, conc int) Config {
	c := config.Defaults[Config]()
	c.Capacity, c.Requests, c.Users, c.Concurrency = capacity, requests, users, conc
	return c
}

func fakeRun(t *testing.T, f *fakeServer, cfg Config) Report {
	t.Helper()
	return fakeRunDeps(t, f, cfg, Deps{})
}

func fakeRunDeps(t *testing.T, f *fakeServer, cfg Config, deps Deps) Report {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	cfg.BaseURL = srv.URL
	if cfg.Activity == 0 {
		cfg.Activity = 9001
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg, deps)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep
}

func TestRunAsyncWithThrottling(t *testing.T) {
	f := newFake("")
	f.async, f.throttleOf = true, 7
	var progress []int
	rep := fakeRunDeps(t, f, burst(50, 600, 500, 16), Deps{
		Progress: func(done int) { progress = append(progress, done) }, Test: TestHooks{ProgressEvery: time.Millisecond}})
	if err := rep.Verdict(); err != nil {
		t.Fatalf("verdict: %v\n%+v", err, rep)
	}
	if rep.Results != 600 || rep.Accepted != 600 || rep.Errors != 0 {
		t.Errorf("results %d, accepted %d, errors %d; want 600, 600, 0 (samples %v)", rep.Results, rep.Accepted, rep.Errors, rep.ErrorSamples)
	}
	if rep.Statuses[202] != 600 || rep.Statuses[429] == 0 || rep.Retries != rep.Statuses[429] {
		t.Errorf("statuses %v, retries %d; want 600×202 and every 429 retried", rep.Statuses, rep.Retries)
	}
	if rep.Polls < 1200 {
		t.Errorf("polls = %d, want ≥ 1200 (one pending and one done per request)", rep.Polls)
	}
	if rep.Outcomes[string(wire.OutcomeGranted)] != 50 || rep.UsersWithSeat != 50 {
		t.Errorf("outcomes %v, users with a seat %d; want 50 GRANTED", rep.Outcomes, rep.UsersWithSeat)
	}
	if len(progress) == 0 || progress[len(progress)-1] != 600 {
		t.Errorf("progress calls end at %v, want a last call with 600", progress)
	}
}

func TestRunDetectsBrokenServers(t *testing.T) {
	tests := []struct {
		bug      string
		capacity int64
		want     error
	}{
		{"oversell", 20, ErrOversold},
		{"undersell", 20, ErrUndersold},
		{"double", 150, ErrDoubleGrant}, // seats for every second tap of 100 users
		{"lie", 20, ErrAccounting},
	}
	for _, tt := range tests {
		t.Run(tt.bug, func(t *testing.T) {
			rep := fakeRun(t, newFake(tt.bug), burst(tt.capacity, 300, 100, 8))
			if err := rep.Verdict(); !errors.Is(err, tt.want) {
				t.Fatalf("verdict = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestRunOpenRefused(t *testing.T) {
	srv := httptest.NewServer(newFake(""))
	defer srv.Close()
	// The fake has no join route: every request is a 404, an error.
	c := burst(5, 20, 20, 4)
	c.BaseURL, c.Activity, c.Mix = srv.URL, 1, Mix{Join: 1}
	rep, err := Run(context.Background(), c, Deps{})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rep.Errors != 20 || rep.Statuses[404] != 20 || len(rep.ErrorSamples) == 0 {
		t.Errorf("errors %d, statuses %v, samples %v; want 20 errors from 404s", rep.Errors, rep.Statuses, rep.ErrorSamples)
	}
	if err := rep.Verdict(); !errors.Is(err, ErrIncomplete) {
		t.Errorf("verdict = %v, want ErrIncomplete", err)
	}
	c = burst(5, 1, 1, 1)
	c.BaseURL, c.Activity = "http://127.0.0.1:1", 1
	_, err = Run(context.Background(), c, Deps{})
	if !errors.Is(err, ErrOpen) {
		t.Errorf("Run against a closed port: %v, want ErrOpen", err)
	}
}

func TestReportJSON(t *testing.T) {
	rep := fakeRun(t, newFake(""), burst(10, 50, 40, 4))
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"accepted_per_sec", "first_to_last_result_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms",
		"outcomes", "http_statuses", "after", "pass", "failures", "errors", "retries"} {
		if _, ok := got[k]; !ok {
			t.Errorf("JSON report lacks %q: %s", k, data)
		}
	}
	if got["pass"] != true {
		t.Errorf("pass = %v, want true: %s", got["pass"], data)
	}
	// Without a hold the report is what it was before holds existed.
	if _, ok := got["holds"]; ok || strings.Contains(string(data), `"held"`) || strings.Contains(string(data), `"confirm"`) {
		t.Errorf("a report without holds mentions them: %s", data)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "verdict:              PASS") {
		t.Errorf("text report without a PASS verdict:\n%s", text.String())
	}
}

func TestConfigValidate(t *testing.T) {
	ok := burst(1, 1, 1, 1)
	ok.BaseURL, ok.Activity = "http://x:1", 1
	tests := []struct {
		name   string
		change func(*Config)
	}{
		{"url", func(c *Config) { c.BaseURL = "x:1" }},
		{"activity", func(c *Config) { c.Activity = 0 }},
		{"capacity", func(c *Config) { c.Capacity = -1 }},
		{"requests", func(c *Config) { c.Requests = 0 }},
		{"users", func(c *Config) { c.Users = -1 }},
		{"no mix", func(c *Config) { c.Mix = Mix{} }},
		{"wait", func(c *Config) { c.Wait = 0 }},
		{"hold without an open", func(c *Config) { c.Hold, c.NoOpen = time.Second, true }},
		{"no-show without a hold", func(c *Config) { c.NoShow = 0.5 }},
		{"concurrency", func(c *Config) { c.Concurrency = 0 }},
		{"mix", func(c *Config) { c.Mix = Mix{Claim: -1, Join: 2} }},
		{"hold", func(c *Config) { c.Hold = -time.Second }},
		{"hold too long", func(c *Config) { c.Hold = 169 * time.Hour }},
		{"no-show", func(c *Config) { c.NoShow = 1.5 }},
		{"no-show NaN", func(c *Config) { c.NoShow = math.NaN() }},
		{"no-shows with only confirms", func(c *Config) { c.NoShow, c.Mix = 0.5, Mix{Confirm: 1} }},
		{"settle timeout", func(c *Config) { c.SettleTimeout = -1 }},
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tt := range tests {
		c := ok
		tt.change(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: Validate = %v, want ErrConfig", tt.name, err)
		}
	}
}

// holdRun is a burst of claims, joins and confirm taps against the fake
// under a hold, with 30% no-shows.
func holdRun(t *testing.T, bug string, settle time.Duration) Report {
	t.Helper()
	f := newFake(bug)
	t.Cleanup(f.stopTimers)
	c := burst(20, 400, 120, 8)
	c.Mix, c.Hold, c.NoShow, c.SettleTimeout = Mix{Claim: 1, Join: 2, Cancel: 0.2, Confirm: 0.5}, 300*time.Millisecond, 0.3, settle
	return fakeRun(t, f, c)
}

// TestRunHolds: every held seat ends confirmed or back in line: the
// activity holds nothing afterwards, its confirmed count is the CONFIRMED
// signups, no-shows are held and lapse, confirmers confirm.
func TestRunHolds(t *testing.T) {
	rep := holdRun(t, "", 0)
	if err := rep.Verdict(); err != nil {
		t.Fatalf("verdict: %v\n%+v\n%+v", err, rep, rep.Holds)
	}
	h := rep.Holds
	if h == nil || !h.Settled || rep.After.Held != 0 || h.Hold != 300*time.Millisecond {
		t.Fatalf("holds %+v, after %+v; want settled with nothing held", h, rep.After)
	}
	t.Logf("outcomes %v; holds %+v", rep.Outcomes, *h)
	if h.NoShowsHeld == 0 || h.HeldUsers <= h.NoShowsHeld || h.Confirms[string(wire.OutcomeConfirmed)] == 0 {
		t.Errorf("held %d users (%d no-shows), confirms %v: want both kinds held and confirms", h.HeldUsers, h.NoShowsHeld, h.Confirms)
	}
	if rep.Outcomes[string(wire.OutcomeHeld)] == 0 || int64(h.ConfirmedSignups) != rep.After.Confirmed || h.ConfirmedSignups == 0 {
		t.Errorf("outcomes %v, confirmed signups %d, after %+v", rep.Outcomes, h.ConfirmedSignups, rep.After)
	}
	// Every seat went to a confirmer in the end: lapsed no-show seats were
	// promoted to the line, and a full activity is what the line leaves.
	if rep.After.Waiting > 0 && rep.After.Confirmed < rep.After.Capacity {
		t.Errorf("after %+v: a seat is free while users wait", rep.After)
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Holds map[string]any `json:"holds"`
		Mix   map[string]any `json:"mix"`
	}
	if err := json.Unmarshal(data, &got); err != nil || got.Holds["settled"] != true || got.Mix["confirm"] != 0.5 {
		t.Errorf("JSON report %s: want holds settled and the confirm weight", data)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatalf("text report: %v\n%s", err, text.String())
	}
	if !strings.Contains(text.String(), "confirms after HELD:") || !strings.Contains(text.String(), "PASS") {
		t.Errorf("text report:\n%s", text.String())
	}
}

func TestRunDetectsBrokenHolds(t *testing.T) {
	tests := []struct {
		bug    string
		settle time.Duration
	}{
		{"keep-held", time.Second}, // holds never lapse: held stays > 0
		{"expire-confirmed", 0},    // an expiry takes a confirmed seat
		{"lose-hold", 0},           // a confirm answers CONFIRMED and drops the seat
	}
	for _, tt := range tests {
		t.Run(tt.bug, func(t *testing.T) {
			rep := holdRun(t, tt.bug, tt.settle)
			if err := rep.Verdict(); !errors.Is(err, ErrHolds) {
				t.Fatalf("verdict = %v, want ErrHolds\n%+v", err, rep.Holds)
			}
			t.Logf("verdict: %v", rep.Verdict())
		})
	}
}

// TestRunWindowMarksTheBurst: Window is called twice, true after the open
// and before the first claim, false once every claim has its answer, so
// that what a caller measures over it is the burst alone.
func TestRunWindowMarksTheBurst(t *testing.T) {
	f := newFake("")
	type mark struct {
		start    bool
		capacity int64
		claims   int64
	}
	var marks []mark
	window := func(start bool) {
		f.mu.Lock()
		capacity := f.capacity
		f.mu.Unlock()
		marks = append(marks, mark{start, capacity, f.seq.Load()})
	}
	rep := fakeRunDeps(t, f, burst(20, 300, 250, 8), Deps{Window: window})
	if err := rep.Verdict(); err != nil {
		t.Fatalf("verdict: %v", err)
	}
	want := []mark{{true, 20, 0}, {false, 20, 300}}
	if len(marks) != 2 || marks[0] != want[0] || marks[1] != want[1] {
		t.Fatalf("marks %+v, want %+v (opened, no claim yet; then all 300 claims answered)", marks, want)
	}
}
