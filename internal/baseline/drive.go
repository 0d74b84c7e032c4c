package baseline

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Stats is what Drive measured.
type Stats struct {
	Calls      int            `json:"calls"`       // calls that returned, with or without error
	Errors     int            `json:"errors"`      // calls that returned an error
	Elapsed    time.Duration  `json:"elapsed"`     // first call to last return
	PerSecond  float64        `json:"per_second"`  // Calls / Elapsed
	P50        time.Duration  `json:"p50"`         // latency of one call
	P99        time.Duration  `json:"p99"`         //
	Max        time.Duration  `json:"max"`         //
	Outcomes   map[string]int `json:"outcomes"`    // outcome word → calls
	FirstError string         `json:"first_error"` // the first error, for the log
}

// String is a one-line summary.
func (s Stats) String() string {
	return fmt.Sprintf("%d calls in %s: %.0f req/s, p50 %s p99 %s max %s, %d errors, outcomes %v",
		s.Calls, s.Elapsed.Round(time.Millisecond), s.PerSecond, s.P50.Round(time.Microsecond),
		s.P99.Round(time.Microsecond), s.Max.Round(time.Microsecond), s.Errors, s.Outcomes)
}

// Users returns the user of each of n requests from users distinct users:
// request i goes to user (i mod users)+1, then the requests are shuffled
// with seed, so that each user taps ⌈n/users⌉ or ⌊n/users⌋ times.
func Users(n, users int, seed uint64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i%users) + 1
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	r.Shuffle(n, func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// Drive makes n calls of fn over conc goroutines, for users drawn as by
// Users with seed 1, and measures them. It stops early when ctx ends.
func Drive(ctx context.Context, fn func(ctx context.Context, user int64) (string, error), n, users, conc int) Stats {
	if n <= 0 {
		return Stats{Outcomes: map[string]int{}}
	}
	users = max(users, 1)
	conc = max(min(conc, n), 1)
	plan := Users(n, users, 1)
	lat := make([]time.Duration, n)
	done := make([]bool, n)
	type tally struct {
		outcomes map[string]int
		errors   int
		firstErr error
	}
	tallies := make([]tally, conc)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conc {
		t := &tallies[w]
		t.outcomes = make(map[string]int, 8)
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t0 := time.Now()
				out, err := fn(ctx, plan[i])
				lat[i], done[i] = time.Since(t0), true
				if err != nil {
					t.errors++
					if t.firstErr == nil {
						t.firstErr = err
					}
					continue
				}
				t.outcomes[out]++
			}
		})
	}
	wg.Wait()
	s := Stats{Elapsed: time.Since(start), Outcomes: make(map[string]int, 8)}
	for _, t := range tallies {
		s.Errors += t.errors
		if t.firstErr != nil && s.FirstError == "" {
			s.FirstError = t.firstErr.Error()
		}
		for k, v := range t.outcomes {
			s.Outcomes[k] += v
		}
	}
	got := lat[:0]
	for i, ok := range done {
		if ok {
			got = append(got, lat[i])
		}
	}
	s.Calls = len(got)
	if s.Elapsed > 0 {
		s.PerSecond = float64(s.Calls) / s.Elapsed.Seconds()
	}
	slices.Sort(got)
	s.P50, s.P99 = quantile(got, 0.50), quantile(got, 0.99)
	if len(got) > 0 {
		s.Max = got[len(got)-1]
	}
	return s
}

// quantile is the nearest-rank q-quantile of sorted.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(len(sorted))*q)) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
