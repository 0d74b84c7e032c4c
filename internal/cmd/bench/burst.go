package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot/internal/baseline"
	"github.com/allot-dev/allot/internal/loadgen"
	"github.com/allot-dev/allot/internal/wire"
)

// A burst is one end-to-end burst against one system.
type burst struct {
	round int
	name  string
	rep   loadgen.Report
	// cpu is every process's CPU over the burst itself, from its first
	// claim to its last result.
	cpu cpuSample
	// server is the server process's CPU time over its life: its start,
	// the burst, and what it still did after the last result until it was
	// stopped (allot: applying and recording the claims already answered).
	server time.Duration
	// broker is what the stack's JetStream held before and after the
	// burst (a stack only).
	broker    [2]brokerSample
	hasBroker bool
	// stored is what the request stream's messages of the burst carry
	// (nil when they could not be read).
	stored *storedRequests
	// disk is the disk probe's figures over the burst.
	disk diskStats
}

const (
	allotName = "allot (ingest+allocator+JetStream)"
	gateName  = "seed claim behind a Redis DECR gate"
	floorName = "floor: claims counted in memory, nothing stored"
)

// baselineName names the baseline designs the burst and the open loop run.
var baselineName = map[string]string{baseline.DesignGated: gateName, baseline.DesignFloor: floorName}

// e2e is the end-to-end burst: o.n claims through HTTP against allot's
// whole stack, against the Redis-gated seed design and (-floor)
// against the floor, in -e2e-rounds rounds. Each round runs each system,
// on a fresh database and server, and the rounds rotate which goes first,
// so that a drift of the shared machine falls on all. It prints every run,
// each round's ratios and their medians (the higher middle one of an even
// number).
//
// The floor (baseline -design floor) answers each claim from a counter in
// its memory and stores nothing: its time is what serving the claims over
// the same kind of HTTP server and the load tool take on the same cores,
// so no design served that way can finish faster.
func e2e(ctx context.Context, o opts) error {
	rounds := max(o.e2eRounds, 1)
	fmt.Fprintf(os.Stderr, "bench: end-to-end bursts through HTTP, %d round(s)\n", rounds)
	systems := []func(int) (burst, error){
		func(r int) (burst, error) { return allotBurst(ctx, o, r) },
		func(r int) (burst, error) { return gateBurst(ctx, o, r) },
	}
	if o.floor {
		systems = append(systems, func(r int) (burst, error) { return floorBurst(ctx, o, r) })
	}
	var bursts []burst
	for r := 1; r <= rounds; r++ {
		for _, run := range roundOrder(systems, r) {
			b, err := run(r)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "  round %d, %s: last result after %s\n", r, b.name, b.rep.ToLastResult.Round(time.Millisecond))
			bursts = append(bursts, b)
		}
	}

	fmt.Printf("\n== end to end: %d claims from %d players for 100 items, %d HTTP clients, %d round(s) rotating which system goes first, everything on this machine (%s) ==\n",
		o.n, o.n*9/10, o.httpConc, rounds, loadAverage())
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tsystem\taccepted/s\tlast result after\tp50\tp99\tmax\tgranted\tin the burst, CPU s: server\tload tool\tMariaDB\tRedis\tcores busy\tserver's CPU s over its life\tlongest disk write\tverdict\t")
	for _, b := range bursts {
		r := b.rep
		verdict := "PASS"
		if err := r.Verdict(); err != nil {
			verdict = "FAIL: " + err.Error()
		}
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%s\t%s\t%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%s\t\n", b.round, b.name, r.AcceptedPerSec, r.ToLastResult.Round(time.Millisecond),
			r.P50.Round(100*time.Microsecond), r.P99.Round(100*time.Microsecond), r.Max.Round(time.Millisecond),
			r.Outcomes[string(wire.OutcomeGranted)], b.cpu.server.Seconds(), b.cpu.self.Seconds(),
			b.cpu.mariadb.Seconds(), b.cpu.redis.Seconds(), b.cpu.coresBusy(), b.server.Seconds(), longestWrite(b.disk), verdict)
	}
	tw.Flush()
	printRatios(os.Stdout, "allot / gated seed", timeToLast, burstRatios(bursts, allotName, gateName, lastResult), "below 1 = allot faster")
	printRatios(os.Stdout, "allot / gated seed", cpuOfBurst, burstRatios(bursts, allotName, gateName, burstCPU),
		"with both keeping the cores about as busy, the time ratio follows this one")
	if o.floor {
		printRatios(os.Stdout, "floor / gated seed", timeToLast, burstRatios(bursts, floorName, gateName, lastResult),
			"HTTP and the load tool alone: no design served this way finishes faster")
		printRatios(os.Stdout, "allot / floor", timeToLast, burstRatios(bursts, allotName, floorName, lastResult), "what allot's own work adds to HTTP's")
	}
	first := true
	for _, b := range bursts {
		if !b.hasBroker {
			continue
		}
		if first {
			fmt.Printf("round %d, %s: ", b.round, b.name)
			printBroker(os.Stdout, b.broker[0], b.broker[1], b.stored, b.rep.Requests+1)
			first = false
			continue
		}
		fmt.Printf("round %d, %s: %s\n", b.round, b.name, storedLine(b.broker[0], b.broker[1], b.stored))
	}
	fmt.Println("the gated seed stores nothing in a broker: Redis decides, MariaDB records the grants")
	return nil
}

