package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot/internal/baseline"
	"github.com/allot-dev/allot/internal/bench"
)

// openPoint is one open-loop configuration: claims at rate for duration,
// for items items.
type openPoint struct {
	rate     int
	duration time.Duration
	items    int64
}

// openPoints pairs the -open-rate, -open-duration and -open-items lists.
func openPoints(rates, durations, items string) ([]openPoint, error) {
	r, d, it := strings.Split(rates, ","), strings.Split(durations, ","), strings.Split(items, ",")
	if len(r) != len(d) || len(r) != len(it) {
		return nil, fmt.Errorf("-open-rate, -open-duration and -open-items must list as many values (%d, %d, %d)", len(r), len(d), len(it))
	}
	var pts []openPoint
	for i := range r {
		rate, err1 := strconv.Atoi(strings.TrimSpace(r[i]))
		du, err2 := time.ParseDuration(strings.TrimSpace(d[i]))
		n, err3 := strconv.ParseInt(strings.TrimSpace(it[i]), 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil || rate < 1 || du <= 0 || n < 1 {
			return nil, fmt.Errorf("open-loop point %d: rate %q, duration %q, items %q: want a positive rate, duration and item count", i+1, r[i], d[i], it[i])
		}
		pts = append(pts, openPoint{rate, du, n})
	}
	return pts, nil
}

// errNotRun wraps the error of an open-loop run that sent no claim.
var errNotRun = errors.New("no claim sent")

// openRun is one system's open-loop run.
type openRun struct {
	name   string
	res    bench.OpenLoopResult
	cpu    cpuSample     // over the attack, from its first claim to its last answer
	server time.Duration // the server's CPU over its life
	disk   diskStats
	// broker is, for a stack, what its request stream stored over the
	// run (storedLine); "" for the others.
	broker string
}

// openLoop runs, for each point, vegeta's open-loop attack against allot's
// whole stack and then against the Redis-gated seed design, and fails if
// either did not sell out exactly.
func openLoop(ctx context.Context, o opts) error {
	pts, err := openPoints(o.openRates, o.openDurations, o.openItems)
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "bench: open loop through HTTP (vegeta)")
	var failures []error
	for _, p := range pts {
		cfg := bench.OpenLoopConfig{Items: p.items, Rate: p.rate, Duration: p.duration, Wait: 15 * time.Second}
		measure := func(name string, s *server, url string) (openRun, error) {
			c := cfg
			c.BaseURL = url
			var sampled brokerSample
			if s.natsURL != "" {
				var err error
				if sampled, err = sampleBroker(ctx, s.natsURL, url); err != nil {
					s.stop()
					return openRun{}, fmt.Errorf("%s: the broker before the open loop: %w", name, err)
				}
			}
			w := cpuWindow{server: s.cmd.Process.Pid}
			c.Window = w.mark
			var res bench.OpenLoopResult
			disk, err := diskProbed(os.TempDir(), o.diskProbe, func() (err error) {
				res, err = bench.OpenLoop(ctx, c)
				return err
			})
			cpu := w.got
			var broker string
			if err == nil && s.natsURL != "" {
				after, stored, berr := brokerAfter(ctx, name, s, url, sampled)
				if berr != nil {
					fmt.Fprintf(os.Stderr, "bench: %s: the broker after the open loop not read: %v\n", name, berr)
				} else {
					broker = storedLine(sampled, after, stored)
				}
			}
			s.stop()
			if err != nil {
				if res.Sent == 0 {
					err = fmt.Errorf("%w: %w", errNotRun, err)
				}
				return openRun{}, fmt.Errorf("open loop against %s: %w", name, err)
			}
			return openRun{name: name, res: res, cpu: cpu, server: s.cpu(), disk: disk, broker: broker}, nil
		}
		var runs []openRun

		// allot: the whole stack as one process. Every claim is a distinct
		// user, and neither the per-user nor the per-instance write limit
		// may refuse the attack.
		// A stack that did not come up (a port picked in advance taken
		// meanwhile) is started again, twice at most.
		var r openRun
		for attempt := 1; ; attempt++ {
			s, url, done, err := startStack(ctx, o, []string{"ALLOT_INGEST_USER_RATE=0", "ALLOT_INGEST_RATE_LIMIT=0"})
			if err == nil {
				r, err = measure(allotName, s, url)
				done()
			}
			if err == nil {
				break
			}
			if attempt == 3 || ctx.Err() != nil || !(errors.Is(err, errNotRun) || errors.Is(err, errExited)) {
				return err
			}
			fmt.Fprintf(os.Stderr, "  open loop: %v; starting the stack again\n", err)
		}
		runs = append(runs, r)

		designs := []string{baseline.DesignGated}
		if o.floor {
			designs = append(designs, baseline.DesignFloor)
		}
		for _, d := range designs {
			s, url, drop, err := startBaseline(ctx, o, d)
			if err != nil {
				return err
			}
			r, err = measure(baselineName[d], s, url)
			drop()
			if err != nil {
				return err
			}
			runs = append(runs, r)
		}

		fmt.Printf("\n== open loop: %d claims/s for %s (%d scheduled, each a distinct user, ?wait=15s) for %d items, vegeta, everything on this machine (%s) ==\n",
			p.rate, p.duration, p.rate*int(p.duration/time.Millisecond)/1000, p.items, loadAverage())
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "system\tsent\tvegeta rate/s\tdropped\tlate >10ms\tlatest\tp50\tp90\tp99\tmax\tp99 from slot\tlast answer after\tgranted\tanswered 202\tnot answered 200/202\tin the attack, CPU s: server\tload tool\tMariaDB\tRedis\tcores busy\tserver's CPU s over its life\tlongest disk write\tsell-out\t")
		for _, r := range runs {
			x := r.res
			verdict := "PASS"
			if err := x.Check(); err != nil {
				verdict = "FAIL"
				failures = append(failures, fmt.Errorf("%s at %d/s: %w", r.name, p.rate, err))
			}
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%s\t\n", r.name, x.Sent, x.Rate, x.Dropped(),
				x.Late, x.MaxLate.Round(time.Millisecond), x.P50.Round(100*time.Microsecond), x.P90.Round(100*time.Microsecond),
				x.P99.Round(100*time.Microsecond), x.Max.Round(time.Millisecond), x.SlotP99.Round(100*time.Microsecond), x.Elapsed.Round(time.Millisecond),
				x.Granted, x.Pending, x.Failed, r.cpu.server.Seconds(), r.cpu.self.Seconds(), r.cpu.mariadb.Seconds(), r.cpu.redis.Seconds(), r.cpu.coresBusy(),
				r.server.Seconds(), longestWrite(r.disk), verdict)
		}
		tw.Flush()
		for _, r := range runs {
			fmt.Printf("%s: granted %d of %d items; HTTP statuses %v; outcomes %v\n", r.name, r.res.Granted, r.res.Items, r.res.Codes, r.res.Outcomes)
			if sl := r.res.Slow; sl.N > 0 {
				fmt.Printf("  the slowest 1%% (%d claims at or above p99): %d granted, %d shed; scheduled %s–%s after the first (median %s); %d claims answered unshed, p50 %s, p99 %s\n",
					sl.N, sl.Granted, sl.Shed, sl.First.Round(time.Millisecond), sl.Last.Round(time.Millisecond), sl.Median.Round(time.Millisecond),
					r.res.Unshed, r.res.UnshedP50.Round(100*time.Microsecond), r.res.UnshedP99.Round(100*time.Microsecond))
			}
			if r.broker != "" {
				fmt.Printf("  the broker: %s (the open and the claims)\n", r.broker)
			}
			if r.disk.n > 0 {
				fmt.Printf("  %s\n", r.disk.describe(o.diskProbe, r.res.Start))
			}
			if r.res.Failed > 0 {
				fmt.Printf("  %d claims not answered with a result (statuses above; 503: refused for overload, nothing stored), e.g. %s\n",
					r.res.Failed, r.res.FirstFailure)
			}
			if r.res.Dropped() > 0 || r.res.Late > 0 {
				fmt.Printf("  vegeta fell behind its schedule: %d claims never sent, %d started late (the latest %s)\n",
					r.res.Dropped(), r.res.Late, r.res.MaxLate.Round(time.Millisecond))
			}
		}
		fmt.Printf("ratio allot / gated seed (latencies of all answers): p50 %.2f, p99 %.2f\n", runs[0].res.P50.Seconds()/runs[1].res.P50.Seconds(),
			runs[0].res.P99.Seconds()/runs[1].res.P99.Seconds())
		if o.floor {
			f := runs[len(runs)-1].res // the floor runs last
			fmt.Printf("the floor (HTTP and the load tool alone): p50 %s, p99 %s\n", f.P50.Round(100*time.Microsecond), f.P99.Round(100*time.Microsecond))
		}
	}
	if len(failures) > 0 {
		for _, f := range failures {
			fmt.Printf("SELL-OUT CHECK FAILED: %v\n", f)
		}
		return fmt.Errorf("open loop: %w", errors.Join(failures...))
	}
	return nil
}