// roundOrder is the order of round r (from 1): systems rotated left by
// r-1, so that each goes first once every len(systems) rounds; with two,
// the rounds alternate.
func roundOrder[T any](systems []T, r int) []T {
	k := (r - 1) % len(systems)
	return append(slices.Clone(systems[k:]), systems[:k]...)
}

// What the ratio lines compare.
const (
	timeToLast = "time to the last result"
	cpuOfBurst = "CPU of the burst (server, load tool, MariaDB, Redis)"
)

// printRatios prints to w one line of ratios of measure, round by round,
// and their median; nothing when there are none (a median of none would
// panic).
func printRatios(w io.Writer, what, measure string, ratios []float64, reading string) {
	if len(ratios) == 0 {
		return
	}
	each := make([]string, len(ratios))
	for i, x := range ratios {
		each[i] = fmt.Sprintf("%.2f", x)
	}
	fmt.Fprintf(w, "ratio %s, %s, round by round: %s; median %.2f (%s)\n",
		what, measure, strings.Join(each, ", "), medianOf(ratios, func(x float64) float64 { return x }), reading)
}

// lastResult is a burst's time to its last result.
func lastResult(b burst) time.Duration { return b.rep.ToLastResult }

// burstCPU is the CPU a burst cost the processes that served and drove
// it, over the burst itself: the server, the load tool, MariaDB and
// Redis (each design's database and cache count; the kernel's own work
// does not).
func burstCPU(b burst) time.Duration { return b.cpu.server + b.cpu.self + b.cpu.mariadb + b.cpu.redis }

// burstRatios is system num's measure over system den's, round by round;
// a round where either is missing or measured zero ends the list.
func burstRatios(bursts []burst, num, den string, measure func(burst) time.Duration) []float64 {
	var out []float64
	for r := 1; ; r++ {
		var a, g time.Duration
		for _, b := range bursts {
			switch {
			case b.round != r:
			case b.name == num:
				a = measure(b)
			case b.name == den:
				g = measure(b)
			}
		}
		if a == 0 || g == 0 {
			return out
		}
		out = append(out, a.Seconds()/g.Seconds())
	}
}

// allotBurst is one burst against allot's whole stack, as one process
// (embedded JetStream, fsync always), on a fresh database.
func allotBurst(ctx context.Context, o opts, round int) (burst, error) {
	s, url, done, err := startStack(ctx, o, nil)
	if err != nil {
		return burst{}, err
	}
	defer done()
	return measureBurst(ctx, o, round, allotName, s, url)
}

// gateBurst is one burst against the Redis-gated seed design, served over
// HTTP by the same kind of server, on a fresh database.
func gateBurst(ctx context.Context, o opts, round int) (burst, error) {
	return baselineBurst(ctx, o, round, baseline.DesignGated)
}

// floorBurst is one burst against the floor, served over HTTP by the same
// kind of server as the gate, with no database and no Redis.
func floorBurst(ctx context.Context, o opts, round int) (burst, error) {
	return baselineBurst(ctx, o, round, baseline.DesignFloor)
}

// baselineBurst is one burst against baseline -design design.
func baselineBurst(ctx context.Context, o opts, round int, design string) (burst, error) {
	s, url, drop, err := startBaseline(ctx, o, design)
	if err != nil {
		return burst{}, err
	}
	defer drop()
	return measureBurst(ctx, o, round, baselineName[design], s, url)
}

// startBaseline starts baseline -design design, on a fresh database unless
// it is the floor, which needs none; drop drops that database once the
// server is stopped.
func startBaseline(ctx context.Context, o opts, design string) (s *server, url string, drop func(), err error) {
	env, drop := []string{"ALLOT_LOG_LEVEL=warn"}, func() {}
	if design != baseline.DesignFloor {
		dsn, dropDB, err := freshDB(ctx, o.dsn, "allot_bench_"+design+"_")
		if err != nil {
			return nil, "", nil, err
		}
		env, drop = append(env, "ALLOT_MYSQL_DSN="+dsn), dropDB
	}
	p, _ := freePort()
	url = "http://127.0.0.1:" + strconv.Itoa(p)
	s, err = start(ctx, filepath.Join(o.bin, "baseline"), []string{"-design", design, "-addr", "127.0.0.1:" + strconv.Itoa(p)}, env, url+"/v1/activities/1")
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	return s, url, drop, nil
}

// measureBurst runs the burst against url, then stops s: the report, the
// CPU time of each process over the burst and the server's over its life,
// and for a stack what its broker stored.
func measureBurst(ctx context.Context, o opts, round int, name string, s *server, url string) (burst, error) {
	b := burst{round: round, name: name}
	if s.natsURL != "" {
		var err error
		if b.broker[0], err = sampleBroker(ctx, s.natsURL, url); err != nil {
			s.stop()
			return b, fmt.Errorf("%s: the broker before the burst: %w", name, err)
		}
	}
	w := cpuWindow{server: s.cmd.Process.Pid}
	var rep loadgen.Report
	disk, err := diskProbed(os.TempDir(), o.diskProbe, func() (err error) {
		rep, err = loadgen.Run(ctx, burstConfig(o, url), loadgen.Deps{Window: w.mark})
		return err
	})
	cpu := w.got
	if err == nil && s.natsURL != "" {
		b.broker[1], b.stored, err = brokerAfter(ctx, name, s, url, b.broker[0])
		b.hasBroker = err == nil
	}
	s.stop()
	if err != nil {
		return b, fmt.Errorf("loadgen against %s: %w", name, err)
	}
	b.rep, b.cpu, b.server, b.disk = rep, cpu, s.cpu(), disk
	return b, nil
}
